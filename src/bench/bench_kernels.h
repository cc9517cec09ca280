// Device kernels of the GEMM and memory benchmarks, behind plain C++ declarations (streams are
// passed as void*, cudaStream_t underneath) so host files need no CUDA headers for them.
// Defined in bench_kernels_cuda.cpp (PTX from tools/bench_kernels.cu); only in CUDA builds.
#pragma once
#include <cstdint>

namespace zaya::bench::kernels {

// Uniform values in [-1, 1) from a counter hash of (seed, i), rounded to bf16 / fp8 e4m3.
void fill_random_bf16(void* p, uint64_t n, uint64_t seed, void* stream);
void fill_random_fp8_e4m3(void* p, uint64_t n, uint64_t seed, void* stream);

// Memory kernels on buffers of `bytes` (a multiple of 16; 16-byte aligned). read sums its input
// into a value stored to `sink` only if it equals an impossible sentinel, so the loads cannot be
// optimised away; triad computes a = b + s*c on floats.
void mem_read(const void* a, uint64_t bytes, float* sink, void* stream);
void mem_write(void* a, uint64_t bytes, void* stream);
void mem_copy(void* dst, const void* src, uint64_t bytes, void* stream);
void mem_triad(void* a, const void* b, const void* c, uint64_t bytes, float s, void* stream);

// A 32-bit pattern (a hash of the word index and seed) to fill a buffer with, and a check that
// counts words differing from it (result written to *dev_count, a device uint64).
void fill_pattern(void* p, uint64_t bytes, uint32_t seed, void* stream);
void count_pattern_mismatch(const void* p, uint64_t bytes, uint32_t seed,
                            unsigned long long* dev_count, void* stream);
// Holds `stream` for `ns` nanoseconds (one thread spinning on the global timer): work enqueued
// behind it starts only then, so the host can queue a timed loop ahead of the GPU.
void spin(uint64_t ns, void* stream);

uint32_t pattern_word(uint64_t i, uint32_t seed);  // host copy of the pattern, for spot checks

}  // namespace zaya::bench::kernels
