// Host side of the benchmark kernels (bench_kernels.h): the kernels are PTX generated from
// tools/bench_kernels.cu (see there for why), loaded once per process with cudaLibraryLoadData,
// which JIT-compiles them for the current GPU, and launched by name through cudaLaunchKernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "bench/bench_kernels.h"
#include "core/cuda_check.h"

namespace zaya::bench::kernels {

namespace {

const char kPtx[] =
#include "bench/bench_kernels_ptx.inc"
    ;

cudaLibrary_t library() {
  static cudaLibrary_t lib = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    ZAYA_CUDA_CHECK(cudaLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  });
  return lib;
}

cudaKernel_t kernel(const char* name) {
  cudaKernel_t k = nullptr;
  ZAYA_CUDA_CHECK(cudaLibraryGetKernel(&k, library(), name));
  return k;
}

constexpr unsigned kThreads = 256;
constexpr uint64_t kUnroll = 4;  // must match tools/bench_kernels.cu

// Launches a kernel by handle; handles are looked up once (function-local statics at the call
// sites), so timed loops pay only the launch.
template <typename... A>
void launch(cudaKernel_t k, uint64_t grid, void* stream, A... args) {
  static_assert(sizeof...(A) > 0);
  void* argv[] = {static_cast<void*>(&args)...};
  if (grid == 0) return;
  ZAYA_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(unsigned(grid)),
                                   dim3(kThreads), argv, 0, static_cast<cudaStream_t>(stream)));
}

uint64_t grid_stride_blocks(uint64_t n) {
  return std::min<uint64_t>((n + kThreads - 1) / kThreads, 65535ull * 8);
}
uint64_t unrolled_blocks(uint64_t n) {
  return (n + kThreads * kUnroll - 1) / (kThreads * kUnroll);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void fill_random_bf16(void* p, uint64_t n, uint64_t seed, void* s) {
  static const cudaKernel_t k = kernel("zaya_fill_bf16");
  launch(k, grid_stride_blocks(n), s, p, n, seed);
}
void fill_random_fp8_e4m3(void* p, uint64_t n, uint64_t seed, void* s) {
  static const cudaKernel_t k = kernel("zaya_fill_fp8_e4m3");
  launch(k, grid_stride_blocks(n), s, p, n, seed);
}
void mem_read(const void* a, uint64_t bytes, float* sink, void* s) {
  static const cudaKernel_t k = kernel("zaya_mem_read");
  launch(k, unrolled_blocks(bytes / 16), s, a, bytes / 16, sink);
}
void mem_write(void* a, uint64_t bytes, void* s) {
  static const cudaKernel_t k = kernel("zaya_mem_write");
  launch(k, unrolled_blocks(bytes / 16), s, a, bytes / 16);
}
void mem_copy(void* dst, const void* src, uint64_t bytes, void* s) {
  static const cudaKernel_t k = kernel("zaya_mem_copy");
  launch(k, unrolled_blocks(bytes / 16), s, dst, src, bytes / 16);
}
void mem_triad(void* a, const void* b, const void* c, uint64_t bytes, float sc, void* s) {
  static const cudaKernel_t k = kernel("zaya_mem_triad");
  launch(k, unrolled_blocks(bytes / 16), s, a, b, c, bytes / 16, sc);
}
void fill_pattern(void* p, uint64_t bytes, uint32_t seed, void* s) {
  static const cudaKernel_t k = kernel("zaya_fill_pattern");
  launch(k, grid_stride_blocks(bytes / 4), s, p, bytes / 4, seed);
}
void count_pattern_mismatch(const void* p, uint64_t bytes, uint32_t seed,
                            unsigned long long* dev_count, void* s) {
  ZAYA_CUDA_CHECK(
      cudaMemsetAsync(dev_count, 0, sizeof(unsigned long long), static_cast<cudaStream_t>(s)));
  static const cudaKernel_t k = kernel("zaya_check_pattern");
  launch(k, grid_stride_blocks(bytes / 4), s, p, bytes / 4, seed, dev_count);
}
void spin(uint64_t ns, void* s) {
  static const cudaKernel_t k = kernel("zaya_spin_ns");
  void* argv[] = {static_cast<void*>(&ns)};
  ZAYA_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(1), dim3(1), argv, 0,
                                   static_cast<cudaStream_t>(s)));
}
uint32_t pattern_word(uint64_t i, uint32_t seed) {
  return uint32_t(splitmix64((uint64_t(seed) << 40) ^ i));
}

}  // namespace zaya::bench::kernels
