// RMSNorm and ZAYA1's residual scaling on the GPU (backend/cuda/ops.h): rmsnorm_fwd (bf16 and
// fp32 outputs), rmsnorm_bwd (bf16 or fp32 dy), residual_scale_rmsnorm_fwd (the residual update
// fused with the next norm) and residual_scale_bwd. Specification: cpu::rmsnorm,
// cpu::rmsnorm_backward, cpu::residual_scale, cpu::residual_scale_backward.
//
// Row work is one warp per token (fp32 statistics, butterfly reductions, 4-wide loads when D % 4 ==
// 0 and the pointers are 16-byte aligned; any D works through the scalar path). Parameter
// gradients (dw, dhs, dhb, drs, drb) are summed over tokens by kern::colreduce: fixed-grid partials
// plus an ordered finishing pass, no float atomics, so they are bit-reproducible.
//
// Deliberately not here: fusing dw into the dx row pass (it would need per-block D-wide shared
// accumulators; rmsnorm_bwd reads dy and x twice instead), and the norms of CCA (qk_norm lives with
// the CCA kernels).
#include "backend/cuda/kernel_utils.cuh"

namespace zaya::cuda {

namespace {

using namespace kern;

template <int W, typename TY>
__global__ void rmsnorm_fwd_kernel(TY* y, float* rstd, const float* x, const float* w, float eps,
                                   int64_t N, int64_t D) {
  const int64_t n = warp_row();
  if (n >= N) return;  // whole warp leaves together: n is uniform across the warp
  const int lane = lane_id();
  const float* xr = x + n * D;
  float ss = 0.f;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float v[W];
    load_w<W>(xr + i, v);
#pragma unroll
    for (int j = 0; j < W; j++) ss += v[j] * v[j];
  }
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / float(D) + eps);
  if (lane == 0 && rstd) rstd[n] = r;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float v[W], wv[W], o[W];
    load_w<W>(xr + i, v);
    load_w<W>(w + i, wv);
#pragma unroll
    for (int j = 0; j < W; j++) o[j] = wv[j] * (v[j] * r);
    store_w<W>(y + n * D + i, o);
  }
}

template <typename TY>
void launch_rmsnorm_fwd(TY* y, float* rstd, const float* x, const float* w, float eps, int64_t N,
                        int64_t D, cudaStream_t st) {
  if (!check_sizes("rmsnorm_fwd", __LINE__, N, D)) return;
  const unsigned grid = row_grid(N), block = 32 * kRowWarps;
  if (vec4_ok(D, {y, x, w}))
    rmsnorm_fwd_kernel<4, TY><<<grid, block, 0, st>>>(y, rstd, x, w, eps, N, D);
  else
    rmsnorm_fwd_kernel<1, TY><<<grid, block, 0, st>>>(y, rstd, x, w, eps, N, D);
  ZAYA_KERNEL_CHECK();
}

// dx = r·w·g − c·x with c = r³/D · Σ w·g·x (cpu::rmsnorm_backward's formula and order).
template <int W, typename TG>
__global__ void rmsnorm_bwd_dx_kernel(float* dx, const TG* dy, const float* x, const float* w,
                                      const float* rstd, bool accumulate, int64_t N, int64_t D) {
  const int64_t n = warp_row();
  if (n >= N) return;
  const int lane = lane_id();
  const float* xr = x + n * D;
  const TG* gr = dy + n * D;
  float s = 0.f;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float xv[W], gv[W], wv[W];
    load_w<W>(xr + i, xv);
    load_w<W>(gr + i, gv);
    load_w<W>(w + i, wv);
#pragma unroll
    for (int j = 0; j < W; j++) s += wv[j] * gv[j] * xv[j];
  }
  s = warp_sum(s);
  const float r = rstd[n];
  const float c = s * r * r * r / float(D);
  float* dxr = dx + n * D;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float xv[W], gv[W], wv[W], o[W];
    load_w<W>(xr + i, xv);
    load_w<W>(gr + i, gv);
    load_w<W>(w + i, wv);
    if (accumulate) load_w<W>(dxr + i, o);
#pragma unroll
    for (int j = 0; j < W; j++) {
      const float d = r * wv[j] * gv[j] - c * xv[j];
      o[j] = accumulate ? o[j] + d : d;
    }
    store_w<W>(dxr + i, o);
  }
}

// dw[c] += Σ_n dy[n,c]·x[n,c]·rstd[n]
template <typename TG>
struct RmsNormDw {
  const TG* dy;
  const float* x;
  const float* rstd;
  int64_t D;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[1]) const {
    const int64_t j = n * D + c;
    v[0] = to_f(dy[j]) * x[j] * rstd[n];
  }
};

template <typename TG>
void launch_rmsnorm_bwd(float* dx, float* dw, const TG* dy, const float* x, const float* w,
                        const float* rstd, bool accumulate, int64_t N, int64_t D, Workspace& ws,
                        cudaStream_t st) {
  if (!check_sizes("rmsnorm_bwd", __LINE__, N, D)) return;
  // dw first: it reads dy before dx is written, so a non-accumulating dx may alias dy (fp32).
  if (dw) colreduce<1>(OutPtrs<1>{{dw}}, RmsNormDw<TG>{dy, x, rstd, D}, N, D, ws, st);
  const unsigned grid = row_grid(N), block = 32 * kRowWarps;
  if (vec4_ok(D, {dx, dy, x, w}))
    rmsnorm_bwd_dx_kernel<4, TG><<<grid, block, 0, st>>>(dx, dy, x, w, rstd, accumulate, N, D);
  else
    rmsnorm_bwd_dx_kernel<1, TG><<<grid, block, 0, st>>>(dx, dy, x, w, rstd, accumulate, N, D);
  ZAYA_KERNEL_CHECK();
}

// h_out = (a + hb) ⊙ hs + (h + rb) ⊙ rs, then y = norm_w ⊙ h_out · rstd when y is non-null.
// h_out may alias h: each element is read and then written by the same lane, and the norm pass
// re-reads only elements that lane wrote itself.
template <int W>
__global__ void residual_scale_rmsnorm_kernel(float* h_out, bf16* y, float* rstd, const bf16* a,
                                              const float* h, const float* hs, const float* hb,
                                              const float* rs, const float* rb, const float* norm_w,
                                              float eps, int64_t N, int64_t D) {
  const int64_t n = warp_row();
  if (n >= N) return;
  const int lane = lane_id();
  const int64_t base = n * D;
  float ss = 0.f;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float av[W], hv[W], hsv[W], hbv[W], rsv[W], rbv[W], o[W];
    load_w<W>(a + base + i, av);
    load_w<W>(h + base + i, hv);
    load_w<W>(hs + i, hsv);
    load_w<W>(hb + i, hbv);
    load_w<W>(rs + i, rsv);
    load_w<W>(rb + i, rbv);
#pragma unroll
    for (int j = 0; j < W; j++) {
      o[j] = (av[j] + hbv[j]) * hsv[j] + (hv[j] + rbv[j]) * rsv[j];
      ss += o[j] * o[j];
    }
    store_w<W>(h_out + base + i, o);
  }
  if (!y) return;  // uniform across the grid
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / float(D) + eps);
  if (lane == 0 && rstd) rstd[n] = r;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float v[W], wv[W], o[W];
    load_w<W>(h_out + base + i, v);
    load_w<W>(norm_w + i, wv);
#pragma unroll
    for (int j = 0; j < W; j++) o[j] = wv[j] * (v[j] * r);
    store_w<W>(y + base + i, o);
  }
}

// One pass over dout: the elementwise da, dh and the four column sums.
struct ResidualScaleBwd {
  bf16* da;
  float* dh;
  const float* dout;
  const bf16* a;
  const float* h;
  const float *hs, *hb, *rs, *rb;
  int64_t D;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[4]) const {
    const int64_t j = n * D + c;
    const float g = dout[j], av = to_f(a[j]), hv = h[j];  // read all before writing (aliasing)
    v[0] = g * (av + hb[c]);
    v[1] = g * hs[c];
    v[2] = g * (hv + rb[c]);
    v[3] = g * rs[c];
    da[j] = __float2bfloat16_rn(g * hs[c]);
    dh[j] = g * rs[c];
  }
};

}  // namespace

void rmsnorm_fwd(bf16* y_ND, float* rstd_N, const float* x_ND, const float* w_D, float eps,
                 int64_t N, int64_t D, cudaStream_t st) {
  launch_rmsnorm_fwd<bf16>(y_ND, rstd_N, x_ND, w_D, eps, N, D, st);
}

void rmsnorm_fwd_f32(float* y_ND, float* rstd_N, const float* x_ND, const float* w_D, float eps,
                     int64_t N, int64_t D, cudaStream_t st) {
  launch_rmsnorm_fwd<float>(y_ND, rstd_N, x_ND, w_D, eps, N, D, st);
}

size_t rmsnorm_bwd_workspace_bytes(int64_t N, int64_t D) {
  return colreduce_workspace_bytes(N, D, 1);
}

void rmsnorm_bwd(float* dx_ND, float* dw_D, const bf16* dy_ND, const float* x_ND, const float* w_D,
                 const float* rstd_N, bool accumulate, int64_t N, int64_t D, Workspace& ws,
                 cudaStream_t st) {
  launch_rmsnorm_bwd<bf16>(dx_ND, dw_D, dy_ND, x_ND, w_D, rstd_N, accumulate, N, D, ws, st);
}

void rmsnorm_bwd_f32(float* dx_ND, float* dw_D, const float* dy_ND, const float* x_ND,
                     const float* w_D, const float* rstd_N, bool accumulate, int64_t N, int64_t D,
                     Workspace& ws, cudaStream_t st) {
  launch_rmsnorm_bwd<float>(dx_ND, dw_D, dy_ND, x_ND, w_D, rstd_N, accumulate, N, D, ws, st);
}

void residual_scale_rmsnorm_fwd(float* h_out_ND, bf16* y_ND, float* rstd_N, const bf16* a_ND,
                                const float* h_ND, const float* hs_D, const float* hb_D,
                                const float* rs_D, const float* rb_D, const float* norm_w_D,
                                float eps, int64_t N, int64_t D, cudaStream_t st) {
  if (!check_sizes("residual_scale_rmsnorm_fwd", __LINE__, N, D)) return;
  if (y_ND && !norm_w_D)
    fail_arg("residual_scale_rmsnorm_fwd", __LINE__, "a norm output needs norm_w (null)");
  const unsigned grid = row_grid(N), block = 32 * kRowWarps;
  if (vec4_ok(D, {h_out_ND, y_ND, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, norm_w_D}))
    residual_scale_rmsnorm_kernel<4><<<grid, block, 0, st>>>(
        h_out_ND, y_ND, rstd_N, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, norm_w_D, eps, N, D);
  else
    residual_scale_rmsnorm_kernel<1><<<grid, block, 0, st>>>(
        h_out_ND, y_ND, rstd_N, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, norm_w_D, eps, N, D);
  ZAYA_KERNEL_CHECK();
}

size_t residual_scale_bwd_workspace_bytes(int64_t N, int64_t D) {
  return colreduce_workspace_bytes(N, D, 4);
}

void residual_scale_bwd(bf16* da_ND, float* dh_ND, float* dhs_D, float* dhb_D, float* drs_D,
                        float* drb_D, const float* dout_ND, const bf16* a_ND, const float* h_ND,
                        const float* hs_D, const float* hb_D, const float* rs_D, const float* rb_D,
                        int64_t N, int64_t D, Workspace& ws, cudaStream_t st) {
  if (!check_sizes("residual_scale_bwd", __LINE__, N, D)) return;
  colreduce<4>(OutPtrs<4>{{dhs_D, dhb_D, drs_D, drb_D}},
               ResidualScaleBwd{da_ND, dh_ND, dout_ND, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, D}, N, D,
               ws, st);
}

}  // namespace zaya::cuda
