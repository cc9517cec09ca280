// Elementwise fp32/bf16 kernels of backend/cuda/ops.h: f32_to_bf16, bf16_to_f32, add_f32,
// scale_f32, axpby_f32, plus the bias-add fallback of the GEMM layer (add_bias_rows, used
// by gemm_cuda.cpp when cuBLASLt has no bias epilogue for a problem).
//
// All kernels are grid-stride loops over 4-element vectors (16-byte fp32 loads and stores; 8-byte
// bf16 ones) with a scalar loop for the remainder; when a pointer is not aligned for the vector
// width the whole range takes the scalar loop, so any pointer works. The grid is capped (a few
// waves of a large GPU) because these kernels are bandwidth-bound: more blocks only add scheduling.
// Rounding to bf16 is round-to-nearest-even (__float2bfloat16_rn), bit-identical to the host's
// zaya::f32_to_bf16 (core/dtype.h), NaN stays NaN.
//
// Not here: reductions (they need workspaces and deterministic partial sums; see the optimizer and
// norm kernels) and fused pointwise ops of the model.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/cuda/ops.h"
#include "core/cuda_check.h"

namespace zaya::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int grid_for(int64_t work_items) {
  int64_t blocks = (work_items + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return int(blocks);
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Returns false when there is nothing to do; throws for a negative count.
bool check_count(int64_t n, const char* fn, int line) {
  if (n < 0)
    ::zaya::detail::platform_fail("zaya", fn, __FILE__, line,
                                  "element count n = " + std::to_string(n) + " is negative");
  return n > 0;
}

__device__ __forceinline__ int64_t thread_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return int64_t(gridDim.x) * blockDim.x;
}

// Four bf16 values moved as one 8-byte access (element order lo.x, lo.y, hi.x, hi.y in memory).
struct alignas(8) Bf16x4 {
  __nv_bfloat162 lo, hi;
};

// nvec: number of 4-element vectors processed vectorised (0 when a pointer is misaligned); the
// elements from 4·nvec to n are done one at a time.
__global__ void f32_to_bf16_kernel(bf16* y, const float* x, int64_t n, int64_t nvec) {
  for (int64_t i = thread_index(); i < nvec; i += grid_stride()) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<Bf16x4*>(y)[i] =
        Bf16x4{__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
  }
  for (int64_t i = 4 * nvec + thread_index(); i < n; i += grid_stride())
    y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void bf16_to_f32_kernel(float* y, const bf16* x, int64_t n, int64_t nvec) {
  for (int64_t i = thread_index(); i < nvec; i += grid_stride()) {
    const Bf16x4 v = reinterpret_cast<const Bf16x4*>(x)[i];
    const float2 lo = __bfloat1622float2(v.lo), hi = __bfloat1622float2(v.hi);
    reinterpret_cast<float4*>(y)[i] = make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  for (int64_t i = 4 * nvec + thread_index(); i < n; i += grid_stride())
    y[i] = __bfloat162float(x[i]);
}

// y = a·x + b·y over fp32, with the special cases of the public functions folded into two flags:
//   add_f32:   a = 1, b = 1          scale_f32: use_x = false (y = b·y)
//   axpby_f32: y_read = (b != 0); as in BLAS, b = 0 does not read y, so y may hold garbage or NaN.
__global__ void axpby_kernel(float* y, float a, const float* x, float b, bool use_x, bool read_y,
                             int64_t n, int64_t nvec) {
  for (int64_t i = thread_index(); i < nvec; i += grid_stride()) {
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
    if (use_x) {
      const float4 xv = reinterpret_cast<const float4*>(x)[i];
      r = make_float4(a * xv.x, a * xv.y, a * xv.z, a * xv.w);
    }
    if (read_y) {
      const float4 yv = reinterpret_cast<const float4*>(y)[i];
      r.x += b * yv.x;
      r.y += b * yv.y;
      r.z += b * yv.z;
      r.w += b * yv.w;
    }
    reinterpret_cast<float4*>(y)[i] = r;
  }
  for (int64_t i = 4 * nvec + thread_index(); i < n; i += grid_stride()) {
    float r = use_x ? a * x[i] : 0.f;
    if (read_y) r += b * y[i];
    y[i] = r;
  }
}

void launch_axpby(float* y, float a, const float* x, float b, bool use_x, bool read_y, int64_t n,
                  cudaStream_t st) {
  const bool vec = aligned(y, 16) && (!use_x || aligned(x, 16));
  const int64_t nvec = vec ? n / 4 : 0;
  axpby_kernel<<<grid_for(vec ? nvec + n % 4 : n), kThreads, 0, st>>>(y, a, x, b, use_x, read_y, n,
                                                                      nvec);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

// C[m, n] += bias[n] over an M×N row-major block with row stride ldc (fp32 or bf16 C, fp32 math).
template <typename T>
__global__ void add_bias_rows_kernel(T* C, int64_t ldc, const float* bias, int64_t M, int64_t N) {
  const int64_t total = M * N;
  for (int64_t e = thread_index(); e < total; e += grid_stride()) {
    const int64_t m = e / N, j = e - m * N;
    T* c = C + m * ldc + j;
    if constexpr (std::is_same_v<T, bf16>)
      *c = __float2bfloat16_rn(__bfloat162float(*c) + bias[j]);
    else
      *c += bias[j];
  }
}

}  // namespace

void f32_to_bf16(bf16* y, const float* x, int64_t n, cudaStream_t s) {
  if (!check_count(n, "f32_to_bf16", __LINE__)) return;
  const int64_t nvec = aligned(x, 16) && aligned(y, 8) ? n / 4 : 0;
  f32_to_bf16_kernel<<<grid_for(nvec ? nvec + n % 4 : n), kThreads, 0, s>>>(y, x, n, nvec);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void bf16_to_f32(float* y, const bf16* x, int64_t n, cudaStream_t s) {
  if (!check_count(n, "bf16_to_f32", __LINE__)) return;
  const int64_t nvec = aligned(x, 8) && aligned(y, 16) ? n / 4 : 0;
  bf16_to_f32_kernel<<<grid_for(nvec ? nvec + n % 4 : n), kThreads, 0, s>>>(y, x, n, nvec);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void add_f32(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (!check_count(n, "add_f32", __LINE__)) return;
  launch_axpby(y, 1.f, x, 1.f, true, true, n, s);
}

void scale_f32(float* y, float a, int64_t n, cudaStream_t st) {
  if (!check_count(n, "scale_f32", __LINE__)) return;
  // y *= a reads y even for a = 0 (NaN·0 stays NaN: a scale must not hide a bad value).
  launch_axpby(y, 0.f, nullptr, a, false, true, n, st);
}

void axpby_f32(float* y, float a, const float* x, float b, int64_t n, cudaStream_t st) {
  if (!check_count(n, "axpby_f32", __LINE__)) return;
  launch_axpby(y, a, x, b, true, b != 0.f, n, st);
}

void add_bias_rows(void* C, int64_t ldc, bool c_bf16, const float* bias_N, int64_t M, int64_t N,
                   cudaStream_t st) {
  if (M <= 0 || N <= 0) return;
  const int grid = grid_for(M * N);
  if (c_bf16)
    add_bias_rows_kernel<bf16><<<grid, kThreads, 0, st>>>(static_cast<bf16*>(C), ldc, bias_N, M, N);
  else
    add_bias_rows_kernel<float>
        <<<grid, kThreads, 0, st>>>(static_cast<float*>(C), ldc, bias_N, M, N);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda
