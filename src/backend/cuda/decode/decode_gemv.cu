// The decode GEMVs (decode_kernels.h): warp-per-output-row matrix-vector products that stream each
// bf16 (or fp32) weight row once for all M <= 8 rows, their register prologue before the
// programmatic-dependency wait and the input rows staged in shared memory.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// Warp per output row. kPre: the row's first kPreChunks pieces are loaded before pdl_wait (the
// weights are the only input independent of the previous kernel), so at the start of a layer the
// weight stream overlaps the previous kernel's tail. kStageX: the M input rows are copied into
// shared memory once per block after the wait and read there (a template choice, so the default
// kernels carry none of its code or registers).
template <int M, bool kVec, bool kPre, bool kStageX = false>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    gemv_bf16_kernel(float* y32, bf16* y16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                     int64_t ldw, const float* bias, int64_t O, int64_t K, bool early) {
  static_assert(kVec || !kPre, "the register prologue takes the 16-byte path");
  const int lane = threadIdx.x % kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const bool live = o < O;
  const bf16* w = W + (live ? o : 0) * ldw;
  uint4 wpre[kPreChunks];
  if constexpr (kPre) load_row_pieces(wpre, w, K, lane, live);
  extern __shared__ __align__(16) float gemv_x_sh[];  // kStageX: [M][K] bf16
  early ? pdl_begin_early(DecodeTraceEvent::Gemv) : pdl_begin(DecodeTraceEvent::Gemv);
  if constexpr (kStageX) {
    static_assert(kVec, "staged input rows take the 16-byte path");
    x = stage_rows<M>(x, ldx, K, gemv_x_sh), ldx = K;  // [M][K]
  }
  if (live) {
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.f;
    if constexpr (kPre)
      gemv_bf16_row_pre<M>(acc, wpre, x, ldx, w, K, lane);
    else
      gemv_bf16_row<M, kVec>(acc, x, ldx, w, K, lane);
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float s = warp_sum(acc[m]) + (bias ? bias[o] : 0.f);
      if (lane == 0) {
        if (y32) y32[m * ldy + o] = s;
        if (y16) y16[m * ldy + o] = __float2bfloat16(s);
      }
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
                      int64_t ldw, const float* bias, int64_t O, int64_t K, cudaStream_t st,
                      bool early, bool stage_x, const DecodePolicy& policy) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kRowsPerBlock * kWarp);
  const bool vec = K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && aligned16(x) && aligned16(W);
  // Staged input rows only where they fit the default 48 KB of dynamic shared memory.
  const size_t xs_bytes = size_t(M) * size_t(K) * sizeof(bf16);
  const bool stage = stage_x && vec && xs_bytes <= 48 * 1024;
  const bool pre = vec && O <= kPreMaxRows;
#define ZAYA_GEMV_LAUNCH(V, P)                                                                    \
  (stage ? launch_k(gemv_bf16_kernel<M, V, P, V>, grid, block, xs_bytes, st, policy, y32, y16,    \
                    ldy, x, ldx, W, ldw, bias, O, K, early)                                       \
         : launch_k(gemv_bf16_kernel<M, V, P>, grid, block, 0, st, policy, y32, y16, ldy, x, ldx, \
                    W, ldw, bias, O, K, early))
  if (pre)
    ZAYA_GEMV_LAUNCH(true, true);
  else if (vec)
    ZAYA_GEMV_LAUNCH(true, false);
  else
    ZAYA_GEMV_LAUNCH(false, false);
#undef ZAYA_GEMV_LAUNCH
}

template <int M>
void launch_gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                     int64_t ldw, const float* bias, int64_t O, int64_t K, cudaStream_t st,
                     const DecodePolicy& policy) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kRowsPerBlock * kWarp);
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && aligned16(x) && aligned16(W);
  if (vec)
    launch_k(gemv_f32_kernel<M, true>, grid, block, 0, st, policy, y, ldy, x, ldx, W, ldw, bias, O,
             K);
  else
    launch_k(gemv_f32_kernel<M, false>, grid, block, 0, st, policy, y, ldy, x, ldx, W, ldw, bias, O,
             K);
}

}  // namespace

void gemv_bf16(float* y_f32, bf16* y_bf16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
               int64_t ldw, const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st,
               bool early_trigger, bool stage_x, const DecodePolicy& policy) {
  check(M >= 1 && M <= kGemvMaxRows && O > 0 && K > 0 && ldw >= K && ldx >= K && ldy >= O,
        "gemv_bf16: need 1 <= M <= 8, O, K > 0, ldw, ldx >= K, ldy >= O");
  with_rows(M, [&](auto n) {
    launch_gemv_bf16<decltype(n)::value>(y_f32, y_bf16, ldy, x, ldx, W, ldw, bias, O, K, st,
                                         early_trigger, stage_x, policy);
  });
  ZAYA_CUDA_CHECK(cudaGetLastError());
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
