// The experts of decode rows (decode_kernels.h, decode_experts): the SwiGLU and down products of
// each row's chosen expert, picked on the device from the router's choice, in two launches.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// The experts of decode rows, in two launches per layer. Row m uses expert e = choice[m]
// (e >= E: the skip class, no expert runs). First act[m,i] = silu(x·Wgu_e[i]) · (x·Wgu_e[I+i]) from
// the packed gate|up rows, both dot products in fp32 in one warp; then
// out[m,o] = gate[m] · (act[m]·Wd_e[o]), or gate[m]·x[m,o] (scaled-input skip) or 0 for skips.
// The SwiGLU kernel reads the router's choice, its predecessor's output, so nothing precedes its
// pdl_wait; the down kernel, one launch later, loads its expert's weights before its own.
// kStage (with kVec): the block copies its row of x (K bf16) into shared memory once, beside the
// choice's load, and every warp reads it there instead of each requesting the same lines from
// L1/L2 (gemv_bf16's stage_x); the same sums.
template <bool kVec, bool kStage = false>
__global__ void expert_swiglu_kernel(bf16* act, const bf16* x, int64_t ldx, const bf16* Wgu,
                                     int64_t gu_stride, const int32_t* choice, int64_t E, int64_t I,
                                     int64_t K) {
  static_assert(!kStage || kVec, "the staged row takes the 16-byte path");
  pdl_begin(DecodeTraceEvent::ExpertSwiglu);
  const int lane = threadIdx.x % kWarp;
  const int64_t m = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  // kStage: the choice's load is issued first, so that it and the row's copy take one round trip.
  const int32_t ce = kStage ? choice[m] : 0;
  const bf16* xrow = x + m * ldx;  // kStage: its copy in shared memory
  if constexpr (kStage) {
    extern __shared__ __align__(16) float expert_x_sh[];
    xrow = stage_rows(xrow, 0, K, expert_x_sh);
  }
  if (i >= I) return;
  const int64_t e = kStage ? ce : choice[m];
  if (e < 0 || e >= E) {
    if (lane == 0) act[m * I + i] = __float2bfloat16(0.f);
    trace_mark(trace_ptr(), DecodeTraceEvent::ExpertActDone);
    return;
  }
  const bf16* W = Wgu + e * gu_stride;
  float g[1] = {0.f}, u[1] = {0.f};
  if constexpr (kVec) {  // both rows' loads in flight together
    uint4 wg[kPreChunks], wu[kPreChunks];
    load_row_pieces(wg, W + i * K, K, lane);
    load_row_pieces(wu, W + (I + i) * K, K, lane);
    gemv_bf16_row_pre<1>(g, wg, xrow, ldx, W + i * K, K, lane);
    gemv_bf16_row_pre<1>(u, wu, xrow, ldx, W + (I + i) * K, K, lane);
  } else {
    gemv_bf16_row<1, kVec>(g, xrow, ldx, W + i * K, K, lane);
    gemv_bf16_row<1, kVec>(u, xrow, ldx, W + (I + i) * K, K, lane);
  }
  const float gs = warp_sum(g[0]), us = warp_sum(u[0]);
  if (lane == 0) act[m * I + i] = __float2bfloat16(gs / (1.0f + expf(-gs)) * us);
  trace_mark(trace_ptr(), DecodeTraceEvent::ExpertActDone);  // block (0, 0, 0), its warp 0
}

// kStage (with kVec): the block copies its row of act (I bf16) into shared memory once after the
// wait, and every warp reads it there; the same sums. kRows: output rows (warps) per block, other
// than 8 with kStage only.
template <bool kVec, bool kStage = false, int kRows = kRowsPerBlock>
__global__ void __launch_bounds__(kRows* kWarp)
    expert_down_combine_kernel(bf16* out, const bf16* act, const bf16* x, const bf16* Wd,
                               int64_t d_stride, const float* gate, const int32_t* choice,
                               int64_t E, bool scaled, int64_t D, int64_t I) {
  static_assert(!kStage || kVec, "the staged row takes the register prologue");
  static_assert(kRows == kRowsPerBlock || kStage, "other block sizes: staged only");
  const int lane = threadIdx.x % kWarp;
  const int64_t m = blockIdx.y;
  const int64_t o = int64_t(blockIdx.x) * kRows + threadIdx.x / kWarp;
  // The choice comes from the router, which completed before the SwiGLU kernel (this kernel's
  // predecessor) passed its own pdl_wait, and so before this grid could start: it is final here,
  // and the expert's weight row is loaded before pdl_wait, behind the SwiGLU kernel (read through
  // L2: the same buffer held the previous layer's choice). The router's gate, written with the
  // choice, is final too and is loaded here rather than after the sums.
  const int64_t e = __ldcg(choice + m);
  const float gm = __ldcg(gate + m);
  const bool expert = o < D && e >= 0 && e < E;
  const bf16* w = Wd + (expert ? e * d_stride + o * I : 0);
  uint4 wpre[kPreChunks];
  if constexpr (kVec) load_row_pieces(wpre, w, I, lane, expert);
  pdl_begin(DecodeTraceEvent::ExpertDown);
  const bf16* arow = act + m * I;  // kStage: its copy in shared memory
  if constexpr (kStage) {
    extern __shared__ __align__(16) float expert_act_sh[];
    arow = stage_rows(arow, 0, I, expert_act_sh);
  }
  if (o < D) {
    if (!expert) {
      if (lane == 0)
        out[m * D + o] = __float2bfloat16(scaled ? gm * __bfloat162float(x[m * D + o]) : 0.f);
    } else {
      float acc[1] = {0.f};
      if constexpr (kVec)
        gemv_bf16_row_pre<1>(acc, wpre, arow, I, w, I, lane);
      else
        gemv_bf16_row<1, kVec>(acc, arow, I, w, I, lane);
      const float s = warp_sum(acc[0]);
      if (lane == 0) out[m * D + o] = __float2bfloat16(gm * s);
    }
  }
}

}  // namespace

void decode_experts(bf16* out_MD, bf16* act_MI, const bf16* x_MD, const bf16* gate_up_E2ID,
                    const bf16* down_EDI, const float* gate_M, const int32_t* choice_M, int64_t E,
                    bool skip_scaled_input, int64_t M, int64_t D, int64_t I, cudaStream_t st,
                    bool stage_x, int down_rows, const DecodePolicy& policy) {
  check(M >= 1 && D > 0 && I > 0, "decode_experts: bad sizes");
  check(down_rows == 8 || down_rows == 4 || down_rows == 2,
        "decode_experts: rows per down block must be 8, 4 or 2");
  const bool vec = D % 8 == 0 && I % 8 == 0 && aligned16(x_MD) && aligned16(gate_up_E2ID) &&
                   aligned16(down_EDI) && aligned16(act_MI);
  const dim3 g1{unsigned((I + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(M)};
  const dim3 g2{unsigned((D + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(M)};
  const dim3 block(kRowsPerBlock * kWarp);
  // stage_x: the 16-byte forms only, with each row within 48 KB of shared memory.
  const bool stage = stage_x && vec && std::max(D, I) * int64_t(sizeof(bf16)) <= 48 * 1024;
  if (stage) {
    launch_k(expert_swiglu_kernel<true, true>, g1, block, size_t(D) * sizeof(bf16), st, policy,
             act_MI, x_MD, D, gate_up_E2ID, 2 * I * D, choice_M, E, I, D);
    const auto down_k = down_rows == 2   ? expert_down_combine_kernel<true, true, 2>
                        : down_rows == 4 ? expert_down_combine_kernel<true, true, 4>
                                         : expert_down_combine_kernel<true, true>;
    const dim3 g2r{unsigned((D + down_rows - 1) / down_rows), unsigned(M)};
    launch_k(down_k, g2r, dim3(down_rows * kWarp), size_t(I) * sizeof(bf16), st, policy, out_MD,
             act_MI, x_MD, down_EDI, D * I, gate_M, choice_M, E, skip_scaled_input, D, I);
    ZAYA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const auto down = vec ? expert_down_combine_kernel<true> : expert_down_combine_kernel<false>;
  const auto swiglu = vec ? expert_swiglu_kernel<true> : expert_swiglu_kernel<false>;
  launch_k(swiglu, g1, block, 0, st, policy, act_MI, x_MD, D, gate_up_E2ID, 2 * I * D, choice_M, E,
           I, D);
  launch_k(down, g2, block, 0, st, policy, out_MD, act_MI, x_MD, down_EDI, D * I, gate_M, choice_M,
           E, skip_scaled_input, D, I);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(experts)
