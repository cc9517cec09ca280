// Chunked cross-entropy of the CUDA backend (backend/cuda/ops.h): ce_init, ce_chunk_stats,
// ce_finalize, ce_chunk_grad and the deterministic sum_loss. Specification: cpu::cross_entropy
// (which works in double; these kernels use fp32 with an online max/sum-of-exp, so losses agree to
// fp32 rounding).
//
// The caller never holds [N, V] logits: it produces fp32 logits for a chunk of tokens × a range
// [v0, v0+Vc) of the vocabulary (in practice the full vocabulary, Vc = V ≈ 262K), folds each chunk
// into running per-row (max, sumexp) with ce_chunk_stats, finalises lse, then recomputes each
// chunk's logits for ce_chunk_grad. Both row kernels use one block per row with 4-wide loads;
// every reduction (threads, warps, then the running value) is combined in a fixed order, so the
// statistics are bit-reproducible. Deliberately not here: label smoothing, z-loss, and fusing the
// LM-head GEMM with the softmax (the GEMM layer produces the chunk's logits).
#include "backend/cuda/arch/kernel_utils.cuh"

namespace zaya::cuda {

namespace {

using namespace kern;

constexpr int kCeThreads = 256;

// Running (max, sum of exp(x − max)) pairs; m = −inf means "no value above −inf yet": s is then 0,
// or NaN once a NaN logit was seen. The reference's exp(NaN − max) makes its sum and loss NaN, so a
// NaN must survive every fold and merge; an empty side is therefore added unscaled (its s is 0 or
// NaN) rather than dropped, and exp(−inf − −inf) = NaN is never evaluated for an empty side.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  const float sa = a.m == -INFINITY ? a.s : a.s * expf(a.m - m);
  const float sb = b.m == -INFINITY ? b.s : b.s * expf(b.m - m);
  return MaxSum{m, sa + sb};
}

// Folds W values into a thread's running pair: one rescale per group, then one exp per value.
template <int W>
__device__ __forceinline__ void fold(MaxSum& r, const float (&v)[W]) {
  float mw = v[0];
#pragma unroll
  for (int j = 1; j < W; j++) mw = fmaxf(mw, v[j]);
  if (mw > r.m) {
    r.s = r.m == -INFINITY ? 0.f : r.s * expf(r.m - mw);
    r.m = mw;
  }
  if (r.m == -INFINITY) {  // every value so far is −inf or NaN: only a NaN is recorded
#pragma unroll
    for (int j = 0; j < W; j++)
      if (isnan(v[j])) r.s = v[j];
    return;
  }
#pragma unroll
  for (int j = 0; j < W; j++) r.s += expf(v[j] - r.m);
}

// Block-wide combine in a fixed order: butterfly within warps, then warp 0 over the warp results.
__device__ MaxSum block_combine(MaxSum r) {
  __shared__ MaxSum sh[kCeThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)};
    r = combine(r, other);
  }
  const int warp = int(threadIdx.x >> 5), lane = lane_id();
  if (lane == 0) sh[warp] = r;
  __syncthreads();
  if (warp == 0) {
    r = lane < kCeThreads / 32 ? sh[lane] : MaxSum{-INFINITY, 0.f};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      MaxSum other{__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)};
      r = combine(r, other);
    }
  }
  return r;  // valid in thread 0
}

__global__ void ce_init_kernel(float* mx, float* se, float* tl, int64_t N) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += int64_t(gridDim.x) * blockDim.x) {
    mx[n] = -INFINITY;
    se[n] = 0.f;
    tl[n] = 0.f;
  }
}

template <int W>
__global__ void __launch_bounds__(kCeThreads)
    ce_chunk_stats_kernel(float* mx, float* se, float* tl, const float* logits,
                          const int32_t* targets, int64_t v0, int64_t Vc) {
  const int64_t n = blockIdx.x;
  const float* l = logits + n * Vc;
  MaxSum r{-INFINITY, 0.f};
  for (int64_t v = int64_t(threadIdx.x) * W; v < Vc; v += int64_t(kCeThreads) * W) {
    float x[W];
    load_w<W>(l + v, x);
    fold<W>(r, x);
  }
  r = block_combine(r);
  if (threadIdx.x == 0) {
    const MaxSum run = combine(MaxSum{mx[n], se[n]}, r);
    mx[n] = run.m;
    se[n] = run.s;
    const int64_t t = targets[n];
    if (t >= v0 && t < v0 + Vc) tl[n] = l[t - v0];
  }
}

__global__ void ce_finalize_kernel(float* loss, float* lse, const float* mx, const float* se,
                                   const float* tl, const int32_t* targets, int64_t N) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += int64_t(gridDim.x) * blockDim.x) {
    const float z = mx[n] + logf(se[n]);
    if (lse) lse[n] = z;
    loss[n] = targets[n] >= 0 ? z - tl[n] : 0.f;
  }
}

template <int W>
__global__ void __launch_bounds__(kCeThreads)
    ce_chunk_grad_kernel(bf16* dlogits, const float* logits, const float* lse,
                         const int32_t* targets, float scale, int64_t v0, int64_t Vc) {
  const int64_t n = blockIdx.x;
  const int64_t t = targets[n];
  const float z = lse[n];
  const float* l = logits + n * Vc;
  bf16* d = dlogits + n * Vc;
  for (int64_t v = int64_t(threadIdx.x) * W; v < Vc; v += int64_t(kCeThreads) * W) {
    float x[W];
    if (t < 0) {
#pragma unroll
      for (int j = 0; j < W; j++) x[j] = 0.f;
    } else {
      load_w<W>(l + v, x);
#pragma unroll
      for (int j = 0; j < W; j++) x[j] = scale * (expf(x[j] - z) - (v0 + v + j == t ? 1.0f : 0.0f));
    }
    store_w<W>(d + v, x);
  }
}

// One block: per-thread fp64 partial sums over a fixed stride, then a fixed-order tree.
constexpr int kSumThreads = 1024;
__global__ void __launch_bounds__(kSumThreads)
    sum_loss_kernel(double* out, int32_t* count_out, const float* loss, const int32_t* targets,
                    int64_t N) {
  __shared__ double sh[kSumThreads / 32];
  __shared__ int32_t shc[kSumThreads / 32];
  double s = 0.0;
  int32_t c = 0;
  for (int64_t i = threadIdx.x; i < N; i += kSumThreads)
    if (targets[i] >= 0) {
      s += double(loss[i]);
      c++;
    }
  s = warp_sum(s);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  const int warp = int(threadIdx.x >> 5), lane = lane_id();
  if (lane == 0) {
    sh[warp] = s;
    shc[warp] = c;
  }
  __syncthreads();
  if (warp == 0) {
    s = sh[lane];
    c = shc[lane];
    s = warp_sum(s);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if (lane == 0) {
      *out = s;
      if (count_out) *count_out = c;
    }
  }
}

}  // namespace

void ce_init(float* max_N, float* sumexp_N, float* tlogit_N, int64_t N, cudaStream_t st) {
  if (!check_sizes("ce_init", __LINE__, N)) return;
  ce_init_kernel<<<elt_grid(N), kEltThreads, 0, st>>>(max_N, sumexp_N, tlogit_N, N);
  ZAYA_KERNEL_CHECK();
}

void ce_chunk_stats(float* max_N, float* sumexp_N, float* tlogit_N, const float* logits_NVc,
                    const int32_t* targets_N, int64_t v0, int64_t N, int64_t Vc, cudaStream_t st) {
  if (!check_sizes("ce_chunk_stats", __LINE__, N, Vc)) return;
  if (N > int64_t(INT32_MAX)) fail_arg("ce_chunk_stats", __LINE__, "too many rows");
  auto* kernel = vec4_ok(Vc, {logits_NVc}) ? ce_chunk_stats_kernel<4> : ce_chunk_stats_kernel<1>;
  kernel<<<unsigned(N), kCeThreads, 0, st>>>(max_N, sumexp_N, tlogit_N, logits_NVc, targets_N, v0,
                                             Vc);
  ZAYA_KERNEL_CHECK();
}

void ce_finalize(float* loss_N, float* lse_N, const float* max_N, const float* sumexp_N,
                 const float* tlogit_N, const int32_t* targets_N, int64_t N, cudaStream_t st) {
  if (!check_sizes("ce_finalize", __LINE__, N)) return;
  ce_finalize_kernel<<<elt_grid(N), kEltThreads, 0, st>>>(loss_N, lse_N, max_N, sumexp_N, tlogit_N,
                                                          targets_N, N);
  ZAYA_KERNEL_CHECK();
}

void ce_chunk_grad(bf16* dlogits_NVc, const float* logits_NVc, const float* lse_N,
                   const int32_t* targets_N, float scale, int64_t v0, int64_t N, int64_t Vc,
                   cudaStream_t st) {
  if (!check_sizes("ce_chunk_grad", __LINE__, N, Vc)) return;
  if (N > int64_t(INT32_MAX)) fail_arg("ce_chunk_grad", __LINE__, "too many rows");
  auto* kernel =
      vec4_ok(Vc, {dlogits_NVc, logits_NVc}) ? ce_chunk_grad_kernel<4> : ce_chunk_grad_kernel<1>;
  kernel<<<unsigned(N), kCeThreads, 0, st>>>(dlogits_NVc, logits_NVc, lse_N, targets_N, scale, v0,
                                             Vc);
  ZAYA_KERNEL_CHECK();
}

void sum_loss(double* loss_out, int32_t* count_out, const float* loss_N, const int32_t* targets_N,
              int64_t N, Workspace& ws, cudaStream_t st) {
  (void)ws;  // one block suffices for a micro-batch's tokens; no partials to park
  if (N < 0) fail_arg("sum_loss", __LINE__, "negative token count");
  sum_loss_kernel<<<1, kSumThreads, 0, st>>>(loss_out, count_out, loss_N, targets_N, N);
  ZAYA_KERNEL_CHECK();
}

}  // namespace zaya::cuda
