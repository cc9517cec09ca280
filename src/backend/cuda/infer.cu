// Decode-step kernels (infer_kernels.h): weight-streaming matrix-vector products, the expert
// product that picks each row's expert on the device, the CCA finish + cache append for one token,
// split-context attention over the cache, and the small bookkeeping kernels (argmax, lengths).
// Positions come from a device counter so a captured decode step replays unchanged.
// Deliberately not here: batched prefill (it runs the training-path kernels and GEMMs) and
// sampling other than greedy (done on the host from the logits).
#include <cfloat>
#include <cmath>

#include "backend/cuda/infer_kernels.h"
#include "backend/cuda/kernel_utils.cuh"
#include "core/cuda_check.h"

namespace zaya::cuda {
namespace {

using kern::aligned16;
using kern::warp_max;
using kern::warp_sum;

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // one output row per warp

__device__ __forceinline__ void bf16x8_to_f32(const uint4& u, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// One warp per output row o; lanes stride over K in 8-element (16-byte) pieces when `vec`.
template <int M, bool kVec>
__device__ void gemv_bf16_row(float (&acc)[M], const bf16* x, int64_t ldx, const bf16* w, int64_t K,
                              int lane) {
  if (kVec) {
#pragma unroll 4
    for (int64_t k = int64_t(lane) * 8; k < K; k += kWarp * 8) {
      float wf[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(w + k), wf);
#pragma unroll
      for (int m = 0; m < M; m++) {
        float xf[8];
        bf16x8_to_f32(*reinterpret_cast<const uint4*>(x + m * ldx + k), xf);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[m] = fmaf(wf[i], xf[i], acc[m]);
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += kWarp) {
      const float wk = __bfloat162float(w[k]);
#pragma unroll
      for (int m = 0; m < M; m++) acc[m] = fmaf(wk, __bfloat162float(x[m * ldx + k]), acc[m]);
    }
  }
}

template <int M, bool kVec>
__global__ void gemv_bf16_kernel(float* y32, bf16* y16, int64_t ldy, const bf16* x, int64_t ldx,
                                 const bf16* W, int64_t ldw, const float* bias, int64_t O,
                                 int64_t K) {
  const int lane = threadIdx.x % kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (o >= O) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  gemv_bf16_row<M, kVec>(acc, x, ldx, W + o * ldw, K, lane);
#pragma unroll
  for (int m = 0; m < M; m++) {
    const float s = warp_sum(acc[m]) + (bias ? bias[o] : 0.f);
    if (lane == 0) {
      if (y32) y32[m * ldy + o] = s;
      if (y16) y16[m * ldy + o] = __float2bfloat16(s);
    }
  }
}

template <int M, bool kVec>
__global__ void gemv_f32_kernel(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                                int64_t ldw, const float* bias, int64_t O, int64_t K) {
  const int lane = threadIdx.x % kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (o >= O) return;
  const float* w = W + o * ldw;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  if (kVec) {
    for (int64_t k = int64_t(lane) * 4; k < K; k += kWarp * 4) {
      const float4 wv = *reinterpret_cast<const float4*>(w + k);
#pragma unroll
      for (int m = 0; m < M; m++) {
        const float4 xv = *reinterpret_cast<const float4*>(x + m * ldx + k);
        acc[m] = fmaf(wv.x, xv.x, fmaf(wv.y, xv.y, fmaf(wv.z, xv.z, fmaf(wv.w, xv.w, acc[m]))));
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += kWarp)
#pragma unroll
      for (int m = 0; m < M; m++) acc[m] = fmaf(w[k], x[m * ldx + k], acc[m]);
  }
#pragma unroll
  for (int m = 0; m < M; m++) {
    const float s = warp_sum(acc[m]) + (bias ? bias[o] : 0.f);
    if (lane == 0) y[m * ldy + o] = s;
  }
}

// The experts of decode rows, in two launches per layer. Row m uses expert e = choice[m]
// (e >= E: the skip class, no expert runs). First act[m,i] = silu(x·Wgu_e[i]) · (x·Wgu_e[I+i]) from
// the packed gate|up rows, both dot products in fp32 in one warp; then
// out[m,o] = gate[m] · (act[m]·Wd_e[o]), or gate[m]·x[m,o] (scaled-input skip) or 0 for skips.
template <bool kVec>
__global__ void expert_swiglu_kernel(bf16* act, const bf16* x, int64_t ldx, const bf16* Wgu,
                                     int64_t gu_stride, const int32_t* choice, int64_t E, int64_t I,
                                     int64_t K) {
  const int lane = threadIdx.x % kWarp;
  const int64_t m = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (i >= I) return;
  const int64_t e = choice[m];
  if (e < 0 || e >= E) {
    if (lane == 0) act[m * I + i] = __float2bfloat16(0.f);
    return;
  }
  const bf16* W = Wgu + e * gu_stride;
  float g[1] = {0.f}, u[1] = {0.f};
  gemv_bf16_row<1, kVec>(g, x + m * ldx, ldx, W + i * K, K, lane);
  gemv_bf16_row<1, kVec>(u, x + m * ldx, ldx, W + (I + i) * K, K, lane);
  const float gs = warp_sum(g[0]), us = warp_sum(u[0]);
  if (lane == 0) act[m * I + i] = __float2bfloat16(gs / (1.0f + expf(-gs)) * us);
}

template <bool kVec>
__global__ void expert_down_combine_kernel(bf16* out, const bf16* act, const bf16* x,
                                           const bf16* Wd, int64_t d_stride, const float* gate,
                                           const int32_t* choice, int64_t E, bool scaled, int64_t D,
                                           int64_t I) {
  const int lane = threadIdx.x % kWarp;
  const int64_t m = blockIdx.y;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (o >= D) return;
  const int64_t e = choice[m];
  if (e < 0 || e >= E) {
    if (lane == 0)
      out[m * D + o] = __float2bfloat16(scaled ? gate[m] * __bfloat162float(x[m * D + o]) : 0.f);
    return;
  }
  float acc[1] = {0.f};
  gemv_bf16_row<1, kVec>(acc, act + m * I, I, Wd + e * d_stride + o * I, I, lane);
  const float s = warp_sum(acc[0]);
  if (lane == 0) out[m * D + o] = __float2bfloat16(gate[m] * s);
}

// One block per token. Dynamic shared memory: (Hq + Hkv)·d floats of pre-norm q and k.
__global__ void decode_qkv_finish_kernel(bf16* q_out, bf16* kcache, bf16* vcache, float* vd_last,
                                         const float* conv, const bf16* qkv, int64_t ld,
                                         const float* temp, const int32_t* len, int64_t cap,
                                         float theta, int r, int Hq, int Hkv, int d) {
  extern __shared__ float sh[];
  const int m = blockIdx.x;
  const int G = Hq / Hkv, QD = Hq * d, KD = Hkv * d, C = QD + KD, VH = KD / 2;
  const int64_t pos = len[m];
  const bf16* row = qkv + int64_t(m) * ld;
  const float* crow = conv + int64_t(m) * C;
  float* qs = sh;       // [Hq, d]
  float* ks = sh + QD;  // [Hkv, d]
  // Mean skip: mq[h] = (q0[h] + k0[h/G]) / 2 added to the conv output; mk[g] = mean of its mq.
  for (int i = threadIdx.x; i < QD; i += blockDim.x) {
    const int h = i / d, j = i % d;
    const float mq =
        (__bfloat162float(row[i]) + __bfloat162float(row[QD + (h / G) * d + j])) * 0.5f;
    qs[i] = crow[i] + mq;
  }
  for (int i = threadIdx.x; i < KD; i += blockDim.x) {
    const int g = i / d, j = i % d;
    float s = 0.f;
    for (int t = 0; t < G; t++) {
      const int h = g * G + t;
      s += (__bfloat162float(row[h * d + j]) + __bfloat162float(row[QD + g * d + j])) * 0.5f;
    }
    ks[i] = crow[QD + i] + s / float(G);
  }
  __syncthreads();
  // QK-norm per head (one warp per head), then RoPE, then store.
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, nwarps = blockDim.x / kWarp;
  const float sd = sqrtf(float(d));
  for (int hh = warp; hh < Hq + Hkv; hh += nwarps) {
    float* v = hh < Hq ? qs + hh * d : ks + (hh - Hq) * d;
    float ss = 0.f;
    for (int j = lane; j < d; j += kWarp) ss += v[j] * v[j];
    ss = warp_sum(ss);
    const float nrm = fmaxf(sqrtf(ss), FLT_EPSILON);
    const float a = sd * (hh < Hq ? 1.f : temp[hh - Hq]) / nrm;
    for (int j = lane; j < d; j += kWarp) v[j] *= a;
    __syncwarp();
    const int h2 = r / 2;
    for (int j = lane; j < h2; j += kWarp) {
      const float inv = 1.0f / powf(theta, float(2 * j) / float(r));
      const float f = float(pos) * inv;
      const float c = cosf(f), s = sinf(f);
      const float x0 = v[j], x1 = v[j + h2];
      v[j] = x0 * c - x1 * s;
      v[j + h2] = x1 * c + x0 * s;
    }
    __syncwarp();
    if (hh < Hq) {
      for (int j = lane; j < d; j += kWarp)
        q_out[(int64_t(m) * Hq + hh) * d + j] = __float2bfloat16(v[j]);
    } else {
      bf16* kd = kcache + ((int64_t(m) * cap + pos) * Hkv + (hh - Hq)) * d;
      for (int j = lane; j < d; j += kWarp) kd[j] = __float2bfloat16(v[j]);
    }
  }
  // Delayed value: v = [vc | vd of the previous token]; then remember this token's vd.
  bf16* vd_dst = vcache + (int64_t(m) * cap + pos) * KD;
  for (int i = threadIdx.x; i < VH; i += blockDim.x) {
    vd_dst[i] = row[C + i];
    vd_dst[VH + i] = __float2bfloat16(vd_last[int64_t(m) * VH + i]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < VH; i += blockDim.x)
    vd_last[int64_t(m) * VH + i] = __bfloat162float(row[C + VH + i]);
}

// Split-context attention: block (chunk, kv head g, sequence m) scores its chunk of `ch` keys for
// the G query heads of g and writes unnormalised partial outputs with their max and sum. Four
// warps split the chunk's keys; within a warp the lanes split the head dim (d/32 values each), so
// every K and V row is read once, coalesced, and the loads of different keys are in flight
// together. Shared memory: G·d floats of q, G·ch scores, 4·G·d partial outputs.
constexpr int kAttnWarps = 4;
__global__ void __launch_bounds__(kAttnWarps * 32)
    decode_attn_partial_kernel(float* part_o, float* part_ml, const bf16* q, const bf16* kcache,
                               const bf16* vcache, const int32_t* len, int64_t cap, int64_t window,
                               int Hq, int Hkv, int d, int ch, int nchunks) {
  extern __shared__ float sh[];
  const int c = blockIdx.x, g = blockIdx.y, m = blockIdx.z;
  const int G = Hq / Hkv, per = d / kWarp;  // head-dim values per lane (1, 2 or 4)
  const int64_t pos = len[m];               // the new token (already in the cache) is at pos
  const int64_t lo = window > 0 ? (pos - window + 1 > 0 ? pos - window + 1 : 0) : 0;
  const int64_t k0 = int64_t(c) * ch;
  const int64_t kb = k0 > lo ? k0 : lo;
  const int64_t ke = (k0 + ch < pos + 1) ? k0 + ch : pos + 1;
  const int64_t slot = (int64_t(m) * Hq + int64_t(g) * G) * nchunks + c;  // + t·nchunks per head
  if (kb >= ke) {
    if (threadIdx.x < G) {
      part_ml[2 * (slot + int64_t(threadIdx.x) * nchunks)] = -INFINITY;
      part_ml[2 * (slot + int64_t(threadIdx.x) * nchunks) + 1] = 0.f;
    }
    return;
  }
  float* qs = sh;           // [G, d], pre-scaled by 1/sqrt(d)
  float* sc = qs + G * d;   // [G, ch]
  float* po = sc + G * ch;  // [warps, G, d]
  const float scale = rsqrtf(float(d));
  for (int i = threadIdx.x; i < G * d; i += blockDim.x)
    qs[i] = __bfloat162float(q[(int64_t(m) * Hq + int64_t(g) * G) * d + i]) * scale;
  __syncthreads();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = int(ke - kb);
  const int64_t row = int64_t(Hkv) * d;  // elements between consecutive keys in the cache
  const bf16* kbase = kcache + (int64_t(m) * cap + kb) * row + int64_t(g) * d + lane * per;
  const bf16* vbase = vcache + (int64_t(m) * cap + kb) * row + int64_t(g) * d + lane * per;
  for (int j = warp; j < n; j += kAttnWarps) {
    float kf[4];
    for (int e = 0; e < per; e++) kf[e] = __bfloat162float(kbase[int64_t(j) * row + e]);
#pragma unroll
    for (int t = 0; t < 8; t++) {
      if (t >= G) break;
      float s = 0.f;
      for (int e = 0; e < per; e++) s = fmaf(qs[t * d + lane * per + e], kf[e], s);
      s = warp_sum(s);
      if (lane == 0) sc[t * ch + j] = s;
    }
  }
  __syncthreads();
  // Per head: max and sum over the chunk (one warp per head), probabilities in place.
  for (int t = warp; t < G; t += kAttnWarps) {
    float mx = -INFINITY;
    for (int j = lane; j < n; j += kWarp) mx = fmaxf(mx, sc[t * ch + j]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int j = lane; j < n; j += kWarp) {
      const float p = expf(sc[t * ch + j] - mx);
      sc[t * ch + j] = p;
      sum += p;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      part_ml[2 * (slot + int64_t(t) * nchunks)] = mx;
      part_ml[2 * (slot + int64_t(t) * nchunks) + 1] = sum;
    }
  }
  __syncthreads();
  // P·V: warps split the keys again, lanes the head dim; then the warps' sums are added in order.
  float acc[8][4];
#pragma unroll
  for (int t = 0; t < 8; t++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[t][e] = 0.f;
  for (int j = warp; j < n; j += kAttnWarps) {
    float vf[4];
    for (int e = 0; e < per; e++) vf[e] = __bfloat162float(vbase[int64_t(j) * row + e]);
#pragma unroll
    for (int t = 0; t < 8; t++) {
      if (t >= G) break;
      const float p = sc[t * ch + j];
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (e < per) acc[t][e] = fmaf(p, vf[e], acc[t][e]);
    }
  }
#pragma unroll
  for (int t = 0; t < 8; t++) {
    if (t >= G) break;
#pragma unroll
    for (int e = 0; e < 4; e++)
      if (e < per) po[(warp * G + t) * d + lane * per + e] = acc[t][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kAttnWarps; w++) s += po[w * G * d + i];
    const int t = i / d, e = i % d;
    part_o[(slot + int64_t(t) * nchunks) * d + e] = s;
  }
}

__global__ void decode_attn_combine_kernel(bf16* o, const float* part_o, const float* part_ml,
                                           int nchunks, int d) {
  const int64_t mh = blockIdx.x;  // m·Hq + h
  const float* ml = part_ml + 2 * mh * nchunks;
  float mx = -INFINITY;
  for (int c = 0; c < nchunks; c++) mx = fmaxf(mx, ml[2 * c]);
  float l = 0.f;
  for (int c = 0; c < nchunks; c++)
    if (ml[2 * c + 1] > 0.f) l += ml[2 * c + 1] * expf(ml[2 * c] - mx);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.f;
    for (int c = 0; c < nchunks; c++)
      if (ml[2 * c + 1] > 0.f) acc += part_o[(mh * nchunks + c) * d + i] * expf(ml[2 * c] - mx);
    o[mh * d + i] = __float2bfloat16(l > 0.f ? acc / l : 0.f);
  }
}

// Row kernels for decode (a few rows of D): one 256-thread block per row, so a row's loads are
// spread over the block instead of one warp (the training kernels' layout, which leaves a single
// row latency-bound). Same arithmetic as residual_scale_rmsnorm_fwd / rmsnorm_fwd.
constexpr int kRowThreads = 256;

__device__ float block_sum_rows(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < kRowThreads / kWarp; w++) t += red[w];  // same order in every thread
  return t;
}

__global__ void __launch_bounds__(kRowThreads)
    decode_residual_norm_kernel(float* h, bf16* y, const bf16* a, const float* hs, const float* hb,
                                const float* rs, const float* rb, const float* w, float eps,
                                int64_t D) {
  __shared__ float red[kRowThreads / kWarp];
  const int64_t m = blockIdx.x;
  float* hr = h + m * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kRowThreads) {
    const float v =
        a ? (__bfloat162float(a[m * D + i]) + hb[i]) * hs[i] + (hr[i] + rb[i]) * rs[i] : hr[i];
    hr[i] = v;
    ss += v * v;
  }
  const float rstd = 1.0f / sqrtf(block_sum_rows(ss, red) / float(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += kRowThreads)
    y[m * D + i] = __float2bfloat16(w[i] * hr[i] * rstd);
}

// The router after its down projection, for a few decode rows, in one block per row: EDA state,
// RMSNorm, fc1 + GELU, fc2 + GELU, the class logits, fp32 softmax and the biased top-1 choice
// (ties to the lowest class) — the chain router_eda_fwd … router_select of the training path, in
// one launch instead of eight. Shared memory: 3·R + E1 floats.
constexpr int kRouterThreads = 256;

// y[o] = Σ_k W[o,k] x[k] + b[o] for o < O, one warp per output row, x in shared memory.
__device__ void block_matvec(float* y, const float* x, const float* W, const float* b, int O, int K,
                             bool gelu) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int o = warp; o < O; o += kRouterThreads / kWarp) {
    const float* w = W + int64_t(o) * K;
    float s = 0.f;
    for (int k = lane; k < K; k += kWarp) s = fmaf(w[k], x[k], s);
    s = warp_sum(s) + (b ? b[o] : 0.f);
    if (lane == 0) y[o] = gelu ? kern::gelu_erf(s) : s;
  }
}

__global__ void __launch_bounds__(kRouterThreads)
    decode_router_tail_kernel(float* r, float* probs, int32_t* choice, float* gate,
                              const float* state, const float* scale, const float* norm_w,
                              float eps, const float* fc1_w, const float* fc1_b, const float* fc2_w,
                              const float* fc2_b, const float* out_w, const float* bal, int R,
                              int E1) {
  extern __shared__ float sh[];
  __shared__ float red[kRouterThreads / kWarp];
  const int64_t m = blockIdx.x;
  float* rn = sh;          // [R]
  float* h1 = sh + R;      // [R]
  float* h2 = sh + 2 * R;  // [R]
  float* lg = sh + 3 * R;  // [E1]
  float* rr = r + m * R;
  float ss = 0.f;
  for (int i = threadIdx.x; i < R; i += kRouterThreads) {
    float v = rr[i];
    if (state) v += state[m * R + i] * scale[i];
    rr[i] = v;  // the next layer's EDA state
    rn[i] = v;
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int w = 0; w < kRouterThreads / kWarp; w++) tot += red[w];
  const float rstd = 1.0f / sqrtf(tot / float(R) + eps);
  for (int i = threadIdx.x; i < R; i += kRouterThreads) rn[i] = norm_w[i] * (rn[i] * rstd);
  __syncthreads();
  block_matvec(h1, rn, fc1_w, fc1_b, R, R, true);
  __syncthreads();
  block_matvec(h2, h1, fc2_w, fc2_b, R, R, true);
  __syncthreads();
  block_matvec(lg, h2, out_w, nullptr, E1, R, false);
  __syncthreads();
  if (threadIdx.x < kWarp)  // softmax and choice: one warp, the training path's rule
    kern::warp_router_select(probs + m * E1, choice + m, gate + m, lg, bal, E1);
}

// Argmax over long rows in two passes: 256 blocks per row each reduce a slice to (value, index),
// then one block per row reduces the slices in order. Ties go to the lowest index throughout.
constexpr int kArgmaxSlices = 256;

__device__ void argmax_merge(float& bv, int64_t& bi, float ov, int64_t oi) {
  if (ov > bv || (ov == bv && oi < bi) || (bi < 0 && oi >= 0)) {
    bv = ov;
    bi = oi;
  }
}

__device__ void block_argmax(float& bv, int64_t& bi) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  for (int o = kWarp / 2; o > 0; o >>= 1)
    argmax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x) / kWarp; w++) argmax_merge(bv, bi, sv[w], si[w]);
  }
}

__global__ void argmax_slices_kernel(float* part_v, int64_t* part_i, const float* logits,
                                     int64_t V) {
  const int64_t m = blockIdx.y, slice = blockIdx.x;
  const int64_t per = (V + kArgmaxSlices - 1) / kArgmaxSlices;
  const int64_t v0 = slice * per, v1 = v0 + per < V ? v0 + per : V;
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x)
    argmax_merge(bv, bi, logits[m * V + v], v);
  block_argmax(bv, bi);
  if (threadIdx.x == 0) {
    part_v[m * kArgmaxSlices + slice] = bv;
    part_i[m * kArgmaxSlices + slice] = bi;
  }
}

__global__ void argmax_final_kernel(int32_t* out, const float* part_v, const int64_t* part_i) {
  const int64_t m = blockIdx.x;
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int s = threadIdx.x; s < kArgmaxSlices; s += blockDim.x)
    argmax_merge(bv, bi, part_v[m * kArgmaxSlices + s], part_i[m * kArgmaxSlices + s]);
  block_argmax(bv, bi);
  if (threadIdx.x == 0) out[m] = int32_t(bi < 0 ? 0 : bi);
}

__global__ void kv_append_kernel(bf16* kc, bf16* vc, const bf16* k, const bf16* v, int64_t past,
                                 int64_t cap, int64_t S, int64_t row) {
  const int64_t bt = blockIdx.x;  // b·S + t
  const int64_t b = bt / S, t = bt % S;
  const int64_t dst = (b * cap + past + t) * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[dst + i] = k[bt * row + i];
    vc[dst + i] = v[bt * row + i];
  }
}

__global__ void advance_kernel(int32_t* len, int32_t n, int64_t B) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < B) len[b] += n;
}

void check(bool ok, const char* what) {
  if (!ok)
    ::zaya::detail::platform_fail("CUDA", "decode kernel arguments", __FILE__, __LINE__, what);
}

template <int M>
void launch_gemv_bf16(float* y32, bf16* y16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                      int64_t ldw, const float* bias, int64_t O, int64_t K, cudaStream_t st) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const bool vec = K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && aligned16(x) && aligned16(W);
  if (vec)
    gemv_bf16_kernel<M, true>
        <<<grid, kRowsPerBlock * kWarp, 0, st>>>(y32, y16, ldy, x, ldx, W, ldw, bias, O, K);
  else
    gemv_bf16_kernel<M, false>
        <<<grid, kRowsPerBlock * kWarp, 0, st>>>(y32, y16, ldy, x, ldx, W, ldw, bias, O, K);
}

template <int M>
void launch_gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                     int64_t ldw, const float* bias, int64_t O, int64_t K, cudaStream_t st) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && aligned16(x) && aligned16(W);
  if (vec)
    gemv_f32_kernel<M, true>
        <<<grid, kRowsPerBlock * kWarp, 0, st>>>(y, ldy, x, ldx, W, ldw, bias, O, K);
  else
    gemv_f32_kernel<M, false>
        <<<grid, kRowsPerBlock * kWarp, 0, st>>>(y, ldy, x, ldx, W, ldw, bias, O, K);
}

}  // namespace

void gemv_bf16(float* y_f32, bf16* y_bf16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
               int64_t ldw, const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st) {
  check(M >= 1 && M <= kGemvMaxRows && O > 0 && K > 0 && ldw >= K && ldx >= K && ldy >= O,
        "gemv_bf16: need 1 <= M <= 8, O, K > 0, ldw, ldx >= K, ldy >= O");
  switch (M) {
#define ZAYA_GEMV_CASE(n) \
  case n: launch_gemv_bf16<n>(y_f32, y_bf16, ldy, x, ldx, W, ldw, bias, O, K, st); break;
    ZAYA_GEMV_CASE(1)
    ZAYA_GEMV_CASE(2)
    ZAYA_GEMV_CASE(3)
    ZAYA_GEMV_CASE(4) ZAYA_GEMV_CASE(5) ZAYA_GEMV_CASE(6) ZAYA_GEMV_CASE(7) ZAYA_GEMV_CASE(8)
#undef ZAYA_GEMV_CASE
  }
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W, int64_t ldw,
              const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st) {
  check(M >= 1 && M <= kGemvMaxRows && O > 0 && K > 0 && ldw >= K && ldx >= K && ldy >= O,
        "gemv_f32: need 1 <= M <= 8, O, K > 0, ldw, ldx >= K, ldy >= O");
  switch (M) {
#define ZAYA_GEMV_CASE(n) \
  case n: launch_gemv_f32<n>(y, ldy, x, ldx, W, ldw, bias, O, K, st); break;
    ZAYA_GEMV_CASE(1)
    ZAYA_GEMV_CASE(2)
    ZAYA_GEMV_CASE(3)
    ZAYA_GEMV_CASE(4) ZAYA_GEMV_CASE(5) ZAYA_GEMV_CASE(6) ZAYA_GEMV_CASE(7) ZAYA_GEMV_CASE(8)
#undef ZAYA_GEMV_CASE
  }
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_experts(bf16* out_MD, bf16* act_MI, const bf16* x_MD, const bf16* gate_up_E2ID,
                    const bf16* down_EDI, const float* gate_M, const int32_t* choice_M, int64_t E,
                    bool skip_scaled_input, int64_t M, int64_t D, int64_t I, cudaStream_t st) {
  check(M >= 1 && D > 0 && I > 0, "decode_experts: bad sizes");
  const bool vec = D % 8 == 0 && I % 8 == 0 && aligned16(x_MD) && aligned16(gate_up_E2ID) &&
                   aligned16(down_EDI) && aligned16(act_MI);
  const dim3 g1{unsigned((I + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(M)};
  const dim3 g2{unsigned((D + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(M)};
  if (vec) {
    expert_swiglu_kernel<true><<<g1, kRowsPerBlock * kWarp, 0, st>>>(act_MI, x_MD, D, gate_up_E2ID,
                                                                     2 * I * D, choice_M, E, I, D);
    expert_down_combine_kernel<true><<<g2, kRowsPerBlock * kWarp, 0, st>>>(
        out_MD, act_MI, x_MD, down_EDI, D * I, gate_M, choice_M, E, skip_scaled_input, D, I);
  } else {
    expert_swiglu_kernel<false><<<g1, kRowsPerBlock * kWarp, 0, st>>>(act_MI, x_MD, D, gate_up_E2ID,
                                                                      2 * I * D, choice_M, E, I, D);
    expert_down_combine_kernel<false><<<g2, kRowsPerBlock * kWarp, 0, st>>>(
        out_MD, act_MI, x_MD, down_EDI, D * I, gate_M, choice_M, E, skip_scaled_input, D, I);
  }
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_qkv_finish(bf16* q_MHd, bf16* kcache, bf16* vcache, float* vd_last_B,
                       const float* conv_MC, const bf16* qkv, int64_t ld, const float* temp_G,
                       const int32_t* len_B, int64_t cap, float theta, int64_t r, int64_t M,
                       int64_t Hq, int64_t Hkv, int64_t d, cudaStream_t st) {
  check(Hq % Hkv == 0 && r % 2 == 0 && r <= d && (Hkv * d) % 2 == 0,
        "decode_qkv_finish: heads must divide, rotary dim even and <= head dim");
  const size_t smem = size_t((Hq + Hkv) * d) * sizeof(float);
  if (smem > 48 * 1024)
    ZAYA_CUDA_CHECK(cudaFuncSetAttribute(decode_qkv_finish_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  decode_qkv_finish_kernel<<<unsigned(M), 256, smem, st>>>(
      q_MHd, kcache, vcache, vd_last_B, conv_MC, qkv, ld, temp_G, len_B, cap, theta, int(r),
      int(Hq), int(Hkv), int(d));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

// Keys per split-context block: small enough that a short context still spreads over the SMs
// (about two blocks per SM for one sequence), at most 256 so the scores fit shared memory.
int attn_chunk(int64_t M, int64_t Hkv, int64_t cap) {
  int ch = 32;
  while (ch < 256 && (cap + ch - 1) / ch * Hkv * M > 512) ch *= 2;
  return ch;
}

size_t decode_attention_workspace_bytes(int64_t M, int64_t Hq, int64_t d, int64_t cap) {
  // The largest chunk count any batch up to M takes (smaller batches may use smaller chunks).
  const int64_t nchunks = (cap + 31) / 32;
  return size_t(M * Hq * nchunks * (d + 2)) * sizeof(float);
}

void decode_attention(bf16* o_MHd, const bf16* q_MHd, const bf16* kcache, const bf16* vcache,
                      const int32_t* len_B, int64_t cap, int64_t window, int64_t M, int64_t Hq,
                      int64_t Hkv, int64_t d, void* ws, cudaStream_t st) {
  const int64_t G = Hq / Hkv;
  check(Hq % Hkv == 0 && G <= 8 && d % kWarp == 0 && d <= 4 * kWarp,
        "decode_attention: needs Hq/Hkv <= 8 and a head dim of 32, 64, 96 or 128");
  const int ch = attn_chunk(M, Hkv, cap);
  const int nchunks = int((cap + ch - 1) / ch);
  float* part_o = static_cast<float*>(ws);
  float* part_ml = part_o + M * Hq * nchunks * d;
  const size_t smem = size_t(G * d + G * ch + kAttnWarps * G * d) * sizeof(float);
  const dim3 grid{unsigned(nchunks), unsigned(Hkv), unsigned(M)};
  decode_attn_partial_kernel<<<grid, kAttnWarps * kWarp, smem, st>>>(
      part_o, part_ml, q_MHd, kcache, vcache, len_B, cap, window, int(Hq), int(Hkv), int(d), ch,
      nchunks);
  ZAYA_CUDA_CHECK(cudaGetLastError());
  decode_attn_combine_kernel<<<unsigned(M * Hq), 128, 0, st>>>(o_MHd, part_o, part_ml, nchunks,
                                                               int(d));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_residual_norm(float* h_MD, bf16* y_MD, const bf16* a_MD, const float* hs_D,
                          const float* hb_D, const float* rs_D, const float* rb_D,
                          const float* norm_w_D, float eps, int64_t M, int64_t D, cudaStream_t st) {
  decode_residual_norm_kernel<<<unsigned(M), kRowThreads, 0, st>>>(h_MD, y_MD, a_MD, hs_D, hb_D,
                                                                   rs_D, rb_D, norm_w_D, eps, D);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void kv_append(bf16* kcache, bf16* vcache, const bf16* k, const bf16* v, int64_t past, int64_t cap,
               int64_t B, int64_t S, int64_t Hkv, int64_t d, cudaStream_t st) {
  check(past + S <= cap, "kv_append: past the cache capacity");
  kv_append_kernel<<<unsigned(B * S), 128, 0, st>>>(kcache, vcache, k, v, past, cap, S, Hkv * d);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

size_t argmax_workspace_bytes(int64_t M) {
  return size_t(M) * kArgmaxSlices * (sizeof(float) + sizeof(int64_t)) + 16;
}

void argmax_rows(int32_t* ids_out, const float* logits_MV, int64_t M, int64_t V, void* ws,
                 cudaStream_t st) {
  int64_t* part_i = static_cast<int64_t*>(ws);
  float* part_v = reinterpret_cast<float*>(part_i + M * kArgmaxSlices);
  argmax_slices_kernel<<<dim3{unsigned(kArgmaxSlices), unsigned(M)}, 256, 0, st>>>(part_v, part_i,
                                                                                   logits_MV, V);
  ZAYA_CUDA_CHECK(cudaGetLastError());
  argmax_final_kernel<<<unsigned(M), 256, 0, st>>>(ids_out, part_v, part_i);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_router_tail(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                        const float* state_MR, const float* scale_R, const float* norm_w_R,
                        float eps, const float* fc1_w, const float* fc1_b, const float* fc2_w,
                        const float* fc2_b, const float* out_w, const float* balancing_E1,
                        int64_t M, int64_t R, int64_t E1, cudaStream_t st) {
  const size_t smem = size_t(3 * R + E1) * sizeof(float);
  check(smem <= 48 * 1024, "decode_router_tail: router width too large for one block");
  decode_router_tail_kernel<<<unsigned(M), kRouterThreads, smem, st>>>(
      r_MR, probs_ME1, choice_M, gate_M, state_MR, scale_R, norm_w_R, eps, fc1_w, fc1_b, fc2_w,
      fc2_b, out_w, balancing_E1, int(R), int(E1));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void advance_lengths(int32_t* len_B, int32_t n, int64_t B, cudaStream_t st) {
  advance_kernel<<<unsigned((B + 127) / 128), 128, 0, st>>>(len_B, n, B);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda
