// Device helpers shared by the pointwise, norm, router, loss and optimizer kernels of the CUDA
// backend (norm.cu, embed.cu, activation.cu, router.cu, loss.cu, optim.cu):
//   - argument checks and launch checks that report through core/cuda_check.h (no fmt in .cu);
//   - warp reductions (butterfly shuffles: every lane ends with the same, order-fixed result);
//   - 4-wide fp32 / bf16 row loads and stores (16-byte and 8-byte accesses);
//   - the deterministic column reduction used for every parameter gradient that sums over tokens:
//     a fixed grid of (32-column tile × row chunk) blocks writes one partial per chunk to
//     workspace, and a second kernel sums the partials in a fixed order. No float atomics, so the
//     result depends only on (N, D) and the data, never on scheduling.
// Deliberately not here: anything model-specific; conversions (convert.cu); Workspace::take.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "backend/cuda/ops.h"
#include "core/cuda_check.h"

namespace zaya::cuda::kern {

// ---- host-side helpers -----------------------------------------------------------------------
__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// 4-wide row access needs D % 4 == 0 (so each row starts 16-byte aligned for fp32, 8-byte for bf16)
// and 16-byte aligned base pointers (null pointers count as aligned: they are not read).
inline bool vec4_ok(int64_t D, std::initializer_list<const void*> ptrs) {
  if (D % 4 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// Throws zaya::Error for negative sizes; returns false when there is nothing to do.
inline bool check_sizes(const char* fn, int line, int64_t a, int64_t b = 1) {
  if (a < 0 || b < 0)
    ::zaya::detail::platform_fail(
        "zaya", fn, __FILE__, line,
        "negative size (" + std::to_string(a) + ", " + std::to_string(b) + ")");
  return a > 0 && b > 0;
}

[[noreturn]] inline void fail_arg(const char* fn, int line, const std::string& what) {
  ::zaya::detail::platform_fail("zaya", fn, __FILE__, line, what);
}

#define ZAYA_KERNEL_CHECK() ZAYA_CUDA_CHECK(cudaGetLastError())

// Workspace carve-outs are 256-byte aligned (workspace_cuda.cpp); sizes add that slack per piece.
inline size_t ws_piece(size_t bytes) {
  return bytes + 256;
}

// Row kernels: one warp per row, 8 warps per block.
constexpr int kRowWarps = 8;
inline unsigned row_grid(int64_t rows) {
  return unsigned(ceil_div(rows, kRowWarps));
}

// Grid-stride elementwise kernels: a few waves of a large GPU (bandwidth-bound).
constexpr int kEltThreads = 256;
inline unsigned elt_grid(int64_t items) {
  int64_t b = ceil_div(items, kEltThreads);
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return unsigned(b);
}

// ---- device-side helpers
// -------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Exact (erf) GELU, as cpu::gelu and transformers' "gelu".
__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

__device__ __forceinline__ int lane_id() {
  return int(threadIdx.x & 31u);
}
// The global row of the calling warp in a row kernel (one warp per row).
__device__ __forceinline__ int64_t warp_row() {
  return int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

__device__ __forceinline__ float to_f(float x) {
  return x;
}
__device__ __forceinline__ float to_f(bf16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// Four consecutive elements as one access (caller guarantees alignment, see vec4_ok).
struct alignas(8) Bf16x4 {
  __nv_bfloat162 lo, hi;
};
__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
}
__device__ __forceinline__ void load4(const bf16* p, float (&v)[4]) {
  const Bf16x4 t = *reinterpret_cast<const Bf16x4*>(p);
  const float2 a = __bfloat1622float2(t.lo), b = __bfloat1622float2(t.hi);
  v[0] = a.x;
  v[1] = a.y;
  v[2] = b.x;
  v[3] = b.y;
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(bf16* p, const float (&v)[4]) {
  *reinterpret_cast<Bf16x4*>(p) =
      Bf16x4{__floats2bfloat162_rn(v[0], v[1]), __floats2bfloat162_rn(v[2], v[3])};
}

// Keeps the smallest positive value written to *flag (0 means "nothing recorded"): the first bad
// row of a launch, whichever thread gets there first (the embedding's out-of-range ids).
__device__ inline void record_first_bad(int32_t* flag, int32_t v) {
  int32_t old = atomicAdd(flag, 0);
  while (old == 0 || old > v) {
    const int32_t prev = atomicCAS(flag, old, v);
    if (prev == old) break;
    old = prev;
  }
}

// Loads/stores W consecutive elements (W = 4: one vector access; W = 1: scalar).
template <int W, typename T>
__device__ __forceinline__ void load_w(const T* p, float (&v)[W]) {
  if constexpr (W == 4)
    load4(p, v);
  else
    v[0] = to_f(p[0]);
}
template <int W, typename T>
__device__ __forceinline__ void store_w(T* p, const float (&v)[W]) {
  if constexpr (W == 4)
    store4(p, v);
  else
    p[0] = from_f<T>(v[0]);
}

// The router's choice for one row, by one warp (all 32 lanes): fp32 softmax of the E1 logits into
// probs, choice = the first maximum of probs + bias (ties to the lowest class; class 0 when v[0] is
// NaN or nothing exceeds −inf, as cpu::router_select), gate = probs[choice]. Shared by the training
// kernel (router.cu) and the decode router (decode/decode.cu).
__device__ __forceinline__ void warp_router_select(float* probs, int32_t* choice, float* gate,
                                                   const float* l, const float* bias, int64_t E1) {
  const int lane = lane_id();
  float mx = -INFINITY;
  for (int64_t e = lane; e < E1; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float s = 0.f;
  for (int64_t e = lane; e < E1; e += 32) s += expf(l[e] - mx);
  s = warp_sum(s);
  // Each lane's candidates in increasing e with strict '>', then a butterfly that prefers the
  // larger value and, on equal values, the lower index: the reference's first maximum.
  float bv = -INFINITY;
  int32_t bi = INT32_MAX;
  bool v0_nan = false;  // lane 0 only: the reference starts from v[0], and nothing beats a NaN
  for (int64_t e = lane; e < E1; e += 32) {
    const float p = expf(l[e] - mx) / s;
    probs[e] = p;
    const float v = p + (bias ? bias[e] : 0.0f);
    if (e == 0) v0_nan = isnan(v);
    if (v > bv) {
      bv = v;
      bi = int32_t(e);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (lane == 0) {
    // The reference keeps class 0 when v[0] is NaN (no '>' against it holds) and when nothing
    // compares greater than −inf (NaN or −inf rows).
    if (bi >= E1 || v0_nan) bi = 0;
    *choice = bi;
    *gate = expf(l[bi] - mx) / s;  // the same expression that produced probs[bi]
  }
}

// ---- deterministic column reduction
// -------------------------------------------------------------- out_k[c] += Σ_n f(n, c)_k for K
// outputs over an N×D grid. The functor F has
//   __device__ void operator()(int64_t n, int64_t c, float (&v)[K]) const
// and may also write elementwise outputs at (n, c): every (n, c) is visited exactly once, by one
// thread, so reading inputs and then writing an output of the same element is alias-safe.
//
// Grid: blocks of 32 columns × 8 row lanes; block (tile, chunk) covers rows [chunk·rpc, +rpc).
// Within a block, lane y sums rows chunk·rpc + y, +8, ... in order, the 8 lane sums are added in
// order 0..7, and the finishing kernel adds the chunk partials in a fixed strided order. The
// grid depends only on N, so the result is bit-reproducible for given (N, D) and data.
struct ColReduceGrid {
  int64_t rows_per_chunk = 0, chunks = 0;
};
inline ColReduceGrid colreduce_grid(int64_t N) {
  ColReduceGrid g;
  // At most 256 chunks (bounds workspace and the finishing pass); at least 32 rows per chunk.
  int64_t rpc = ceil_div(N, 256);
  if (rpc < 32) rpc = 32;
  g.rows_per_chunk = rpc;
  g.chunks = N > 0 ? ceil_div(N, rpc) : 0;
  return g;
}
inline size_t colreduce_workspace_bytes(int64_t N, int64_t D, int K) {
  const ColReduceGrid g = colreduce_grid(N);
  return ws_piece(size_t(g.chunks) * size_t(K) * size_t(D) * sizeof(float));
}

template <int K>
struct OutPtrs {
  float* p[K];
};

template <int K, class F>
__global__ void __launch_bounds__(256)
    colreduce_partial_kernel(float* part, F f, int64_t N, int64_t D, int64_t rpc) {
  __shared__ float sh[K][8][33];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t c = int64_t(blockIdx.x) * 32 + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t n0 = chunk * rpc;
  const int64_t n1 = n0 + rpc < N ? n0 + rpc : N;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; k++) acc[k] = 0.f;
  if (c < D) {
    for (int64_t n = n0 + ty; n < n1; n += 8) {
      float v[K];
      f(n, c, v);
#pragma unroll
      for (int k = 0; k < K; k++) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; k++) sh[k][ty][tx] = acc[k];
  __syncthreads();
  if (ty == 0 && c < D) {
#pragma unroll
    for (int k = 0; k < K; k++) {
      float s = sh[k][0][tx];
#pragma unroll
      for (int j = 1; j < 8; j++) s += sh[k][j][tx];
      part[(chunk * K + k) * D + c] = s;
    }
  }
}

template <int K>
__global__ void __launch_bounds__(256)
    colreduce_finish_kernel(OutPtrs<K> out, const float* part, int64_t chunks, int64_t D) {
  __shared__ float sh[8][33];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t c = int64_t(blockIdx.x) * 32 + tx;
  const int k = int(blockIdx.y);
  float s = 0.f;
  if (c < D)
    for (int64_t j = ty; j < chunks; j += 8) s += part[(j * K + k) * D + c];
  sh[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < D) {
    float t = sh[0][tx];
#pragma unroll
    for (int j = 1; j < 8; j++) t += sh[j][tx];
    float* o = out.p[k];
    if (o) o[c] += t;
  }
}

// Runs both passes; part must hold colreduce_workspace_bytes(N, D, K) (taken from ws here).
template <int K, class F>
void colreduce(OutPtrs<K> out, F f, int64_t N, int64_t D, Workspace& ws, cudaStream_t st) {
  const ColReduceGrid g = colreduce_grid(N);
  float* part = ws.take_n<float>(size_t(g.chunks) * size_t(K) * size_t(D));
  const dim3 block(32, 8);
  colreduce_partial_kernel<K, F>
      <<<dim3(unsigned(ceil_div(D, 32)), unsigned(g.chunks)), block, 0, st>>>(part, f, N, D,
                                                                              g.rows_per_chunk);
  ZAYA_KERNEL_CHECK();
  colreduce_finish_kernel<K>
      <<<dim3(unsigned(ceil_div(D, 32)), unsigned(K)), block, 0, st>>>(out, part, g.chunks, D);
  ZAYA_KERNEL_CHECK();
}

}  // namespace zaya::cuda::kern
