// The residual norms of decode rows (decode_kernels.h: decode_residual_norm, decode_norm_gemv,
// decode_embed_norm): block per row, the float4 groups in registers, alone, with the GEMV that
// reads it, or with the embedding at the step's start.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// Thread t's float4 groups t + k·256 (k < NV, within D) of a residual norm row, in registers: h ←
// residual_elem(a, hb, hs, h, rb, rs) when has_a, and the thread's sum of squares in element order
// (the norm kernels' arithmetic); then x = (w·h)·rstd rounded to bf16 into dst (and dst2 when set).
template <int NV>
__device__ __forceinline__ float residual_groups(float (&hv)[NV][4], const float (&av)[NV][4],
                                                 const float (&hsv)[NV][4],
                                                 const float (&hbv)[NV][4],
                                                 const float (&rsv)[NV][4],
                                                 const float (&rbv)[NV][4], int64_t D, bool has_a) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; k++) {
    if (4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads) >= D) break;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      if (has_a)
        hv[k][e] = residual_elem(av[k][e], hbv[k][e], hsv[k][e], hv[k][e], rbv[k][e], rsv[k][e]);
      ss = __fmaf_rn(hv[k][e], hv[k][e], ss);
    }
  }
  return ss;
}
template <int NV>
__device__ __forceinline__ void norm_out_groups(const float (&wv)[NV][4], const float (&hv)[NV][4],
                                                float rstd, int64_t D, bf16* dst, bf16* dst2) {
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    float o[4];
#pragma unroll
    for (int e = 0; e < 4; e++) o[e] = __fmul_rn(__fmul_rn(wv[k][e], hv[k][e]), rstd);
    kern::store4(dst + i, o);
    if (dst2) kern::store4(dst2 + i, o);
  }
}
// Thread t's groups of h (NV as above) stored to row.
template <int NV>
__device__ __forceinline__ void store_groups(float* row, const float (&hv)[NV][4], int64_t D) {
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    kern::store4(row + i, hv[k]);
  }
}

// The standalone residual norm (block per row): thread t's float4 groups as in the tails above, but
// every load of the row issued before its first store (the stores to h could alias the inputs as
// far as the compiler knows, which would otherwise serialise the loop); the norm's own weights are
// loaded before pdl_wait.
template <bool kVec>
__global__ void __launch_bounds__(kRowThreads)
    decode_residual_norm_kernel(float* h, bf16* y, const bf16* a, const float* hs, const float* hb,
                                const float* rs, const float* rb, const float* w, float eps,
                                int64_t D, bool early) {
  __shared__ float red[kRowThreads / kWarp];
  const int64_t m = blockIdx.x;
  float* hr = h + m * D;
  float ss = 0.f;
  if constexpr (kVec) {
    using kern::load4;
    float hv[kRowVec][4], wv[kRowVec][4];
    float av[kRowVec][4], hsv[kRowVec][4], hbv[kRowVec][4], rsv[kRowVec][4], rbv[kRowVec][4];
#pragma unroll
    for (int k = 0; k < kRowVec; k++) {
      const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
      if (i >= D) break;
      load4(w + i, wv[k]);
      if (a)
        load4(hs + i, hsv[k]), load4(hb + i, hbv[k]), load4(rs + i, rsv[k]), load4(rb + i, rbv[k]);
    }
    early ? pdl_begin_early(DecodeTraceEvent::Norm) : pdl_begin(DecodeTraceEvent::Norm);
#pragma unroll
    for (int k = 0; k < kRowVec; k++) {
      const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
      if (i >= D) break;
      load4(hr + i, hv[k]);
      if (a) load4(a + m * D + i, av[k]);
    }
    ss = residual_groups<kRowVec>(hv, av, hsv, hbv, rsv, rbv, D, a != nullptr);
    if (a) store_groups<kRowVec>(hr, hv, D);
    norm_out_groups<kRowVec>(wv, hv, norm_rstd(block_sum_rows(ss, red), D, eps), D, y + m * D,
                             nullptr);
  } else {
    early ? pdl_begin_early(DecodeTraceEvent::Norm) : pdl_begin(DecodeTraceEvent::Norm);
    for (int64_t i = threadIdx.x; i < D; i += kRowThreads) {
      const float v =
          a ? residual_elem(__bfloat162float(a[m * D + i]), hb[i], hs[i], hr[i], rb[i], rs[i])
            : hr[i];
      hr[i] = v;
      ss = __fmaf_rn(v, v, ss);
    }
    const float rstd = norm_rstd(block_sum_rows(ss, red), D, eps);
    for (int64_t i = threadIdx.x; i < D; i += kRowThreads)
      y[m * D + i] = __float2bfloat16(__fmul_rn(__fmul_rn(w[i], hr[i]), rstd));
  }
}

// A residual norm and the GEMV that reads it in one launch: block (b, m) computes the whole
// residual norm of row m — the vector layout and arithmetic of decode_residual_norm_kernel<true>
// (the same bits) — into shared memory, then its warps take rows o = b·8 + warp of W (loaded into
// registers before the wait) to out[m, o] = x·W[o] (+ bias[o]) with gemv_bf16_kernel's sums (the
// same bits). NV: the float4 groups per thread (D ≤ 1024·NV), so that only the registers a row
// needs are held; the norm's vectors are hinted to L2 before the wait and loaded with the row
// after it. Block 0 of each row stores h_out (and x to y when set) for the later launches; h_out
// must not alias h_in (the other blocks still read it). The decode step's use: the
// post-attention norm with the router's down-projection sums (out32 = r0, the router then starts
// from them).
template <int NV>
__global__ void __launch_bounds__(kRowThreads)
    decode_norm_gemv_kernel(const float* h_in, float* h_out, bf16* y, const bf16* a,
                            const float* hs, const float* hb, const float* rs, const float* rb,
                            const float* w, float eps, int64_t D, const bf16* W, const float* bias,
                            float* out32, bf16* out16, int64_t ldo, int64_t O, bool early) {
  using kern::load4;
  __shared__ float red[kRowThreads / kWarp];
  extern __shared__ __align__(16) float norm_gemv_sh[];  // x, [D] bf16
  bf16* const xs = reinterpret_cast<bf16*>(norm_gemv_sh);
  const int64_t m = blockIdx.y;
  const bool first = blockIdx.x == 0;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const bool live = o < O;
  const bf16* const wrow = W + (live ? o : 0) * D;
  uint4 wpre[kPreChunks];
  load_row_pieces(wpre, wrow, D, lane, live);
  const float bo = live && bias ? bias[o] : 0.f;
  if (threadIdx.x % 8 == 0)  // 128-byte lines of this thread's groups of the five vectors
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
      if (i >= D) break;
      prefetch_l2(w + i), prefetch_l2(hs + i), prefetch_l2(hb + i), prefetch_l2(rs + i);
      prefetch_l2(rb + i);
    }
  early ? pdl_begin_early(DecodeTraceEvent::Norm) : pdl_begin(DecodeTraceEvent::Norm);
  float hv[NV][4], av[NV][4], wv[NV][4], hsv[NV][4], hbv[NV][4], rsv[NV][4], rbv[NV][4];
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    load4(h_in + m * D + i, hv[k]), load4(a + m * D + i, av[k]);
    load4(w + i, wv[k]), load4(hs + i, hsv[k]), load4(hb + i, hbv[k]);
    load4(rs + i, rsv[k]), load4(rb + i, rbv[k]);
  }
  const float ss = residual_groups<NV>(hv, av, hsv, hbv, rsv, rbv, D, true);
  if (first) store_groups<NV>(h_out + m * D, hv, D);
  norm_out_groups<NV>(wv, hv, norm_rstd(block_sum_rows(ss, red), D, eps), D, xs,
                      first && y ? y + m * D : nullptr);
  __syncthreads();  // x complete in shared memory
  if (live) {
    float acc[1] = {0.f};
    gemv_bf16_row_pre<1>(acc, wpre, xs, 0, wrow, D, lane);
    const float s = warp_sum(acc[0]) + bo;  // as gemv_bf16_kernel and the router's stage 0
    if (lane == 0) {
      if (out32) out32[m * ldo + o] = s;
      if (out16) out16[m * ldo + o] = __float2bfloat16(s);
    }
  }
}

// The decode step's first launch (with fused_step_ends): h = (E[id] + b)⊙s per row
// (embed_affine_fwd; an id outside [0, V) gives a zero row and is recorded in `bad` as there), then
// y = w ⊙ h · rstd (decode_residual_norm_kernel<true> with a = null): the same bits as the two
// launches, with the vectors loaded before the wait.
__global__ void __launch_bounds__(kRowThreads)
    decode_embed_norm_kernel(float* h, bf16* y, const int32_t* ids, const bf16* table,
                             const float* es, const float* eb, int32_t* bad, const float* w,
                             float eps, int64_t D, int64_t V) {
  using kern::load4;
  __shared__ float red[kRowThreads / kWarp];
  const int64_t m = blockIdx.x;
  float sv[kRowVec][4], bv[kRowVec][4], wv[kRowVec][4], hv[kRowVec][4];
#pragma unroll
  for (int k = 0; k < kRowVec; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    load4(es + i, sv[k]), load4(eb + i, bv[k]), load4(w + i, wv[k]);
  }
  pdl_begin(DecodeTraceEvent::Norm);
  const int32_t id = ids[m];
  const bool ok = id >= 0 && int64_t(id) < V;
  if (!ok && threadIdx.x == 0 && bad) kern::record_first_bad(bad, int32_t(m + 1));
  const bf16* er = table + (ok ? int64_t(id) : 0) * D;
#pragma unroll
  for (int k = 0; k < kRowVec; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    load4(er + i, hv[k]);
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kRowVec; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      hv[k][e] = ok ? __fmul_rn(__fadd_rn(hv[k][e], bv[k][e]), sv[k][e]) : 0.f;
      ss = __fmaf_rn(hv[k][e], hv[k][e], ss);
    }
  }
  store_groups<kRowVec>(h + m * D, hv, D);
  norm_out_groups<kRowVec>(wv, hv, norm_rstd(block_sum_rows(ss, red), D, eps), D, y + m * D,
                           nullptr);
}

}  // namespace

void decode_residual_norm(float* h_MD, bf16* y_MD, const bf16* a_MD, const float* hs_D,
                          const float* hb_D, const float* rs_D, const float* rb_D,
                          const float* norm_w_D, float eps, int64_t M, int64_t D, cudaStream_t st,
                          bool early_trigger, const DecodePolicy& policy) {
  const bool vec = residual_norm_vec(D, {h_MD, y_MD, a_MD, hs_D, hb_D, rs_D, rb_D, norm_w_D});
  launch_k(vec ? decode_residual_norm_kernel<true> : decode_residual_norm_kernel<false>,
           dim3(unsigned(M)), dim3(kRowThreads), 0, st, policy, h_MD, y_MD, a_MD, hs_D, hb_D, rs_D,
           rb_D, norm_w_D, eps, D, early_trigger);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

bool decode_norm_gemv_supported(int64_t D, std::initializer_list<const void*> ptrs) {
  return residual_norm_vec(D, ptrs) && D % 8 == 0 && size_t(D) * sizeof(bf16) <= 48 * 1024;
}

void decode_norm_gemv(const float* h_in_MD, float* h_out_MD, bf16* y_MD, const bf16* a_MD,
                      const float* hs_D, const float* hb_D, const float* rs_D, const float* rb_D,
                      const float* norm_w_D, float eps, const bf16* W_OD, const float* bias_O,
                      float* out32, bf16* out16, int64_t ldo, int64_t M, int64_t D, int64_t O,
                      cudaStream_t st, bool early_trigger, const DecodePolicy& policy) {
  check(h_in_MD != h_out_MD, "decode_norm_gemv: the residual goes to another buffer");
  check((out32 == nullptr) != (out16 == nullptr) && ldo >= O && O > 0 && M >= 1,
        "decode_norm_gemv: one output, fp32 or bf16, of at least O columns");
  check(decode_norm_gemv_supported(
            D, {h_in_MD, h_out_MD, y_MD, a_MD, hs_D, hb_D, rs_D, rb_D, norm_w_D, W_OD}),
        "decode_norm_gemv: needs D a multiple of 8 up to 4096 and 16-byte aligned rows");
  const int64_t groups = (D / 4 + kRowThreads - 1) / kRowThreads;
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(M));
  const size_t smem = size_t(D) * sizeof(bf16);
  auto go = [&](auto kernel) {
    launch_k(kernel, grid, dim3(kRowThreads), smem, st, policy, h_in_MD, h_out_MD, y_MD, a_MD, hs_D,
             hb_D, rs_D, rb_D, norm_w_D, eps, D, W_OD, bias_O, out32, out16, ldo, O, early_trigger);
  };
  if (groups <= 1)
    go(decode_norm_gemv_kernel<1>);
  else if (groups <= 2)
    go(decode_norm_gemv_kernel<2>);
  else
    go(decode_norm_gemv_kernel<4>);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

bool decode_embed_norm_supported(int64_t D, std::initializer_list<const void*> ptrs) {
  return residual_norm_vec(D, ptrs);
}

void decode_embed_norm(float* h_MD, bf16* y_MD, const int32_t* ids_M, const bf16* table_VD,
                       const float* s_D, const float* b_D, int32_t* bad_id_flag,
                       const float* norm_w_D, float eps, int64_t M, int64_t D, int64_t V,
                       cudaStream_t st, const DecodePolicy& policy) {
  check(M >= 1 && decode_embed_norm_supported(D, {h_MD, y_MD, table_VD, s_D, b_D, norm_w_D}),
        "decode_embed_norm: needs D a multiple of 4 up to 4096 and 16-byte aligned rows");
  launch_k(decode_embed_norm_kernel, dim3(unsigned(M)), dim3(kRowThreads), 0, st, policy, h_MD,
           y_MD, ids_M, table_VD, s_D, b_D, bad_id_flag, norm_w_D, eps, D, V);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(norms)
