// The CCA convolutions and finish of decode rows (decode_kernels.h: decode_conv,
// decode_qkv_finish, decode_conv_finish): the depthwise and grouped convolutions for one token,
// then mean skip, QK-norm, RoPE, the delayed value and the cache and history writes.
#include "backend/cuda/decode/decode_cca.cuh"

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

// Pieces shared by the two convolution kernels and the fused one below, so that they agree bit
// for bit. u of the depthwise conv for row mm at element k = ci·t1 + j of group c0 (channel
// c0 + ci, position j of the t1 the grouped conv reads): depthwise_at of cca.cu for a one-token
// sequence.
__device__ __forceinline__ float conv_depthwise(const bf16* qkv, int64_t ld, const float* hist,
                                                const float* wdw, const float* bdw, int mm, int c,
                                                int j, int t0, int P, int C) {
  float s = bdw[c];
  for (int jj = 0; jj < t0; jj++) {
    const int pi = j + jj;
    const float xv = pi >= P ? __bfloat162float(qkv[int64_t(mm) * ld + c])
                             : hist[(int64_t(mm) * P + pi) * C + c];
    s = fmaf(wdw[c * t0 + jj], xv, s);
  }
  return s;
}
// The same sum in two parts, in the same order (the same bits): the bias and the history's terms
// (pi = j + jj < P, the earlier tokens, which come first), which need nothing of the current
// token, then the current token's (pi >= P; at most one).
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

// The convolutions and the finish in one launch (DecodeTuning::fuse_cca): block hh < Hq + Hkv
// takes head hh's d channels (c0 = hh·d, one head group) for every row — the weight rows of its
// channels loaded before the wait (kConvFinWarps warps, channel c0 + w + kConvFinWarps·i to warp
// w), the depthwise conv of the group into shared memory, the group's history advanced, the grouped
// conv (conv_row_sums, as decode_conv_kernel) into shared memory, then qkv_finish_head per row; the
// blocks after them write the delayed values. The same bits as decode_conv + decode_qkv_finish.
// Dynamic shared memory: M·d·t1 floats of u, M·d conv outputs, d + 1 floats.
constexpr int kConvFinWarps = 16;
constexpr int kConvFinMaxPerWarp = 8;  // channels per warp: d <= 128

template <int NV>
__global__ void __launch_bounds__(kConvFinWarps* kWarp)
    decode_conv_finish_kernel(bf16* q_out, bf16* kcache, bf16* vcache, float* vd_last, float* hist,
                              const bf16* qkv, int64_t ld, const float* wdw, const float* bdw,
                              const float* wg, const float* bg, const float* temp,
                              const int32_t* len, int64_t cap, float theta, int r, int M, int Hq,
                              int Hkv, int d, int t0, int t1) {
  extern __shared__ __align__(16) float cf_sh[];
  const int K = d * t1, P = (t0 - 1) + (t1 - 1);
  const int QD = Hq * d, KD = Hkv * d, C = QD + KD, VH = KD / 2;
  const int hh = blockIdx.x, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int c0 = hh * d;
  const bool head = hh < Hq + Hkv;
  float4 wv[kConvFinMaxPerWarp][NV > 0 ? NV : 1];
  if (head) {
#pragma unroll
    for (int i = 0; i < kConvFinMaxPerWarp; i++) {
      const int ci = warp + kConvFinWarps * i;
      if (ci < d) conv_row_load<NV>(wv[i], wg + int64_t(c0 + ci) * K, lane);
    }
  }
  pdl_begin(DecodeTraceEvent::CcaFinish);  // qkv, the history, lengths from earlier kernels
  if (!head) {
    const int i = (hh - Hq - Hkv) * int(blockDim.x) + int(threadIdx.x);
    if (i < VH)
      for (int m = 0; m < M; m++)
        qkv_finish_value(vcache, vd_last, qkv + int64_t(m) * ld, len[m], cap, C, KD, m, i);
    return;
  }
  float* u_s = cf_sh;        // [M][K]
  float* y_s = u_s + M * K;  // [M][d]
  float* v = y_s + M * d;    // [d + 1]
  for (int e = threadIdx.x; e < M * K; e += blockDim.x) {
    const int mm = e / K, k = e % K;
    u_s[e] = conv_depthwise(qkv, ld, hist, wdw, bdw, mm, c0 + k / t1, k % t1, t0, P, C);
  }
  __syncthreads();  // every read of this group's history is done: advance it
  if (hist && P > 0)
    for (int e = threadIdx.x; e < M * d; e += blockDim.x)
      conv_hist_advance(hist, qkv + int64_t(e / d) * ld, P, C, e / d, c0 + e % d);
#pragma unroll
  for (int i = 0; i < kConvFinMaxPerWarp; i++) {
    const int ci = warp + kConvFinWarps * i;
    if (ci >= d) break;
    float acc[kGemvMaxRows];
    conv_row_sums<NV>(acc, wv[i], wg + int64_t(c0 + ci) * K, u_s, K, M, lane);
#pragma unroll
    for (int mm = 0; mm < kGemvMaxRows; mm++) {
      if (mm >= M) break;
      if (lane == 0) y_s[mm * d + ci] = bg[c0 + ci] + acc[mm];
    }
  }
  __syncthreads();
  for (int m = 0; m < M; m++)
    qkv_finish_head(q_out, kcache, y_s + m * d, qkv + int64_t(m) * ld,
                    hh >= Hq ? temp[hh - Hq] : 1.f, len[m], cap, theta, r, Hq, Hkv, d, m, hh, v);
}

}  // namespace

namespace {

// Float4 pieces per lane of a grouped-conv weight row (K = d·t1 floats) in the register form of
// decode_conv_kernel, or 0 for its lane-strided loop (other K or unaligned weights). The fused
// kernel takes the same form, so both sum in the same order.
int conv_nv(int64_t K, const float* wg) {
  const int nv = aligned16(wg) && K % (4 * kWarp) == 0 ? int(K / (4 * kWarp)) : 0;
  return nv == 1 || nv == 2 || nv == 4 ? nv : 0;
}

size_t conv_finish_smem(int64_t M, int64_t d, int64_t t1) {
  return size_t(M * d * t1 + M * d + d + 1) * sizeof(float);
}

}  // namespace

bool decode_conv_finish_supported(int64_t M, int64_t Hq, int64_t Hkv, int64_t d, int64_t t0,
                                  int64_t t1, int64_t r, const float* wg) {
  return M >= 1 && M <= kGemvMaxRows && Hkv >= 1 && Hq % Hkv == 0 && d >= 1 &&
         d <= int64_t(kConvFinWarps) * kConvFinMaxPerWarp && t0 >= 1 && t1 >= 1 && r % 2 == 0 &&
         r <= d && (Hkv * d) % 2 == 0 && conv_nv(d * t1, wg) <= 2 &&
         conv_finish_smem(M, d, t1) <= 48 * 1024;
}

void decode_conv_finish(bf16* q_MHd, bf16* kcache, bf16* vcache, float* vd_last_B, float* hist_BPC,
                        int64_t P, const bf16* qkv, int64_t ld, const float* wdw_Ct0,
                        const float* bdw_C, const float* wg_Cdt1, const float* bg_C,
                        const float* temp_G, const int32_t* len_B, int64_t cap, float theta,
                        int64_t r, int64_t M, int64_t Hq, int64_t Hkv, int64_t d, int64_t t0,
                        int64_t t1, cudaStream_t st,
    const DecodePolicy& policy) {
  check(decode_conv_finish_supported(M, Hq, Hkv, d, t0, t1, r, wg_Cdt1) && P == (t0 - 1) + (t1 - 1),
        "decode_conv_finish: needs decode_conv_finish_supported and P = (t0 - 1) + (t1 - 1)");
  const int64_t VH = Hkv * d / 2, threads = int64_t(kConvFinWarps) * kWarp;
  const int64_t X = (VH + threads - 1) / threads;
  const int nv = conv_nv(d * t1, wg_Cdt1);
  const auto kernel = nv == 1   ? decode_conv_finish_kernel<1>
                      : nv == 2 ? decode_conv_finish_kernel<2>
                                : decode_conv_finish_kernel<0>;
  launch_k(kernel, dim3(unsigned(Hq + Hkv + X)), dim3(unsigned(threads)),
           conv_finish_smem(M, d, t1), st, policy, q_MHd, kcache, vcache, vd_last_B, hist_BPC, qkv, ld,
           wdw_Ct0, bdw_C, wg_Cdt1, bg_C, temp_G, len_B, cap, theta, int(r), int(M), int(Hq),
           int(Hkv), int(d), int(t0), int(t1));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

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
  launch_k(kernel, dim3(grid), dim3(kConvWarps * kWarp), smem, st, policy, y_MC, qkv, ld, hist_BPC, wdw_Ct0,
           bdw_C, wg_Cdt1, bg_C, int(M), int(C), int(d), int(t0), int(t1));
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
           smem, st, policy, q_MHd, kcache, vcache, vd_last_B, conv_MC, qkv, ld, temp_G, len_B, cap, theta,
           int(r), int(Hq), int(Hkv), int(d), hist_BPC, int(P));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(cca)
