// The CCA convolutions and finish of decode rows (decode_kernels.h: decode_conv,
// decode_qkv_finish): the depthwise and grouped convolutions for one token, then mean skip,
// QK-norm, RoPE, the delayed value and the cache and history writes.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// The CCA convolutions of decode rows (one token per sequence; its history hist [B, P, C],
// P = (t0−1) + (t1−1)): the depthwise conv (kernel t0) at the t1 positions the grouped conv reads,
// then y[m, co] = bg[co] + Σ_{ci<d, j<t1} wg[co, ci·t1 + j] · u[m, j, c0 + ci] over the head group
// c0 of co — cca_conv_fwd for S = 1, spread over C/8 blocks instead of one per group. One warp per
// output channel (the 8 channels of a block lie in one group: d % 8 == 0) for all M rows, so each
// weight row is read once; its loads are issued before the depthwise pass (NV float4 per lane when
// d·t1 = 128·NV; NV = 0: a lane-strided scalar loop). u of the group in shared memory, [M][d·t1]
// in wg's (ci, j) order. The history is advanced later, by decode_qkv_finish.
constexpr int kConvWarps = 8;

// u of the depthwise conv for row mm at element k = ci·t1 + j of group c0 (channel c0 + ci,
// position j of the t1 the grouped conv reads): depthwise_at of cca.cu for a one-token sequence,
// in two parts in the sum's order: the bias and the history's terms (pi = j + jj < P, the earlier
// tokens, which come first), which need nothing of the current token, then the current token's
// (pi >= P; at most one).
__device__ __forceinline__ float conv_depthwise_hist(const float* hist, const float* wdw,
                                                     const float* bdw, int mm, int c, int j, int t0,
                                                     int P, int C) {
  float s = bdw[c];
  for (int jj = 0; jj < t0 && j + jj < P; jj++)
    s = fmaf(wdw[c * t0 + jj], hist[(int64_t(mm) * P + j + jj) * C + c], s);
  return s;
}
__device__ __forceinline__ float conv_depthwise_token(float s, const bf16* qkv, int64_t ld,
                                                      const float* wdw, int mm, int c, int j,
                                                      int t0, int P) {
  for (int jj = P > j ? P - j : 0; jj < t0; jj++)
    s = fmaf(wdw[c * t0 + jj], __bfloat162float(qkv[int64_t(mm) * ld + c]), s);
  return s;
}

// Weight row wr (K = d·t1 floats) of one output channel into a lane's registers (NV float4 per
// lane at k = 4·lane + 128·i), and the channel's sums over u_s [M][K] for every row: the
// registers (NV > 0) or a lane-strided loop over wr (NV = 0), then the butterfly warp sum.
template <int NV>
__device__ __forceinline__ void conv_row_load(float4 (&wv)[NV > 0 ? NV : 1], const float* wr,
                                              int lane) {
  if constexpr (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; i++) wv[i] = *reinterpret_cast<const float4*>(wr + 4 * lane + 128 * i);
  }
}
template <int NV>
__device__ __forceinline__ void conv_row_sums(float (&acc)[kGemvMaxRows],
                                              const float4 (&wv)[NV > 0 ? NV : 1], const float* wr,
                                              const float* u_s, int K, int M, int lane) {
#pragma unroll
  for (int mm = 0; mm < kGemvMaxRows; mm++) acc[mm] = 0.f;
  if constexpr (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int k = 4 * lane + 4 * kWarp * i;
#pragma unroll
      for (int mm = 0; mm < kGemvMaxRows; mm++) {
        if (mm >= M) break;
        const float4 u = *reinterpret_cast<const float4*>(u_s + mm * K + k);
        acc[mm] = fmaf(wv[i].x, u.x, acc[mm]);
        acc[mm] = fmaf(wv[i].y, u.y, acc[mm]);
        acc[mm] = fmaf(wv[i].z, u.z, acc[mm]);
        acc[mm] = fmaf(wv[i].w, u.w, acc[mm]);
      }
    }
  } else {
    for (int k = lane; k < K; k += kWarp) {
      const float w = wr[k];
#pragma unroll
      for (int mm = 0; mm < kGemvMaxRows; mm++) {
        if (mm >= M) break;
        acc[mm] = fmaf(w, u_s[mm * K + k], acc[mm]);
      }
    }
  }
#pragma unroll
  for (int mm = 0; mm < kGemvMaxRows; mm++) {
    if (mm >= M) break;
    acc[mm] = warp_sum(acc[mm]);
  }
}

template <int NV>
__global__ void __launch_bounds__(kConvWarps* kWarp)
    decode_conv_kernel(float* y, const bf16* qkv, int64_t ld, const float* hist, const float* wdw,
                       const float* bdw, const float* wg, const float* bg, int M, int C, int d,
                       int t0, int t1) {
  extern __shared__ __align__(16) float u_s[];  // [M, d·t1]
  const int K = d * t1, P = (t0 - 1) + (t1 - 1);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int co = blockIdx.x * kConvWarps + warp;
  const int c0 = (blockIdx.x * kConvWarps / d) * d;
  const float* wr = wg + int64_t(co) * K;
  float4 wv[NV > 0 ? NV : 1];
  conv_row_load<NV>(wv, wr, lane);
  // Before the wait: the depthwise sums' bias and history terms into shared memory. The history
  // was last written by this layer's CCA finish of the step before (its writer completed long
  // before this launch's predecessor started); the weights are never written.
  for (int e = threadIdx.x; e < M * K; e += blockDim.x) {
    const int mm = e / K, k = e % K;
    u_s[e] = conv_depthwise_hist(hist, wdw, bdw, mm, c0 + k / t1, k % t1, t0, P, C);
  }
  pdl_begin(DecodeTraceEvent::CcaConv);                    // qkv comes from the previous kernel
  for (int e = threadIdx.x; e < M * K; e += blockDim.x) {  // each thread its own elements
    const int mm = e / K, k = e % K;
    u_s[e] = conv_depthwise_token(u_s[e], qkv, ld, wdw, mm, c0 + k / t1, k % t1, t0, P);
  }
  __syncthreads();
  float acc[kGemvMaxRows];
  conv_row_sums<NV>(acc, wv, wr, u_s, K, M, lane);
#pragma unroll
  for (int mm = 0; mm < kGemvMaxRows; mm++) {
    if (mm >= M) break;
    if (lane == 0) y[int64_t(mm) * C + co] = bg[co] + acc[mm];
  }
}

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
// reordered by the compiler): the squares of the QK-norm, the head's scale
// a = √d·temp/max(‖v‖, ε), and the rotated pair (x0·c − x1·s, x1·c + x0·s) with x = v·a.
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

__global__ void __launch_bounds__(kQkvThreads)
    decode_qkv_finish_kernel(bf16* q_out, bf16* kcache, bf16* vcache, float* vd_last,
                             const float* conv, const bf16* qkv, int64_t ld, const float* temp,
                             const int32_t* len, int64_t cap, float theta, int r, int Hq, int Hkv,
                             int d, float* hist, int P) {
  extern __shared__ float sh[];
  const int m = blockIdx.y, hh = blockIdx.x;
  const int QD = Hq * d, KD = Hkv * d, C = QD + KD, VH = KD / 2;
  // Before the wait: the length (written at least two launches back, by the step's last launch),
  // the key head's temperature (a weight) and the rotations at this position.
  const int64_t pos = len[m];
  const float temp_h = hh >= Hq && hh < Hq + Hkv ? temp[hh - Hq] : 1.f;
  const RopePre pre = rope_pre(pos, theta, r);
  pdl_begin(DecodeTraceEvent::CcaFinish);
  const bf16* row = qkv + int64_t(m) * ld;
  if (hh >= Hq + Hkv) {
    const int i = (hh - Hq - Hkv) * kQkvThreads + int(threadIdx.x);
    if (i < VH) qkv_finish_value(vcache, vd_last, row, pos, cap, C, KD, m, i);
    if (hist && P > 0 && i < C) conv_hist_advance(hist, row, P, C, m, i);
    return;
  }
  qkv_finish_head(q_out, kcache, conv + int64_t(m) * C + int64_t(hh) * d, row, temp_h, pos, cap,
                  theta, r, Hq, Hkv, d, m, hh, sh, &pre);
}

// Float4 pieces per lane of a grouped-conv weight row (K = d·t1 floats) in the register form of
// decode_conv_kernel, or 0 for its lane-strided loop (other K or unaligned weights).
int conv_nv(int64_t K, const float* wg) {
  const int nv = aligned16(wg) && K % (4 * kWarp) == 0 ? int(K / (4 * kWarp)) : 0;
  return nv == 1 || nv == 2 || nv == 4 ? nv : 0;
}

}  // namespace

void decode_conv(float* y_MC, const bf16* qkv, int64_t ld, const float* hist_BPC,
                 const float* wdw_Ct0, const float* bdw_C, const float* wg_Cdt1, const float* bg_C,
                 int64_t M, int64_t C, int64_t d, int64_t t0, int64_t t1, cudaStream_t st,
                 const DecodePolicy& policy) {
  const int64_t K = d * t1;
  const size_t smem = size_t(M * K) * sizeof(float);
  check(M >= 1 && M <= kGemvMaxRows && d % kConvWarps == 0 && C % d == 0 && t0 >= 1 && t1 >= 1 &&
            (t0 - 1) + (t1 - 1) >= 0 && smem <= 48 * 1024,
        "decode_conv: needs M <= 8, d a multiple of 8 dividing C, and M·d·t1 floats <= 48 KiB");
  const unsigned grid = unsigned(C / kConvWarps);
  const int nv = conv_nv(K, wg_Cdt1);
  const auto kernel = nv == 1   ? decode_conv_kernel<1>
                      : nv == 2 ? decode_conv_kernel<2>
                      : nv == 4 ? decode_conv_kernel<4>
                                : decode_conv_kernel<0>;
  launch_k(kernel, dim3(grid), dim3(kConvWarps * kWarp), smem, st, policy, y_MC, qkv, ld, hist_BPC,
           wdw_Ct0, bdw_C, wg_Cdt1, bg_C, int(M), int(C), int(d), int(t0), int(t1));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_qkv_finish(bf16* q_MHd, bf16* kcache, bf16* vcache, float* vd_last_B, float* hist_BPC,
                       int64_t P, const float* conv_MC, const bf16* qkv, int64_t ld,
                       const float* temp_G, const int32_t* len_B, int64_t cap, float theta,
                       int64_t r, int64_t M, int64_t Hq, int64_t Hkv, int64_t d, cudaStream_t st,
                       const DecodePolicy& policy) {
  check(Hq % Hkv == 0 && r % 2 == 0 && r <= d && (Hkv * d) % 2 == 0,
        "decode_qkv_finish: heads must divide, rotary dim even and <= head dim");
  const int64_t C = (Hq + Hkv) * d, VH = Hkv * d / 2;
  const int64_t X = (std::max(C, VH) + kQkvThreads - 1) / kQkvThreads;
  const size_t smem = size_t(d + 1) * sizeof(float);
  launch_k(decode_qkv_finish_kernel, dim3(unsigned(Hq + Hkv + X), unsigned(M)), dim3(kQkvThreads),
           smem, st, policy, q_MHd, kcache, vcache, vd_last_B, conv_MC, qkv, ld, temp_G, len_B, cap,
           theta, int(r), int(Hq), int(Hkv), int(d), hist_BPC, int(P));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(cca)
