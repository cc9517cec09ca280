// Optimizer kernels of the CUDA backend (backend/cuda/ops.h): the deterministic fp64 sum of
// squares (global gradient norm, Muon's Frobenius normalisation), fused AdamW, and Muon's
// elementwise momentum and update. Specification: adamw_update and muon_update in
// optim/optimizer.cpp. The per-element arithmetic follows the reference's order:
//   AdamW: m = b1·m + c1·g;  v = b2·v + c2·g·g;  w = w·decay − step·m / (√v·inv_sqrt_bc2 + eps)
//          with c1 = 1−b1, c2 = 1−b2, decay = 1−lr·wd, step = lr/bc1, inv_sqrt_bc2 = 1/√bc2
//          formed on the host in double and rounded once to fp32 (as the reference does; its
//          betas are doubles while ours arrive as floats, so scalars may differ by an fp32 ulp);
//   Muon:  buf = mu·buf + g;  u = g + mu·buf (Nesterov) or buf;  w = w·decay − lr·scale·O.
// g is the stored gradient times gs (the clipping factor). The device rounds each step as written
// with explicit fused multiply-adds where the host reference rounds twice: results agree with the
// reference to fp32 rounding, and with themselves bit for bit whatever the access path.
//
// Elementwise kernels are grid-stride loops over 4-element groups (16-byte accesses when every
// pointer is 16-byte aligned, else scalar accesses of the same elements). sumsq assigns element
// groups to threads the same way for either access width and combines per-thread fp64 sums in a
// fixed tree and the block partials in a fixed order: the result depends only on n and the data.
// Deliberately not here: Newton–Schulz (GEMMs, optim_cuda.cpp) and clipping decisions (host).
#include <cmath>

#include "backend/cuda/arch/kernel_utils.cuh"

namespace zaya::cuda {

namespace {

using namespace kern;

constexpr int kSsThreads = 256;
constexpr int64_t kSsMaxBlocks = 1024;

int64_t sumsq_blocks(int64_t n) {
  int64_t b = ceil_div(ceil_div(n, 4), int64_t(kSsThreads) * 8);  // ≥ 8 groups per thread
  if (b < 1) b = 1;
  if (b > kSsMaxBlocks) b = kSsMaxBlocks;
  return b;
}

// Block-wide fp64 sum in a fixed order (valid in thread 0). blockDim.x must be kSsThreads.
__device__ double block_sum(double s) {
  __shared__ double sh[kSsThreads / 32];
  s = warp_sum(s);
  const int warp = int(threadIdx.x >> 5), lane = lane_id();
  if (lane == 0) sh[warp] = s;
  __syncthreads();
  s = 0.0;
  if (warp == 0) {
    s = lane < kSsThreads / 32 ? sh[lane] : 0.0;
    s = warp_sum(s);
  }
  return s;
}

__global__ void __launch_bounds__(kSsThreads)
    sumsq_partial_kernel(double* part, const float* x, int64_t n, bool vec) {
  const int64_t groups = ceil_div(n, 4);
  double s = 0.0;
  for (int64_t gi = int64_t(blockIdx.x) * kSsThreads + threadIdx.x; gi < groups;
       gi += int64_t(gridDim.x) * kSsThreads) {
    const int64_t i = gi * 4;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (vec && i + 4 <= n) {
      load4(x + i, v);
    } else {
      for (int j = 0; j < 4 && i + j < n; j++) v[j] = x[i + j];
    }
#pragma unroll
    for (int j = 0; j < 4; j++) s += double(v[j]) * double(v[j]);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kSsThreads)
    sumsq_finish_kernel(double* out, const double* part, int64_t blocks) {
  double s = 0.0;
  for (int64_t b = threadIdx.x; b < blocks; b += kSsThreads) s += part[b];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

struct AdamScalars {
  float gs, b1, b2, c1, c2, decay, step, inv_sqrt_bc2, eps;
};

// Every rounding is spelled out (…_rn intrinsics, explicit FMAs), so the compiler cannot contract
// differently in the 16-byte and the scalar paths: which path a tensor takes depends on the
// alignment of its pointers, which may differ between a run and its resumption, and the update
// must be bit-identical either way.
__device__ __forceinline__ float adamw_elem(float& p, float& m, float& v, float g,
                                            const AdamScalars& k) {
  const float gi = __fmul_rn(g, k.gs);
  const float mi = __fmaf_rn(k.b1, m, __fmul_rn(k.c1, gi));
  const float vi = __fmaf_rn(k.b2, v, __fmul_rn(__fmul_rn(k.c2, gi), gi));
  m = mi;
  v = vi;
  const float den = __fmaf_rn(__fsqrt_rn(vi), k.inv_sqrt_bc2, k.eps);
  p = __fmaf_rn(p, k.decay, -__fdiv_rn(__fmul_rn(k.step, mi), den));
  return p;
}

__device__ __forceinline__ void muon_elem(float& b, float& o, float g, float gs, float mu,
                                          bool nesterov) {
  const float gg = __fmul_rn(g, gs);
  b = __fmaf_rn(mu, b, gg);
  o = nesterov ? __fmaf_rn(mu, b, gg) : b;
}

__device__ __forceinline__ float update_elem(float p, float o, float decay, float step) {
  return __fmaf_rn(p, decay, -__fmul_rn(step, o));
}

// Calls f(i, full) for each group of four elements [i, i + 4) of n that this thread takes in a
// grid-stride loop; full: all four are in range and vector access is allowed (vec).
template <class F>
__device__ __forceinline__ void for_each_group4(int64_t n, bool vec, F&& f) {
  const int64_t groups = ceil_div(n, 4);
  for (int64_t gi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; gi < groups;
       gi += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = gi * 4;
    f(i, vec && i + 4 <= n);
  }
}

__global__ void adamw_kernel(float* p, bf16* pb, float* m, float* v, const float* g, AdamScalars k,
                             int64_t n, bool vec) {
  for_each_group4(n, vec, [&](int64_t i, bool full) {
    if (full) {
      float pv[4], mv[4], vv[4], gv[4];
      load4(p + i, pv);
      load4(m + i, mv);
      load4(v + i, vv);
      load4(g + i, gv);
#pragma unroll
      for (int j = 0; j < 4; j++) adamw_elem(pv[j], mv[j], vv[j], gv[j], k);
      store4(p + i, pv);
      store4(m + i, mv);
      store4(v + i, vv);
      if (pb) store4(pb + i, pv);
    } else {
      for (int64_t e = i; e < i + 4 && e < n; e++) {
        float pe = p[e], me = m[e], ve = v[e];
        adamw_elem(pe, me, ve, g[e], k);
        p[e] = pe;
        m[e] = me;
        v[e] = ve;
        if (pb) pb[e] = __float2bfloat16_rn(pe);
      }
    }
  });
}

__global__ void muon_momentum_kernel(float* buf, float* u, const float* g, float gs, float mu,
                                     bool nesterov, int64_t n, bool vec) {
  for_each_group4(n, vec, [&](int64_t i, bool full) {
    if (full) {
      float b[4], gv[4], o[4];
      load4(buf + i, b);
      load4(g + i, gv);
#pragma unroll
      for (int j = 0; j < 4; j++) muon_elem(b[j], o[j], gv[j], gs, mu, nesterov);
      store4(buf + i, b);
      store4(u + i, o);
    } else {
      for (int64_t e = i; e < i + 4 && e < n; e++) {
        float b = buf[e], o = 0.f;
        muon_elem(b, o, g[e], gs, mu, nesterov);
        buf[e] = b;
        u[e] = o;
      }
    }
  });
}

__global__ void apply_update_kernel(float* p, bf16* pb, const float* o, float decay, float step,
                                    int64_t n, bool vec) {
  for_each_group4(n, vec, [&](int64_t i, bool full) {
    if (full) {
      float pv[4], ov[4];
      load4(p + i, pv);
      load4(o + i, ov);
#pragma unroll
      for (int j = 0; j < 4; j++) pv[j] = update_elem(pv[j], ov[j], decay, step);
      store4(p + i, pv);
      if (pb) store4(pb + i, pv);
    } else {
      for (int64_t e = i; e < i + 4 && e < n; e++) {
        const float r = update_elem(p[e], o[e], decay, step);
        p[e] = r;
        if (pb) pb[e] = __float2bfloat16_rn(r);
      }
    }
  });
}

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* q : ptrs)
    if (!aligned16(q)) return false;
  return true;
}

}  // namespace

size_t sumsq_workspace_bytes(int64_t n) {
  return ws_piece(size_t(sumsq_blocks(n)) * sizeof(double));
}

void sumsq(double* out, const float* x, int64_t n, Workspace& ws, cudaStream_t st) {
  if (n < 0) fail_arg("sumsq", __LINE__, "negative element count");
  const int64_t blocks = sumsq_blocks(n);
  double* part = ws.take_n<double>(size_t(blocks));
  sumsq_partial_kernel<<<unsigned(blocks), kSsThreads, 0, st>>>(part, x, n, aligned16(x));
  ZAYA_KERNEL_CHECK();
  sumsq_finish_kernel<<<1, kSsThreads, 0, st>>>(out, part, blocks);
  ZAYA_KERNEL_CHECK();
}

void adamw_step(float* p, bf16* p_bf16, float* m, float* v, const float* g, float gs, float lr,
                float b1, float b2, float eps, float wd, float bc1, float bc2, int64_t n,
                cudaStream_t st) {
  if (!check_sizes("adamw_step", __LINE__, n)) return;
  if (!(bc1 > 0.f) || !(bc2 > 0.f))
    fail_arg("adamw_step", __LINE__, "bias corrections must be > 0 (step t >= 1)");
  AdamScalars k;
  k.gs = gs;
  k.b1 = b1;
  k.b2 = b2;
  k.c1 = float(1.0 - double(b1));
  k.c2 = float(1.0 - double(b2));
  k.decay = float(1.0 - double(lr) * double(wd));
  k.step = float(double(lr) / double(bc1));
  k.inv_sqrt_bc2 = float(1.0 / std::sqrt(double(bc2)));
  k.eps = eps;
  const bool vec = all_aligned({p, p_bf16, m, v, g});
  adamw_kernel<<<elt_grid(ceil_div(n, 4)), kEltThreads, 0, st>>>(p, p_bf16, m, v, g, k, n, vec);
  ZAYA_KERNEL_CHECK();
}

void muon_momentum(float* buf, float* u, const float* g, float gs, float mu, bool nesterov,
                   int64_t n, cudaStream_t st) {
  if (!check_sizes("muon_momentum", __LINE__, n)) return;
  const bool vec = all_aligned({buf, u, g});
  muon_momentum_kernel<<<elt_grid(ceil_div(n, 4)), kEltThreads, 0, st>>>(buf, u, g, gs, mu,
                                                                         nesterov, n, vec);
  ZAYA_KERNEL_CHECK();
}

void apply_update(float* p, bf16* p_bf16, const float* o, float lr, float wd, float scale,
                  int64_t n, cudaStream_t st) {
  if (!check_sizes("apply_update", __LINE__, n)) return;
  const float decay = float(1.0 - double(lr) * double(wd));
  const float step = float(double(lr) * double(scale));
  const bool vec = all_aligned({p, p_bf16, o});
  apply_update_kernel<<<elt_grid(ceil_div(n, 4)), kEltThreads, 0, st>>>(p, p_bf16, o, decay, step,
                                                                        n, vec);
  ZAYA_KERNEL_CHECK();
}

}  // namespace zaya::cuda
