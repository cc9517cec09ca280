// The experts of decode rows (decode_kernels.h, decode_experts): the SwiGLU and down products of
// each row's chosen expert, picked on the device from the router's choice, in two launches or one
// with a grid barrier, with the optional fused post-MLP residual norm.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// The experts of decode rows, in two launches per layer. Row m uses expert e = choice[m]
// (e >= E: the skip class, no expert runs). First act[m,i] = silu(x·Wgu_e[i]) · (x·Wgu_e[I+i]) from
// the packed gate|up rows, both dot products in fp32 in one warp; then
// out[m,o] = gate[m] · (act[m]·Wd_e[o]), or gate[m]·x[m,o] (scaled-input skip) or 0 for skips.
// The SwiGLU kernel reads the router's choice, its predecessor's output, so nothing precedes its
// pdl_wait; the down kernel, one launch later, loads its expert's weights before its own.
// kPreDown (with kVec; DecodeTuning::expert_down_l2): once the choice is known, each warp also
// hints its share of the expert's down rows (Wd, [E, D, I], rows i, i + I, ... < D) towards L2
// after issuing its own loads, so that the down launch's blocks that cannot be resident beside this
// one (registers) find their rows in L2 when they start. A hint: the values are the same.
// kStage (with kVec; DecodeTuning::expert_stage_x): the block copies its row of x (K bf16) into
// shared memory once, beside the choice's load, and every warp reads it there instead of each
// requesting the same lines from L1/L2 (gemv_bf16's stage_x); the same sums.
template <bool kVec, bool kEF = false, bool kPreDown = false, bool kStage = false>
__global__ void expert_swiglu_kernel(bf16* act, const bf16* x, int64_t ldx, const bf16* Wgu,
                                     int64_t gu_stride, const int32_t* choice, int64_t E, int64_t I,
                                     int64_t K, const bf16* Wd, int64_t d_stride, int64_t D) {
  static_assert(!kPreDown || kVec, "the down-row hints ride with the 16-byte path");
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
    load_row_pieces<kEF>(wg, W + i * K, K, lane);
    load_row_pieces<kEF>(wu, W + (I + i) * K, K, lane);
    if constexpr (kPreDown)  // 128-byte lines of down rows i, i + I, ... of expert e
      for (int64_t o = i; o < D; o += I)
        for (int64_t k = int64_t(lane) * 64; k < I; k += int64_t(kWarp) * 64)
          prefetch_l2(Wd + e * d_stride + o * I + k);
    gemv_bf16_row_pre<1, kEF>(g, wg, xrow, ldx, W + i * K, K, lane);
    gemv_bf16_row_pre<1, kEF>(u, wu, xrow, ldx, W + (I + i) * K, K, lane);
  } else {
    gemv_bf16_row<1, kVec>(g, xrow, ldx, W + i * K, K, lane);
    gemv_bf16_row<1, kVec>(u, xrow, ldx, W + (I + i) * K, K, lane);
  }
  const float gs = warp_sum(g[0]), us = warp_sum(u[0]);
  if (lane == 0) act[m * I + i] = __float2bfloat16(gs / (1.0f + expf(-gs)) * us);
  trace_mark(trace_ptr(), DecodeTraceEvent::ExpertActDone);  // block (0, 0, 0), its warp 0
}

// kTail: the block of row m that finishes last (counter tn.counters[m]) runs the post-MLP residual
// norm of row m over out (the expert combine followed by residual + norm, in one launch).
// kSmem (with kVec; DecodeTuning::expert_down_smem): the prologue copies each lane's first
// kPreChunks pieces of its weight row into shared memory with cp.async instead of loading them
// into registers, so that a block holds ~30 registers a thread instead of ~50 and the whole launch
// can be resident beside the SwiGLU launch it follows (whose 82 registers a thread leave room for
// about one more 50-register block per SM): every down row streams while the SwiGLU runs. After the
// wait each lane moves its own pieces into registers (the same pieces, the same sums). Measured
// slower on the H200 (DecodeTuning::expert_down_smem), so off.
// kStage (with kVec; DecodeTuning::expert_stage_x): the block copies its row of act (I bf16) into
// shared memory once after the wait, and every warp reads it there; the same sums.
// kRows: output rows (warps) per block; DecodeTuning::expert_down_rows with kStage.
template <bool kVec, bool kTail, bool kEF = false, bool kSmem = false, bool kStage = false,
          int kRows = kRowsPerBlock>
__global__ void __launch_bounds__(kRows* kWarp)
    expert_down_combine_kernel(bf16* out, const bf16* act, const bf16* x, const bf16* Wd,
                               int64_t d_stride, const float* gate, const int32_t* choice,
                               int64_t E, bool scaled, int64_t D, int64_t I, TailNorm tn) {
  static_assert(!kSmem || (kVec && !kEF), "the shared-memory prologue is the 16-byte path's");
  static_assert(!kStage || (kVec && !kSmem), "the staged row takes the register prologue");
  static_assert(kRows == kRowsPerBlock || (kStage && !kTail), "other block sizes: staged only");
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
  if constexpr (kSmem) {
    // [warp][piece][lane]: a warp's 16-byte pieces of one piece index are 512 contiguous bytes.
    __shared__ uint4 wsh[kRowsPerBlock][kPreChunks][kWarp];
    const int warp = threadIdx.x / kWarp;
#pragma unroll
    for (int c = 0; c < kPreChunks; c++) {
      const int64_t k = int64_t(lane) * 8 + int64_t(c) * kWarp * 8;
      if (expert && k < I) cp_async16(&wsh[warp][c][lane], w + k);
    }
    pdl_begin(DecodeTraceEvent::ExpertDown);
    cp_async_wait_all();  // this lane's own copies: visible to it without a barrier
#pragma unroll
    for (int c = 0; c < kPreChunks; c++) {
      const int64_t k = int64_t(lane) * 8 + int64_t(c) * kWarp * 8;
      wpre[c] = expert && k < I ? wsh[warp][c][lane] : make_uint4(0, 0, 0, 0);
    }
  } else {
    if constexpr (kVec) load_row_pieces<kEF>(wpre, w, I, lane, expert);
    pdl_begin(DecodeTraceEvent::ExpertDown);
  }
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
        gemv_bf16_row_pre<1, kEF>(acc, wpre, arow, I, w, I, lane);
      else
        gemv_bf16_row<1, kVec>(acc, arow, I, w, I, lane);
      const float s = warp_sum(acc[0]);
      if (lane == 0) out[m * D + o] = __float2bfloat16(gm * s);
    }
  }
  if constexpr (kTail) {
    __shared__ float red[kRowThreads / kWarp];
    if (!last_block_done(tn.counters + m, gridDim.x)) return;
    if (tn.vec)
      tail_residual_norm_row<true>(tn, out, m, D, red);
    else
      tail_residual_norm_row<false>(tn, out, m, D, red);
  }
}

// A barrier across every block of a launch whose blocks are all resident at once (the launcher
// sizes the grid by the occupancy calculator). `bar` is a zero-filled word: each block adds 1
// except block 0, which adds 2^31 − (blocks − 1), so the word's top bit flips exactly when the
// last block arrives and its low 31 bits return to zero — the next launch (any grid size) needs no
// reset. Stores before the barrier are visible to loads after it that go through L2 (__ldcg).
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned nb = gridDim.x * gridDim.y * gridDim.z;
    const bool first = (blockIdx.x | blockIdx.y | blockIdx.z) == 0;
    __threadfence();
    const unsigned old = atomicAdd(bar, first ? 0x80000000u - (nb - 1u) : 1u);
    while (((old ^ ld_acquire_gpu(bar)) & 0x80000000u) == 0u) {
    }
    __threadfence();
  }
  __syncthreads();
}

// Both expert products in one launch (DecodeTuning::fuse_experts): every warp issues the loads of
// its SwiGLU rows (gate and up) and of its first down-projection row right after the wait — the
// router's choice is only known then — so the down rows stream beside the SwiGLU rows instead of
// after the first launch completes; a grid barrier separates the two products, and each block
// then copies act (M·I bf16, through L2) into shared memory. The grid is at most what the device
// holds at once (the barrier needs every block resident); warps take rows in a grid-stride loop,
// tasks (m, i) of the SwiGLU product and (m, o) of the down projection. The arithmetic per row is
// that of expert_swiglu_kernel and expert_down_combine_kernel (the same bits). The 16-byte path
// only (decode_experts checks).
constexpr int kExpertFusedMinBlocks = 2;  // per SM: at most 128 registers a thread

__global__ void __launch_bounds__(kRowsPerBlock* kWarp, kExpertFusedMinBlocks)
    expert_fused_kernel(bf16* out, bf16* act, const bf16* x, int64_t ldx, const bf16* Wgu,
                        int64_t gu_stride, const bf16* Wd, int64_t d_stride, const float* gate,
                        const int32_t* choice, int64_t E, bool scaled, int M, int64_t D, int64_t I,
                        unsigned* bar) {
  extern __shared__ __align__(16) float expert_fused_sh[];  // act, [M][I] bf16
  bf16* act_s = reinterpret_cast<bf16*>(expert_fused_sh);
  pdl_begin(DecodeTraceEvent::ExpertSwiglu);
  const int lane = threadIdx.x % kWarp;
  // Index arithmetic in 32 bits (M·I and M·D are far below 2^31; decode_experts checks).
  const int warps = int(gridDim.x) * kRowsPerBlock;
  const int w0 = int(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarp;
  const int Di = int(D), Ii = int(I), n1 = M * Ii, n2 = M * Di;
  // This warp's first down row, loaded with the SwiGLU rows.
  uint4 wd[kPreChunks];
  {
    const int m = w0 < n2 ? w0 / Di : 0, o = w0 < n2 ? w0 % Di : 0;
    const int64_t e = choice[m];
    const bool expert = w0 < n2 && e >= 0 && e < E;
    load_row_pieces(wd, Wd + (expert ? e * d_stride + int64_t(o) * I : 0), I, lane, expert);
  }
  for (int t = w0; t < n1; t += warps) {
    const int m = t / Ii, i = t % Ii;
    const int64_t e = choice[m];
    if (e < 0 || e >= E) {
      if (lane == 0) act[m * Ii + i] = __float2bfloat16(0.f);
      continue;
    }
    const bf16* Wg = Wgu + e * gu_stride + int64_t(i) * D;
    const bf16* Wu = Wg + I * D;
    float g[1] = {0.f}, u[1] = {0.f};
    uint4 wg[kPreChunks], wu[kPreChunks];
    load_row_pieces(wg, Wg, D, lane);
    load_row_pieces(wu, Wu, D, lane);
    gemv_bf16_row_pre<1>(g, wg, x + m * ldx, ldx, Wg, D, lane);
    gemv_bf16_row_pre<1>(u, wu, x + m * ldx, ldx, Wu, D, lane);
    const float gs = warp_sum(g[0]), us = warp_sum(u[0]);
    if (lane == 0) act[m * Ii + i] = __float2bfloat16(gs / (1.0f + expf(-gs)) * us);
  }
  grid_barrier(bar);
  trace_mark(trace_ptr(), DecodeTraceEvent::ExpertDown);
  {
    const int n8 = n1 / 8;  // I % 8 == 0
    for (int j = threadIdx.x; j < n8; j += blockDim.x)
      reinterpret_cast<uint4*>(act_s)[j] = __ldcg(reinterpret_cast<const uint4*>(act) + j);
  }
  __syncthreads();
  for (int t = w0; t < n2; t += warps) {
    const int m = t / Di, o = t % Di;
    const int64_t e = choice[m];
    const float gm = gate[m];
    if (e < 0 || e >= E) {
      if (lane == 0)
        out[m * Di + o] = __float2bfloat16(scaled ? gm * __bfloat162float(x[m * ldx + o]) : 0.f);
      continue;
    }
    const bf16* w = Wd + e * d_stride + int64_t(o) * I;
    if (t != w0) load_row_pieces(wd, w, I, lane);
    float acc[1] = {0.f};
    gemv_bf16_row_pre<1>(acc, wd, act_s + m * Ii, I, w, I, lane);
    const float s = warp_sum(acc[0]);
    if (lane == 0) out[m * Di + o] = __float2bfloat16(gm * s);
  }
}


}  // namespace

namespace {

size_t expert_fused_smem(int64_t M, int64_t I) {
  return size_t(M * I) * sizeof(bf16);
}

// Blocks of the one-launch expert kernel: one warp per row of the larger product, capped by what
// the device holds at once (the grid barrier needs every block resident); 0 where it does not
// apply (act larger than 48 KB of shared memory, or no block fits).
int expert_fused_blocks(int64_t M, int64_t D, int64_t I) {
  const size_t smem = expert_fused_smem(M, I);
  if (smem > 48 * 1024) return 0;
  static int cached_dev = -1;
  static size_t cached_smem = 0;
  static int cached_cap = 0;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != cached_dev || smem != cached_smem) {
    int per_sm = 0, sms = 0;
    ZAYA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, expert_fused_kernel,
                                                                  kRowsPerBlock * kWarp, smem));
    ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cached_dev = dev, cached_smem = smem, cached_cap = per_sm * sms;
  }
  const int64_t want = (std::max(M * I, M * D) + kRowsPerBlock - 1) / kRowsPerBlock;
  return int(std::min<int64_t>(want, cached_cap));
}

}  // namespace

bool decode_experts_fused_supported(int64_t M, int64_t D, int64_t I) {
  return M >= 1 && D % 8 == 0 && I % 8 == 0 && expert_fused_blocks(M, D, I) > 0;
}

void decode_experts(bf16* out_MD, bf16* act_MI, const bf16* x_MD, const bf16* gate_up_E2ID,
                    const bf16* down_EDI, const float* gate_M, const int32_t* choice_M, int64_t E,
                    bool skip_scaled_input, int64_t M, int64_t D, int64_t I, cudaStream_t st,
                    const DecodeResidualNorm* rn, unsigned* fused_barrier, bool down_smem,
                    bool down_l2, bool stage_x, int down_rows,
    const DecodePolicy& policy) {
  check(M >= 1 && D > 0 && I > 0, "decode_experts: bad sizes");
  check(down_rows == 8 || down_rows == 4 || down_rows == 2,
        "decode_experts: rows per down block must be 8, 4 or 2");
  check(!rn || M <= kGemvMaxRows, "decode_experts: the fused residual norm takes M <= 8");
  const bool vec = D % 8 == 0 && I % 8 == 0 && aligned16(x_MD) && aligned16(gate_up_E2ID) &&
                   aligned16(down_EDI) && aligned16(act_MI);
  if (fused_barrier && !rn && vec && M * std::max(D, I) < (int64_t(1) << 30)) {
    const int blocks = expert_fused_blocks(M, D, I);
    if (blocks > 0) {
      launch_k(expert_fused_kernel, dim3(unsigned(blocks)), dim3(kRowsPerBlock * kWarp),
               expert_fused_smem(M, I), st, policy, out_MD, act_MI, x_MD, D, gate_up_E2ID, 2 * I * D,
               down_EDI, D * I, gate_M, choice_M, E, skip_scaled_input, int(M), D, I,
               fused_barrier);
      ZAYA_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  const dim3 g1{unsigned((I + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(M)};
  const dim3 g2{unsigned((D + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(M)};
  const dim3 block(kRowsPerBlock * kWarp);
  const TailNorm tn = tail_norm(rn, out_MD, D);
  // stage_x: the plain 16-byte forms only, with each row within 48 KB of shared memory.
  const bool stage = stage_x && vec && !rn && !down_smem && !down_l2 &&
                     std::max(D, I) * int64_t(sizeof(bf16)) <= 48 * 1024;
  if (stage) {
    launch_k(expert_swiglu_kernel<true, false, false, true>, g1, block, size_t(D) * sizeof(bf16),
             st, policy, act_MI, x_MD, D, gate_up_E2ID, 2 * I * D, choice_M, E, I, D, down_EDI, D * I, D);
    const auto down_k =
        down_rows == 2   ? expert_down_combine_kernel<true, false, false, false, true, 2>
        : down_rows == 4 ? expert_down_combine_kernel<true, false, false, false, true, 4>
                         : expert_down_combine_kernel<true, false, false, false, true>;
    const dim3 g2r{unsigned((D + down_rows - 1) / down_rows), unsigned(M)};
    launch_k(down_k, g2r, dim3(down_rows * kWarp), size_t(I) * sizeof(bf16), st, policy, out_MD, act_MI,
             x_MD, down_EDI, D * I, gate_M, choice_M, E, skip_scaled_input, D, I, tn);
    ZAYA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const auto down = vec ? (rn          ? expert_down_combine_kernel<true, true>
                           : down_smem ? expert_down_combine_kernel<true, false, false, true>
                                       : expert_down_combine_kernel<true, false>)
                        : (rn ? expert_down_combine_kernel<false, true>
                              : expert_down_combine_kernel<false, false>);
  const auto swiglu = !vec      ? expert_swiglu_kernel<false>
                      : down_l2 ? expert_swiglu_kernel<true, false, true>
                                : expert_swiglu_kernel<true>;
  launch_k(swiglu, g1, block, 0, st, policy, act_MI, x_MD, D, gate_up_E2ID, 2 * I * D, choice_M, E, I, D,
           down_EDI, D * I, D);
  launch_k(down, g2, block, 0, st, policy, out_MD, act_MI, x_MD, down_EDI, D * I, gate_M, choice_M, E,
           skip_scaled_input, D, I, tn);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(experts)
