// The decode GEMVs (decode_kernels.h): warp-per-output-row matrix-vector products that stream each
// bf16 (or fp32) weight row once for all M <= 8 rows, their register prologue before the
// programmatic-dependency wait, the fused residual-norm tail and the norm computed at the start.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// Warp per output row. kPre: the row's first kPreChunks pieces are loaded before pdl_wait (the
// weights are the only input independent of the previous kernel), so at the start of a layer the
// weight stream overlaps the previous kernel's tail. kTail: the block that finishes last also runs
// the residual norm of all M rows over y16 (the o projection followed by the post-attention
// residual + norm, in one launch).
// kNormIn: x is the residual norm nin (D = K), computed by every block at its start into shared
// memory (dynamic: the norm's vectors, then M·K bf16 of x); block 0 stores the new residual rows.
// kStageX: the M input rows are copied into shared memory once per block after the wait and read
// there (a template choice, so the default kernels carry none of its code or registers).
template <int M, bool kVec, bool kPre, bool kTail, bool kNormIn = false, bool kStageX = false,
          bool kEF = false>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    gemv_bf16_kernel(float* y32, bf16* y16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                     int64_t ldw, const float* bias, int64_t O, int64_t K, TailNorm tn,
                     DecodeNormIn nin, bool early) {
  static_assert(kVec || !kPre, "the register prologue takes the 16-byte path");
  const int lane = threadIdx.x % kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const bool live = o < O;
  const bf16* w = W + (live ? o : 0) * ldw;
  uint4 wpre[kPreChunks];
  if constexpr (kPre) load_row_pieces<kEF>(wpre, w, K, lane, live);
  extern __shared__ __align__(16) float gemv_norm_sh[];  // kNormIn: [5][K] floats, [M][K] bf16
  if constexpr (kNormIn) norm_in_stage(nin, K, gemv_norm_sh);
  early ? pdl_begin_early(DecodeTraceEvent::Gemv) : pdl_begin(DecodeTraceEvent::Gemv);
  if constexpr (kNormIn) {
    __shared__ float nred[kRowThreads / kWarp];
    bf16* xs = reinterpret_cast<bf16*>(gemv_norm_sh + kNormInVecs * K);
    for (int m = 0; m < M; m++)
      norm_in_row(nin, m, K, gemv_norm_sh, xs + m * K, blockIdx.x == 0, nred);
    x = xs, ldx = K;
  } else if constexpr (kStageX) {
    static_assert(kVec, "staged input rows take the 16-byte path");
    x = stage_rows<M>(x, ldx, K, gemv_norm_sh), ldx = K;  // [M][K]
  }
  if (live) {
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.f;
    if constexpr (kPre)
      gemv_bf16_row_pre<M, kEF>(acc, wpre, x, ldx, w, K, lane);
    else
      gemv_bf16_row<M, kVec, kEF>(acc, x, ldx, w, K, lane);
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float s = warp_sum(acc[m]) + (bias ? bias[o] : 0.f);
      if (lane == 0) {
        if (y32) y32[m * ldy + o] = s;
        if (y16) y16[m * ldy + o] = __float2bfloat16(s);
      }
    }
  }
  if constexpr (kTail) {
    __shared__ float red[kRowThreads / kWarp];
    if (!last_block_done(tn.counters, gridDim.x)) return;
    for (int m = 0; m < M; m++) {
      if (tn.vec)
        tail_residual_norm_row<true>(tn, y16, m, O, red);
      else
        tail_residual_norm_row<false>(tn, y16, m, O, red);
      __syncthreads();  // red is reused by the next row
    }
  }
}

template <int M, bool kVec>
__global__ void gemv_f32_kernel(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                                int64_t ldw, const float* bias, int64_t O, int64_t K) {
  pdl_begin(DecodeTraceEvent::GemvF32);
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


// Rows up to which the GEMV loads its weights into registers before pdl_wait: grids of about one
// wave (the o, qkv and router-sized products); the LM head's many waves keep the leaner kernel.
constexpr int64_t kPreMaxRows = 16384;

template <int M>
void launch_gemv_bf16(float* y32, bf16* y16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                      int64_t ldw, const float* bias, int64_t O, int64_t K, const TailNorm& tn,
                      cudaStream_t st, bool early, bool stage_x,
    const DecodePolicy& policy) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kRowsPerBlock * kWarp);
  const bool vec = K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && aligned16(x) && aligned16(W);
  // Staged input rows only where they fit the default 48 KB of dynamic shared memory.
  const size_t xs_bytes = size_t(M) * size_t(K) * sizeof(bf16);
  const bool stage = stage_x && vec && xs_bytes <= 48 * 1024;
  const bool pre = vec && O <= kPreMaxRows;
  const bool tail = tn.counters != nullptr;
#define ZAYA_GEMV_LAUNCH(V, P, T)                                                                \
  (stage ? launch_k(gemv_bf16_kernel<M, V, P, T, false, V>, grid, block, xs_bytes, st, policy, y32, y16, \
                    ldy, x, ldx, W, ldw, bias, O, K, tn, DecodeNormIn{}, early)                  \
         : launch_k(gemv_bf16_kernel<M, V, P, T>, grid, block, 0, st, policy, y32, y16, ldy, x, ldx, W,  \
                    ldw, bias, O, K, tn, DecodeNormIn{}, early))
  if (tail) {
    if (pre)
      ZAYA_GEMV_LAUNCH(true, true, true);
    else if (vec)
      ZAYA_GEMV_LAUNCH(true, false, true);
    else
      ZAYA_GEMV_LAUNCH(false, false, true);
  } else {
    if (pre)
      ZAYA_GEMV_LAUNCH(true, true, false);
    else if (vec)
      ZAYA_GEMV_LAUNCH(true, false, false);
    else
      ZAYA_GEMV_LAUNCH(false, false, false);
  }
#undef ZAYA_GEMV_LAUNCH
}

size_t norm_in_smem(int64_t M, int64_t D) {
  return size_t(kNormInVecs * D) * sizeof(float) + size_t(M * D) * sizeof(bf16);
}

template <int M>
void launch_gemv_bf16_norm_in(bf16* y16, int64_t ldy, const bf16* W, int64_t ldw, int64_t O,
                              int64_t K, const DecodeNormIn& n, cudaStream_t st,
    const DecodePolicy& policy) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const auto kernel = gemv_bf16_kernel<M, true, true, false, true>;
  const size_t smem = norm_in_smem(M, K);
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch_k(kernel, grid, dim3(kRowsPerBlock * kWarp), smem, st, policy, nullptr, y16, ldy, nullptr, K, W,
           ldw, nullptr, O, K, TailNorm{}, n, false);
}

template <int M>
void launch_gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                     int64_t ldw, const float* bias, int64_t O, int64_t K, cudaStream_t st,
    const DecodePolicy& policy) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kRowsPerBlock * kWarp);
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && aligned16(x) && aligned16(W);
  if (vec)
    launch_k(gemv_f32_kernel<M, true>, grid, block, 0, st, policy, y, ldy, x, ldx, W, ldw, bias, O, K);
  else
    launch_k(gemv_f32_kernel<M, false>, grid, block, 0, st, policy, y, ldy, x, ldx, W, ldw, bias, O, K);
}

void gemv_bf16_any(float* y_f32, bf16* y_bf16, int64_t ldy, const bf16* x, int64_t ldx,
                   const bf16* W, int64_t ldw, const float* bias, int64_t M, int64_t O, int64_t K,
                   const TailNorm& tn, cudaStream_t st, bool early, bool stage_x,
                   const DecodePolicy& policy) {
  check(M >= 1 && M <= kGemvMaxRows && O > 0 && K > 0 && ldw >= K && ldx >= K && ldy >= O,
        "gemv_bf16: need 1 <= M <= 8, O, K > 0, ldw, ldx >= K, ldy >= O");
  with_rows(M, [&](auto n) {
    launch_gemv_bf16<decltype(n)::value>(y_f32, y_bf16, ldy, x, ldx, W, ldw, bias, O, K, tn, st,
                                         early, stage_x, policy);
  });
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void gemv_bf16(float* y_f32, bf16* y_bf16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
               int64_t ldw, const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st,
               bool early_trigger, bool stage_x,
    const DecodePolicy& policy) {
  gemv_bf16_any(y_f32, y_bf16, ldy, x, ldx, W, ldw, bias, M, O, K, TailNorm{}, st, early_trigger,
                stage_x, policy);
}

bool decode_norm_in_supported(const DecodeNormIn& n, int64_t M, int64_t D) {
  return M >= 1 && M <= kGemvMaxRows && D % 8 == 0 && D <= 4 * kRowVec * kRowThreads &&
         norm_in_smem(M, D) <= 144 * 1024 && n.h_in && n.h_out && n.a && n.hs && n.hb && n.rs &&
         n.rb && n.norm_w && n.h_in != n.h_out &&
         kern::vec4_ok(D, {n.h_in, n.h_out, n.a, n.hs, n.hb, n.rs, n.rb, n.norm_w, n.x_out});
}

void gemv_bf16_norm_in(bf16* y_bf16, int64_t ldy, const bf16* W, int64_t ldw, int64_t M, int64_t O,
                       int64_t K, const DecodeNormIn& n, cudaStream_t st,
    const DecodePolicy& policy) {
  check(decode_norm_in_supported(n, M, K) && y_bf16 && O > 0 && ldw >= K && ldy >= O &&
            ldw % 8 == 0 && aligned16(W),
        "gemv_bf16_norm_in: needs decode_norm_in_supported(n, M, K) and 16-byte aligned W rows");
  with_rows(M, [&](auto r) {
    launch_gemv_bf16_norm_in<decltype(r)::value>(y_bf16, ldy, W, ldw, O, K, n, st, policy);
  });
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void gemv_bf16_residual_norm(bf16* a_MO, const bf16* x, int64_t ldx, const bf16* W, int64_t ldw,
                             int64_t M, int64_t O, int64_t K, const DecodeResidualNorm& rn,
                             cudaStream_t st,
    const DecodePolicy& policy) {
  check(a_MO != nullptr, "gemv_bf16_residual_norm: needs the bf16 output");
  gemv_bf16_any(nullptr, a_MO, O, x, ldx, W, ldw, nullptr, M, O, K, tail_norm(&rn, a_MO, O), st,
                false, false, policy);
}

void gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W, int64_t ldw,
              const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st,
    const DecodePolicy& policy) {
  check(M >= 1 && M <= kGemvMaxRows && O > 0 && K > 0 && ldw >= K && ldx >= K && ldy >= O,
        "gemv_f32: need 1 <= M <= 8, O, K > 0, ldw, ldx >= K, ldy >= O");
  with_rows(M, [&](auto n) {
    launch_gemv_f32<decltype(n)::value>(y, ldy, x, ldx, W, ldw, bias, O, K, st, policy);
  });
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(gemv)
