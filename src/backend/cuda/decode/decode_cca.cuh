// Internal to the decode kernels: the CCA finish's per-element pieces (RoPE angles, QK-norm,
// the finish of one head and of the delayed values, the history advance), shared by the finish
// kernels (decode_cca.cu) and the attention with the finish folded in (decode_attention.cu), so
// that they agree bit for bit.
#pragma once
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// Grid (Hq + Hkv + X, M), kQkvThreads threads: block h < Hq finishes query head h of token m, block
// Hq + g key head g (the mean skip, QK-norm, RoPE, then q out or the key into the cache); the X =
// ⌈max(C, VH)/kQkvThreads⌉ blocks after them write the delayed value v = [vc | vd of the previous
// token] into the cache, remember this token's vd, and advance the convolution history:
// hist[m] ← its last P−1 rows and this token's q0|k0 channels (what cca_conv_fwd's history update
// does for S = 1; the conv kernel ran before). One block per head instead of one per token keeps
// every chain of dependent loads to one round; the arithmetic per element is unchanged. Dynamic
// shared memory: d + 1 floats.
constexpr int kQkvThreads = 128;

// The rotation of this thread's first kRopePre pairs j = threadIdx.x + i·blockDim.x (j < r/2) at
// position pos: a function of the position alone, so decode_qkv_finish_kernel computes it before
// its wait (the length was written at least two launches back) instead of after the norm.
constexpr int kRopePre = 2;
struct RopePre {
  float c[kRopePre], s[kRopePre];
};
__device__ __forceinline__ void rope_angle(float& c, float& s, int64_t pos, float theta, int r,
                                           int j) {
  const float inv = 1.0f / powf(theta, float(2 * j) / float(r));
  const float f = float(pos) * inv;
  c = cosf(f), s = sinf(f);
}
__device__ __forceinline__ RopePre rope_pre(int64_t pos, float theta, int r) {
  RopePre t;
#pragma unroll
  for (int i = 0; i < kRopePre; i++) {
    const int j = int(threadIdx.x) + i * int(blockDim.x);
    t.c[i] = 1.f, t.s[i] = 0.f;
    if (j < r / 2) rope_angle(t.c[i], t.s[i], pos, theta, r, j);
  }
  return t;
}

// The finish's per-element arithmetic with its roundings spelled out (never contracted or
// reordered by the compiler), so that every kernel that finishes a head — decode_qkv_finish, the
// fused CCA launch and the attention with the finish folded in — gives the same bits: the squares
// of the QK-norm, the head's scale a = √d·temp/max(‖v‖, ε), and the rotated pair
// (x0·c − x1·s, x1·c + x0·s) with x = v·a.
__device__ __forceinline__ float qk_square_acc(float v, float ss) {
  return __fmaf_rn(v, v, ss);
}
__device__ __forceinline__ float qk_scale(float ss, float temp_h, int d) {
  const float nrm = fmaxf(sqrtf(ss), FLT_EPSILON);
  return __fdiv_rn(__fmul_rn(sqrtf(float(d)), temp_h), nrm);
}
__device__ __forceinline__ void rope_rotate(float v0, float v1, float a, float c, float s, bf16& y0,
                                            bf16& y1) {
  const float x0 = __fmul_rn(v0, a), x1 = __fmul_rn(v1, a);
  y0 = __float2bfloat16(__fmaf_rn(x0, c, -__fmul_rn(x1, s)));
  y1 = __float2bfloat16(__fmaf_rn(x1, c, __fmul_rn(x0, s)));
}

// Head hh (< Hq: query head; else key head hh − Hq) of row m after the convolutions, by the whole
// block: the mean skip added to the head's conv outputs ch[0, d), QK-norm (first warp), RoPE at
// position pos, stored to q_out or the cache. temp_h: the key head's temperature (1 for a query
// head); pre: the thread's rotations at pos (rope_pre), or null to compute them here. v: d + 1
// floats of shared memory. Starts and ends with every thread of the block (barriers inside).
__device__ __forceinline__ void qkv_finish_head(bf16* q_out, bf16* kcache, const float* ch,
                                                const bf16* row, float temp_h, int64_t pos,
                                                int64_t cap, float theta, int r, int Hq, int Hkv,
                                                int d, int m, int hh, float* v,
                                                const RopePre* pre = nullptr) {
  const int G = Hq / Hkv, QD = Hq * d;
  // Mean skip: mq[h] = (q0[h] + k0[h/G]) / 2 added to the conv output; mk[g] = mean of its mq.
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    if (hh < Hq) {
      const float mq =
          (__bfloat162float(row[hh * d + j]) + __bfloat162float(row[QD + (hh / G) * d + j])) * 0.5f;
      v[j] = ch[j] + mq;
    } else {
      const int g = hh - Hq;
      float s = 0.f;
      for (int t = 0; t < G; t++) {
        const int h = g * G + t;
        s += (__bfloat162float(row[h * d + j]) + __bfloat162float(row[QD + g * d + j])) * 0.5f;
      }
      v[j] = ch[j] + s / float(G);
    }
  }
  __syncthreads();
  // QK-norm (the first warp: lane-strided squares, butterfly sum), then RoPE, then store.
  if (threadIdx.x < kWarp) {
    float ss = 0.f;
    for (int j = threadIdx.x; j < d; j += kWarp) ss = qk_square_acc(v[j], ss);
    ss = warp_sum(ss);
    if (threadIdx.x == 0) v[d] = qk_scale(ss, temp_h, d);
  }
  __syncthreads();
  const float a = v[d];
  const int h2 = r / 2;
  bf16* out = hh < Hq ? q_out + (int64_t(m) * Hq + hh) * d
                      : kcache + ((int64_t(m) * cap + pos) * Hkv + (hh - Hq)) * d;
  for (int j = threadIdx.x, i = 0; j < d; j += blockDim.x, i++) {
    if (j < h2) {  // the pair (j, j + h2)
      float c, s;
      if (pre && i < kRopePre)
        c = pre->c[i], s = pre->s[i];
      else
        rope_angle(c, s, pos, theta, r, j);
      rope_rotate(v[j], v[j + h2], a, c, s, out[j], out[j + h2]);
    } else if (j >= r) {
      out[j] = __float2bfloat16(__fmul_rn(v[j], a));
    }
  }
  __syncthreads();  // v is reused by the caller
}

// Element i < VH of row m's delayed value: the cache gets [vc | vd of the previous token] at pos,
// vd_last this token's vd (the same thread reads vd_last[i] before it overwrites it).
__device__ __forceinline__ void qkv_finish_value(bf16* vcache, float* vd_last, const bf16* row,
                                                 int64_t pos, int64_t cap, int C, int KD, int m,
                                                 int i) {
  const int VH = KD / 2;
  bf16* vd_dst = vcache + (int64_t(m) * cap + pos) * KD;
  const float prev = vd_last[int64_t(m) * VH + i];
  vd_dst[i] = row[C + i];
  vd_dst[VH + i] = __float2bfloat16(prev);
  vd_last[int64_t(m) * VH + i] = __bfloat162float(row[C + VH + i]);
}

// Channel c of row m's convolution history advanced by one token: its last P−1 rows moved up,
// this token's q0|k0 value last.
__device__ __forceinline__ void conv_hist_advance(float* hist, const bf16* row, int P, int C, int m,
                                                  int c) {
  float* hm = hist + int64_t(m) * P * C + c;
  for (int p = 0; p + 1 < P; p++) hm[int64_t(p) * C] = hm[int64_t(p + 1) * C];
  hm[int64_t(P - 1) * C] = __bfloat162float(row[c]);
}


}  // namespace
}  // namespace zaya::cuda
