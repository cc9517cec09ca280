// Activations of the CUDA backend (backend/cuda/ops.h): SwiGLU on packed gate|up rows (the
// experts' MLP, bf16 in and out, fp32 math), exact erf GELU with an optional bias (the router MLP,
// fp32), its backward with the deterministic bias gradient, and the deterministic column sum.
// Specification: cpu::swiglu, cpu::swiglu_backward, cpu::gelu, cpu::gelu_backward (same formulas
// and operation order; expf/erff differ from glibc's by an ulp or so).
//
// Layout of the elementwise kernels: blockIdx.x tiles the columns (256 threads × W elements, W = 4
// when the row width and pointers allow 4-wide accesses), blockIdx.y strides over rows, so there
// is no 64-bit division per element. Deliberately not here: the tanh GELU approximation and fused
// GEMM epilogues (the GEMM layer owns those).
#include "backend/cuda/arch/kernel_utils.cuh"

namespace zaya::cuda {

namespace {

using namespace kern;

constexpr int kColThreads = 256;
constexpr unsigned kMaxRowBlocks = 65535;

dim3 tile_grid(int64_t rows, int64_t cols, int W) {
  const int64_t gx = ceil_div(cols, int64_t(kColThreads) * W);
  const int64_t gy = rows < int64_t(kMaxRowBlocks) ? rows : int64_t(kMaxRowBlocks);
  return dim3(unsigned(gx), unsigned(gy));
}

__device__ __forceinline__ float silu_sigmoid(float g, float* sg) {
  *sg = 1.0f / (1.0f + expf(-g));
  return g * *sg;
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
  const float pdf = expf(-0.5f * x * x) * 0.3989422804014327f;
  return cdf + x * pdf;
}

template <int W>
__global__ void swiglu_fwd_kernel(bf16* y, const bf16* gu, int64_t N, int64_t I) {
  const int64_t i = (int64_t(blockIdx.x) * kColThreads + threadIdx.x) * W;
  if (i >= I) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float g[W], u[W], o[W];
    load_w<W>(gu + n * 2 * I + i, g);
    load_w<W>(gu + n * 2 * I + I + i, u);
#pragma unroll
    for (int j = 0; j < W; j++) {
      float sg;
      o[j] = silu_sigmoid(g[j], &sg) * u[j];
    }
    store_w<W>(y + n * I + i, o);
  }
}

template <int W>
__global__ void swiglu_bwd_kernel(bf16* dgu, const bf16* dy, const bf16* gu, int64_t N, int64_t I) {
  const int64_t i = (int64_t(blockIdx.x) * kColThreads + threadIdx.x) * W;
  if (i >= I) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float g[W], u[W], d[W], dg[W], du[W];
    load_w<W>(gu + n * 2 * I + i, g);
    load_w<W>(gu + n * 2 * I + I + i, u);
    load_w<W>(dy + n * I + i, d);
#pragma unroll
    for (int j = 0; j < W; j++) {
      float sg;
      const float silu = silu_sigmoid(g[j], &sg);
      dg[j] = d[j] * u[j] * (sg + silu * (1.0f - sg));
      du[j] = d[j] * silu;
    }
    store_w<W>(dgu + n * 2 * I + i, dg);
    store_w<W>(dgu + n * 2 * I + I + i, du);
  }
}

template <int W>
__global__ void bias_gelu_fwd_kernel(float* y, const float* x, const float* b, int64_t N,
                                     int64_t F) {
  const int64_t f = (int64_t(blockIdx.x) * kColThreads + threadIdx.x) * W;
  if (f >= F) return;
  float bv[W];
#pragma unroll
  for (int j = 0; j < W; j++) bv[j] = 0.f;
  if (b) load_w<W>(b + f, bv);
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float v[W];
    load_w<W>(x + n * F + f, v);
#pragma unroll
    for (int j = 0; j < W; j++) v[j] = gelu_erf(b ? v[j] + bv[j] : v[j]);
    store_w<W>(y + n * F + f, v);
  }
}

template <int W>
__global__ void bias_gelu_bwd_kernel(float* dx, const float* dy, const float* x, const float* b,
                                     int64_t N, int64_t F) {
  const int64_t f = (int64_t(blockIdx.x) * kColThreads + threadIdx.x) * W;
  if (f >= F) return;
  float bv[W];
#pragma unroll
  for (int j = 0; j < W; j++) bv[j] = 0.f;
  if (b) load_w<W>(b + f, bv);
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float v[W], d[W];
    load_w<W>(x + n * F + f, v);
    load_w<W>(dy + n * F + f, d);
#pragma unroll
    for (int j = 0; j < W; j++) d[j] = d[j] * gelu_grad(b ? v[j] + bv[j] : v[j]);
    store_w<W>(dx + n * F + f, d);
  }
}

// dx (elementwise, alias-safe with dy or x) and its column sum for db in one pass.
struct BiasGeluBwd {
  float* dx;
  const float* dy;
  const float* x;
  const float* b;
  int64_t F;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[1]) const {
    const int64_t j = n * F + c;
    const float d = dy[j] * gelu_grad(b ? x[j] + b[c] : x[j]);
    dx[j] = d;
    v[0] = d;
  }
};

struct ColumnOf {
  const float* y;
  int64_t F;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[1]) const { v[0] = y[n * F + c]; }
};

}  // namespace

void swiglu_fwd(bf16* y_NI, const bf16* gu_N2I, int64_t N, int64_t I, cudaStream_t st) {
  if (!check_sizes("swiglu_fwd", __LINE__, N, I)) return;
  const bool vec = vec4_ok(I, {y_NI, gu_N2I});
  auto* kernel = vec ? swiglu_fwd_kernel<4> : swiglu_fwd_kernel<1>;
  kernel<<<tile_grid(N, I, vec ? 4 : 1), kColThreads, 0, st>>>(y_NI, gu_N2I, N, I);
  ZAYA_KERNEL_CHECK();
}

void swiglu_bwd(bf16* dgu_N2I, const bf16* dy_NI, const bf16* gu_N2I, int64_t N, int64_t I,
                cudaStream_t st) {
  if (!check_sizes("swiglu_bwd", __LINE__, N, I)) return;
  const bool vec = vec4_ok(I, {dgu_N2I, dy_NI, gu_N2I});
  auto* kernel = vec ? swiglu_bwd_kernel<4> : swiglu_bwd_kernel<1>;
  kernel<<<tile_grid(N, I, vec ? 4 : 1), kColThreads, 0, st>>>(dgu_N2I, dy_NI, gu_N2I, N, I);
  ZAYA_KERNEL_CHECK();
}

void bias_gelu_fwd(float* y, const float* x, const float* b, int64_t N, int64_t F,
                   cudaStream_t st) {
  if (!check_sizes("bias_gelu_fwd", __LINE__, N, F)) return;
  const bool vec = vec4_ok(F, {y, x, b});
  auto* kernel = vec ? bias_gelu_fwd_kernel<4> : bias_gelu_fwd_kernel<1>;
  kernel<<<tile_grid(N, F, vec ? 4 : 1), kColThreads, 0, st>>>(y, x, b, N, F);
  ZAYA_KERNEL_CHECK();
}

size_t bias_gelu_bwd_workspace_bytes(int64_t N, int64_t F) {
  return colreduce_workspace_bytes(N, F, 1);
}

void bias_gelu_bwd(float* dx, float* db, const float* dy, const float* x, const float* b, int64_t N,
                   int64_t F, Workspace& ws, cudaStream_t st) {
  if (!check_sizes("bias_gelu_bwd", __LINE__, N, F)) return;
  if (db) {
    colreduce<1>(OutPtrs<1>{{db}}, BiasGeluBwd{dx, dy, x, b, F}, N, F, ws, st);
    return;
  }
  const bool vec = vec4_ok(F, {dx, dy, x, b});
  auto* kernel = vec ? bias_gelu_bwd_kernel<4> : bias_gelu_bwd_kernel<1>;
  kernel<<<tile_grid(N, F, vec ? 4 : 1), kColThreads, 0, st>>>(dx, dy, x, b, N, F);
  ZAYA_KERNEL_CHECK();
}

size_t column_sum_workspace_bytes(int64_t N, int64_t F) {
  return colreduce_workspace_bytes(N, F, 1);
}

void column_sum(float* db_F, const float* dy_NF, int64_t N, int64_t F, Workspace& ws,
                cudaStream_t st) {
  if (!check_sizes("column_sum", __LINE__, N, F)) return;
  colreduce<1>(OutPtrs<1>{{db_F}}, ColumnOf{dy_NF, F}, N, F, ws, st);
}

}  // namespace zaya::cuda
