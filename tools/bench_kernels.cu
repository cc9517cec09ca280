// Source of the device kernels of `zaya bench gemm|mem`. It is NOT compiled by the build: CMake
// 3.25 cannot configure zaya_lib with a .cu file while CMAKE_CXX_STANDARD is 20 and no
// CMAKE_CUDA_STANDARD is set ("requires the language dialect CUDA20"). Instead
// tools/gen_bench_kernels_ptx.sh compiles this file to PTX for compute_80 and stores it in
// src/bench/bench_kernels_ptx.inc, which src/bench/bench_kernels_cuda.cpp loads at run time with
// cudaLibraryLoadData (the driver JIT-compiles it for the GPU at hand). Once CMakeLists.txt sets
// CMAKE_CUDA_STANDARD 17, this can become an ordinary src/bench/*.cu file.
//
// Kernels are extern "C" (stable names for cudaLibraryGetKernel) and include only CUDA headers.
// zaya_spin_ns holds a stream for a while (the timing protocol of gemm_bench.h). The memory
// kernels move 16 bytes per access, 4 accesses per thread, one pass (no grid-stride
// loop), streaming cache hints: the STREAM-style pattern that reaches ~90% of HBM peak on Hopper.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

__device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in [-1, 1) from (seed, i).
__device__ inline float uniform_pm1(uint64_t seed, uint64_t i) {
  return float(splitmix64(seed * 0x632be59bd9b4e019ull + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}
// Must match zaya::bench::kernels::pattern_word on the host.
__device__ inline uint32_t pattern(uint64_t i, uint32_t seed) {
  return uint32_t(splitmix64((uint64_t(seed) << 40) ^ i));
}

#define ZAYA_GRID_STRIDE(i, n)                                                \
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += uint64_t(gridDim.x) * blockDim.x)

constexpr int kUnroll = 4;

extern "C" {

__global__ void zaya_fill_bf16(__nv_bfloat16* p, uint64_t n, uint64_t seed) {
  ZAYA_GRID_STRIDE(i, n) p[i] = __float2bfloat16_rn(uniform_pm1(seed, i));
}

__global__ void zaya_fill_fp8_e4m3(__nv_fp8_e4m3* p, uint64_t n, uint64_t seed) {
  ZAYA_GRID_STRIDE(i, n) p[i] = __nv_fp8_e4m3(uniform_pm1(seed, i));
}

__global__ void zaya_mem_read(const float4* __restrict__ a, uint64_t n, float* sink) {
  const uint64_t base = blockIdx.x * uint64_t(blockDim.x) * kUnroll + threadIdx.x;
  float acc = 0;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint64_t i = base + uint64_t(u) * blockDim.x;
    if (i < n) {
      const float4 v = __ldcs(a + i);
      acc += v.x + v.y + v.z + v.w;
    }
  }
  if (acc == -1.2345e-30f) *sink = acc;  // never true for our data; keeps the loads alive
}

__global__ void zaya_mem_write(float4* __restrict__ a, uint64_t n) {
  const uint64_t base = blockIdx.x * uint64_t(blockDim.x) * kUnroll + threadIdx.x;
  const float4 v = make_float4(1.f, 2.f, 3.f, 4.f);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint64_t i = base + uint64_t(u) * blockDim.x;
    if (i < n) __stcs(a + i, v);
  }
}

__global__ void zaya_mem_copy(float4* __restrict__ d, const float4* __restrict__ s, uint64_t n) {
  const uint64_t base = blockIdx.x * uint64_t(blockDim.x) * kUnroll + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint64_t i = base + uint64_t(u) * blockDim.x;
    if (i < n) __stcs(d + i, __ldcs(s + i));
  }
}

__global__ void zaya_mem_triad(float4* __restrict__ a, const float4* __restrict__ b,
                               const float4* __restrict__ c, uint64_t n, float s) {
  const uint64_t base = blockIdx.x * uint64_t(blockDim.x) * kUnroll + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint64_t i = base + uint64_t(u) * blockDim.x;
    if (i < n) {
      const float4 x = __ldcs(b + i), y = __ldcs(c + i);
      __stcs(a + i, make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w));
    }
  }
}

__global__ void zaya_fill_pattern(uint32_t* p, uint64_t n, uint32_t seed) {
  ZAYA_GRID_STRIDE(i, n) p[i] = pattern(i, seed);
}

// Holds the stream for `ns` nanoseconds of the global timer (one thread; __nanosleep keeps the
// SM nearly idle), so a host can enqueue a timed loop before the GPU starts on it.
__global__ void zaya_spin_ns(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

__global__ void zaya_check_pattern(const uint32_t* p, uint64_t n, uint32_t seed,
                                   unsigned long long* count) {
  unsigned long long bad = 0;
  ZAYA_GRID_STRIDE(i, n) bad += p[i] != pattern(i, seed);
  if (bad) atomicAdd(count, bad);
}

}  // extern "C"
