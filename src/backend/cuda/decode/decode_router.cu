// The router of decode rows in one launch (decode_kernels.h, decode_router): a thread-block cluster
// per row on sm_90 (its cluster helpers, barriers and st.async exchange are here) for the down
// projection, EDA, norm, MLP, softmax and choice.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// The router of decode rows, one cluster of blocks per row: the down projection
// r = x·W_down + b, r += state ⊙ scale (EDA; r keeps the result as the next layer's state),
// RMSNorm, fc1 + exact GELU, fc2 + GELU, the class logits, fp32 softmax and the biased top-1
// choice (warp_router_select: ties to the lowest class) — the chain from the down projection to
// router_select of the training path in one launch.
//
// Each stage's output rows are split over the cluster's blocks (rank q takes rows
// [q·rpb, (q+1)·rpb), rpb = ⌈R/cluster⌉), one warp per row, and every result is written into the
// shared memory of every block of the cluster (distributed shared memory), followed by a cluster
// barrier; so each block holds the full vector the next stage reads, and the R×R matrices are
// streamed by the whole cluster instead of one SM. The block's fc1/fc2 rows (and, at rank 0, the
// class rows) are copied into shared memory with cp.async at the start, behind the down
// projection. The arithmetic per output (lane-strided fmaf, butterfly warp sum, then the bias) and
// the norm's reduction order are those of gemv_bf16 and the former one-block router, so the
// result does not depend on the cluster size.
//
// The router's small vectors (this block's rows of the down bias, EDA scale, fc1 and fc2 biases;
// the norm weight; at rank 0 the balancing biases) are copied into shared memory before pdl_wait
// too, so no stage waits on a global load of a bias after its barrier.
//
// Shared memory (floats): red[8] | v[R] | rn[R] | h1[R] | h2[R] | lg[E1p] | bd, scale, b1, b2
// [4·rpb] | norm_w[Rp] | bal[E1p] | w1[rpb·R] | w2[rpb·R] | wo[E1·R] (the last three only when
// staged), E1p and Rp = E1 and R rounded up to 4 (keeps the weight copies 16-byte aligned when
// R % 4 == 0).
constexpr int kRouterThreads = 256;
constexpr int kRouterWarps = kRouterThreads / kWarp;

__host__ __device__ inline int64_t router_smem_floats(int64_t R, int64_t E1, int64_t rpb,
                                                      bool staged) {
  const int64_t E1p = ((E1 + 3) / 4) * 4, Rp = ((R + 3) / 4) * 4;
  return kRouterWarps + 4 * R + E1p + 4 * rpb + Rp + E1p + (staged ? 2 * rpb * R + E1 * R : 0);
}

// kRegs: the block's fc1/fc2 rows (and, at rank 0, the class rows) are loaded into registers
// before pdl_wait instead of staged in shared memory — lane l of the warp of row o holds
// w[o][l + 32·i], the elements its lane-strided dot product reads, in the same order (the same
// bits); for R a multiple of 32 up to kRouterRegK·32, at most kRouterRegRows rows per warp and
// E1 ≤ kRouterRegClassRows·kRouterWarps (decode_router checks).
constexpr int kRouterRegK = 8, kRouterRegRows = 2, kRouterRegClassRows = 3;

// kAsync: the stages' results go to the other blocks with st.async against an mbarrier per stage
// (xbar_*) instead of generic stores and a cluster barrier after each stage; the last stage's
// (fc2) only to rank 0, which computes the class logits, so the other blocks exit once they have
// sent it (every store into a block lands before that block's last wait completes, and the last
// stage stores into rank 0 alone). The same arithmetic in the same order: the same bits.
__host__ __device__ inline int64_t round4(int64_t n) {
  return (n + 3) / 4 * 4;
}

// kStageX (with kVecX, kRegs and kAsync; DecodeRouterLayout::stage_x): the block copies
// its row of x into shared memory once after the wait, beside its down-projection rows' loads, and
// its warps read x there (gemv_bf16's stage_x); the same sums.
// kPreR (with kRegs and kAsync, not kStageX; decode_router's r0_MR): the
// down projection's sums r0 = x·W_down + b come from decode_norm_gemv_kernel, the launch before;
// every block loads all R of them and the EDA state, forms the full vector itself (its own rows
// stored as the next layer's state) and starts at the RMSNorm — no down-projection rows, no x and
// no first exchange. The same arithmetic in the same order: the same bits.
template <bool kVecX, bool kRegs, bool kAsync = false, bool kStageX = false, bool kPreR = false>
__global__ void __launch_bounds__(kRouterThreads)
    decode_router_kernel(float* r, float* probs, int32_t* choice, float* gate, const bf16* x,
                         int64_t ldx, const bf16* Wd, const float* bd, const float* state,
                         const float* scale, const float* norm_w, float eps, const float* fc1_w,
                         const float* fc1_b, const float* fc2_w, const float* fc2_b,
                         const float* out_w, const float* bal, int D, int R, int E1, bool stage,
                         bool vec_w, const float* r0) {
  static_assert(!kStageX || (kVecX && kRegs && kAsync), "x staged: the st.async form");
  static_assert(!kPreR || (kRegs && kAsync && !kStageX), "r0 given: the st.async form");
  extern __shared__ __align__(16) float sh[];
  constexpr bool kA = kAsync && kAsyncDsmem;
  __shared__ __align__(8) uint64_t xbar[3];  // kA: v, h1, h2 (rank 0) complete
  const unsigned q = cl_rank(), cs = cl_size();
  if constexpr (kA) {
    if (threadIdx.x == 0) {
      if constexpr (!kPreR) xbar_init_expect(xbar + 0, unsigned(R) * 4u);
      xbar_init_expect(xbar + 1, unsigned(R) * 4u);
      if (q == 0) xbar_init_expect(xbar + 2, unsigned(R) * 4u);
      xbar_init_fence();
    }
    cl_arrive_relaxed();  // paired with the wait before the first remote write
  } else {
    cl_arrive();  // paired with the wait before the first remote write: every peer has started
  }
  unsigned long long* const tr = trace_ptr();
  const int64_t m = blockIdx.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int rpb = int((R + int(cs) - 1) / int(cs));
  const int o0 = int(q) * rpb, o1 = o0 + rpb < R ? o0 + rpb : R;
  const int nw = o1 > o0 ? (o1 - o0) * R : 0;  // this block's weight elements per R×R matrix
  float* red = sh;
  float* v = sh + kRouterWarps;
  float* rn = v + R;
  float* h1 = rn + R;
  float* h2 = h1 + R;
  float* lg = h2 + R;
  float* sbd = lg + ((E1 + 3) / 4) * 4;   // [rpb]: this block's rows of the down bias
  float* ssc = sbd + rpb;                 // [rpb]: EDA scale
  float* sb1 = ssc + rpb;                 // [rpb]: fc1 bias
  float* sb2 = sb1 + rpb;                 // [rpb]: fc2 bias
  float* snw = sb2 + rpb;                 // [R]: norm weight
  float* sbal = snw + ((R + 3) / 4) * 4;  // [E1]: balancing biases (rank 0)
  float* w1 = sbal + ((E1 + 3) / 4) * 4;
  float* w2 = w1 + int64_t(rpb) * R;
  float* wo = w2 + int64_t(rpb) * R;
  // Prefetch the MLP rows this block needs (they do not depend on x).
  const float* g1 = fc1_w + int64_t(o0) * R;
  const float* g2 = fc2_w + int64_t(o0) * R;
  float w1r[kRouterRegRows][kRouterRegK], w2r[kRouterRegRows][kRouterRegK];
  float wor[kRouterRegClassRows][kRouterRegK];
  if constexpr (kRegs) {
#pragma unroll
    for (int j = 0; j < kRouterRegRows; j++) {
      const int o = o0 + warp + j * kRouterWarps;
#pragma unroll
      for (int i = 0; i < kRouterRegK; i++) {
        const int k = lane + i * kWarp;
        const bool ok = o < o1 && k < R;
        w1r[j][i] = ok ? fc1_w[int64_t(o) * R + k] : 0.f;
        w2r[j][i] = ok ? fc2_w[int64_t(o) * R + k] : 0.f;
      }
    }
#pragma unroll
    for (int j = 0; j < kRouterRegClassRows; j++) {
      const int o = warp + j * kRouterWarps;
#pragma unroll
      for (int i = 0; i < kRouterRegK; i++) {
        const int k = lane + i * kWarp;
        wor[j][i] = q == 0 && o < E1 && k < R ? out_w[int64_t(o) * R + k] : 0.f;
      }
    }
  } else if (!stage) {
    // Too large for shared memory (or no cluster): the stages read the weights where they are.
  } else if (vec_w) {
    for (int i = threadIdx.x * 4; i < nw; i += kRouterThreads * 4) {
      cp_async16(w1 + i, g1 + i);
      cp_async16(w2 + i, g2 + i);
    }
    if (q == 0)
      for (int i = threadIdx.x * 4; i < E1 * R; i += kRouterThreads * 4)
        cp_async16(wo + i, out_w + i);
  } else {
    for (int i = threadIdx.x; i < nw; i += kRouterThreads) w1[i] = g1[i], w2[i] = g2[i];
    if (q == 0)
      for (int i = threadIdx.x; i < E1 * R; i += kRouterThreads) wo[i] = out_w[i];
  }
  // This block's rows of the down projection towards L2 (128-byte lines), also before pdl_wait;
  // x, the EDA state and every output come after it. kPreR: the EDA scale of row threadIdx.x.
  if constexpr (!kPreR)
    for (int o = o0 + warp; o < o1; o += kRouterWarps)
      for (int64_t k = int64_t(lane) * 64; k < D; k += kWarp * 64)
        prefetch_l2(Wd + int64_t(o) * D + k);
  const float sc_t = kPreR && scale && int(threadIdx.x) < R ? scale[threadIdx.x] : 0.f;
  // The small vectors (weights) into shared memory.
  for (int i = threadIdx.x; i < o1 - o0; i += kRouterThreads) {
    sbd[i] = bd[o0 + i];
    ssc[i] = scale ? scale[o0 + i] : 0.f;
    sb1[i] = fc1_b[o0 + i];
    sb2[i] = fc2_b[o0 + i];
  }
  for (int i = threadIdx.x; i < R; i += kRouterThreads) snw[i] = norm_w[i];
  if (q == 0 && bal)
    for (int i = threadIdx.x; i < E1; i += kRouterThreads) sbal[i] = bal[i];
  // kStageX: the row of x in shared memory after the layout above (w1.. unused: kRegs).
  float* const xsh = sh + round4(router_smem_floats(R, E1, rpb, false));  // [D] bf16
  pdl_wait();
  pdl_trigger();
  const TraceSlots ts = trace_reserve(tr, DecodeTraceEvent::Router);
  __syncthreads();  // the small vectors are in shared memory
  // A stage's result row o to every block of the cluster (all) or to rank 0 alone: with st.async
  // counted on `bar` of each receiver (kA), else with stores that the stage's cluster barrier
  // (exchanged) publishes; then the wait until this block holds every row of the stage.
  auto send = [&](float* out, uint64_t* bar, bool all, int o, float s) {
    if constexpr (kA) {
      if (all) {
        for (unsigned t = unsigned(lane); t < cs; t += kWarp) st_async_f32(out + o, bar, t, s);
      } else if (lane == 0) {
        st_async_f32(out + o, bar, 0u, s);
      }
    } else {
      for (unsigned t = unsigned(lane); t < cs; t += kWarp) *cl_map(out + o, t) = s;
    }
  };
  auto exchanged = [&](uint64_t* bar) {
    if constexpr (kA)
      xbar_wait(bar);
    else
      cl_sync();
  };
  // Stage 0: the down projection and the EDA state, rows [o0, o1).
  // A warp's rows o and o + kRouterWarps are read together (both rows' loads in flight at once),
  // then finished in that order.
  bool waited = false;
  auto finish_row = [&](int o, float partial, float st) {
    float s = warp_sum(partial) + sbd[o - o0];
    if (state) s = __fmaf_rn(st, ssc[o - o0], s);  // as kPreR's
    if (lane == 0) r[m * R + o] = s;               // the next layer's EDA state
    if (!waited) {
      trace_slot(ts, 1, DecodeTraceEvent::RouterSums);
      cl_wait(), waited = true;
    }
    send(v, xbar + 0, true, o, s);
  };
  if constexpr (kPreR) {
    for (int i = int(threadIdx.x); i < R; i += kRouterThreads) {
      float s = r0[m * R + i];
      if (state) s = __fmaf_rn(state[m * R + i], i == int(threadIdx.x) ? sc_t : scale[i], s);
      v[i] = s;
      if (i >= o0 && i < o1) r[m * R + i] = s;  // the next layer's EDA state: this block's rows
    }
    trace_slot(ts, 1, DecodeTraceEvent::RouterSums);
    cl_wait();  // every peer has started: remote stores from stage 1 on
    waited = true;
    __syncthreads();  // v complete
  }
  if constexpr (kStageX) {
    // One pair of rows per warp (kRegs), their loads issued with the copy of x.
    const int o = o0 + warp, ob = o + kRouterWarps;
    const bool has_a = o < o1, has_b = ob < o1;
    const bf16* wa = Wd + int64_t(has_a ? o : o0) * D;
    const bf16* wb = Wd + int64_t(has_b ? ob : o0) * D;
    uint4 pa[kPreChunks], pb[kPreChunks];
    load_row_pieces(pa, wa, D, lane, has_a);
    load_row_pieces(pb, wb, D, lane, has_b);
    const float st_a = state && has_a ? state[m * R + o] : 0.f;
    const float st_b = state && has_b ? state[m * R + ob] : 0.f;
    const bf16* xr = stage_rows(x + m * ldx, 0, D, xsh);  // [D] bf16
    float acc[1] = {0.f}, accb[1] = {0.f};
    if (has_a) gemv_bf16_row_pre<1>(acc, pa, xr, 0, wa, D, lane);
    if (has_b) gemv_bf16_row_pre<1>(accb, pb, xr, 0, wb, D, lane);
    if (has_a) finish_row(o, acc[0], st_a);
    if (has_b) finish_row(ob, accb[0], st_b);
  }
  for (int o = o0 + warp; !kStageX && !kPreR && o < o1; o += 2 * kRouterWarps) {
    const int ob = o + kRouterWarps;
    const bool has_b = ob < o1;
    float acc[1] = {0.f}, accb[1] = {0.f};
    const bf16* wa = Wd + int64_t(o) * D;
    const bf16* wb = Wd + int64_t(has_b ? ob : o) * D;
    // The rows' EDA state (the previous layer's router output) loaded with the weights, not after
    // the sums.
    const float st_a = state ? state[m * R + o] : 0.f;
    const float st_b = state && has_b ? state[m * R + ob] : 0.f;
    if constexpr (kVecX) {
      uint4 pa[kPreChunks], pb[kPreChunks];
      load_row_pieces(pa, wa, D, lane);
      load_row_pieces(pb, wb, D, lane, has_b);
      gemv_bf16_row_pre<1>(acc, pa, x + m * ldx, ldx, wa, D, lane);
      if (has_b) gemv_bf16_row_pre<1>(accb, pb, x + m * ldx, ldx, wb, D, lane);
    } else {
      gemv_bf16_row<1, false>(acc, x + m * ldx, ldx, wa, D, lane);
      if (has_b) gemv_bf16_row<1, false>(accb, x + m * ldx, ldx, wb, D, lane);
    }
    finish_row(o, acc[0], st_a);
    if (has_b) finish_row(ob, accb[0], st_b);
  }
  if (!waited) {  // a warp without rows
    trace_slot(ts, 1, DecodeTraceEvent::RouterSums);
    cl_wait();
  }
  if constexpr (!kPreR) exchanged(xbar + 0);
  trace_slot(ts, 2, DecodeTraceEvent::RouterDown);
  // Stage 1: RMSNorm of the full v (every block the same, in the same order).
  float ss = 0.f;
  for (int i = threadIdx.x; i < R; i += kRouterThreads) ss += v[i] * v[i];
  ss = warp_sum(ss);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int w = 0; w < kRouterWarps; w++) tot += red[w];
  const float rstd = 1.0f / sqrtf(tot / float(R) + eps);
  for (int i = threadIdx.x; i < R; i += kRouterThreads) rn[i] = snw[i] * (v[i] * rstd);
  cp_async_wait_all();
  __syncthreads();
  // fc1 + GELU, then fc2 + GELU: rows of this block, results to every block.
  const float* w1p = stage ? w1 : g1;
  const float* w2p = stage ? w2 : g2;
  const float* wop = stage ? wo : out_w;
  // One MLP stage: this block's rows o of W (registers, or wp rows in shared or global memory)
  // against the full vector in, + bias, exact GELU, the result sent to every block of the cluster
  // or to rank 0 alone (all).
  auto mlp_stage = [&](const float(&wr)[kRouterRegRows][kRouterRegK], const float* wp,
                       const float* in, const float* bias, float* out, uint64_t* bar, bool all) {
    if constexpr (kRegs) {
#pragma unroll
      for (int j = 0; j < kRouterRegRows; j++) {
        const int o = o0 + warp + j * kRouterWarps;
        if (o >= o1) break;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < kRouterRegK; i++)
          if (lane + i * kWarp < R) s = fmaf(wr[j][i], in[lane + i * kWarp], s);
        s = kern::gelu_erf(warp_sum(s) + bias[o - o0]);
        send(out, bar, all, o, s);
      }
    } else {
      for (int o = o0 + warp; o < o1; o += kRouterWarps) {
        const float* w = wp + int64_t(o - o0) * R;
        float s = 0.f;
        for (int k = lane; k < R; k += kWarp) s = fmaf(w[k], in[k], s);
        s = kern::gelu_erf(warp_sum(s) + bias[o - o0]);
        send(out, bar, all, o, s);
      }
    }
  };
  mlp_stage(w1r, w1p, rn, sb1, h1, xbar + 1, true);
  exchanged(xbar + 1);
  trace_slot(ts, 3, DecodeTraceEvent::RouterFc1);
  mlp_stage(w2r, w2p, h1, sb2, h2, xbar + 2, false);
  if constexpr (kA) {
    if (q != 0) return;  // h2 goes to rank 0 alone; nothing is stored into this block any more
    xbar_wait(xbar + 2);
  } else {
    cl_sync();  // no remote access after this: the other blocks may exit
  }
  trace_slot(ts, 4, DecodeTraceEvent::RouterFc2);
  if (q != 0) return;
  if constexpr (kRegs) {
#pragma unroll
    for (int j = 0; j < kRouterRegClassRows; j++) {
      const int o = warp + j * kRouterWarps;
      if (o >= E1) break;
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kRouterRegK; i++)
        if (lane + i * kWarp < R) s = fmaf(wor[j][i], h2[lane + i * kWarp], s);
      s = warp_sum(s);
      if (lane == 0) lg[o] = s;
    }
  } else {
    for (int o = warp; o < E1; o += kRouterWarps) {
      const float* w = wop + int64_t(o) * R;
      float s = 0.f;
      for (int k = lane; k < R; k += kWarp) s = fmaf(w[k], h2[k], s);
      s = warp_sum(s);
      if (lane == 0) lg[o] = s;
    }
  }
  __syncthreads();
  trace_slot(ts, 5, DecodeTraceEvent::RouterLogits);
  if (warp == 0)  // softmax and choice: one warp, the training path's rule
    kern::warp_router_select(probs + m * E1, choice + m, gate + m, lg, bal ? sbal : nullptr, E1);
  trace_slot(ts, 6, DecodeTraceEvent::RouterSelect);
}

}  // namespace

namespace {

// The router's cluster size: the largest of 16 (non-portable, sm_90), 8, 4, 2, at most max_cs,
// that the device can schedule with the kernel's shared memory (its rows of fc1, fc2, out staged);
// otherwise 1 (no cluster launch, as before sm_90), staging the weights only if they fit. Decided
// once per (R, E1, max_cs) on the first call, which runs eagerly, so a captured step makes no such
// queries.
struct RouterLaunch {
  int64_t R = -1, E1 = -1;
  int device = -1, max_cs = -1;
  int cs = 1;
  bool stage_mlp = true, one_per_sm = false;  // the layout asked for (DecodeRouterLayout)
  size_t smem = 0;
  bool stage = true;  // the MLP weights go through shared memory
  bool ok = true;     // kRegs: the chosen cluster leaves at most kRouterRegRows rows per warp
  int64_t x_D = 0;    // kStageX: the staged row's width (its shared memory)
};

template <bool kVecX, bool kRegs, bool kAsync, bool kStageX = false, bool kPreR = false>
RouterLaunch router_launch(int64_t R, int64_t E1, const DecodeRouterLayout& lay, int64_t x_D = 0) {
  const int max_cs = lay.max_cluster > 0 ? lay.max_cluster : 16;
  static RouterLaunch cached;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  if (cached.R == R && cached.E1 == E1 && cached.device == dev && cached.max_cs == max_cs &&
      cached.stage_mlp == lay.stage_mlp && cached.one_per_sm == lay.one_per_sm && cached.x_D == x_D)
    return cached;
  RouterLaunch L;
  L.R = R, L.E1 = E1, L.device = dev, L.max_cs = max_cs, L.x_D = x_D;
  L.stage_mlp = lay.stage_mlp, L.one_per_sm = lay.one_per_sm;
  int major = 0, max_smem = 0, sm_smem = 0;
  ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ZAYA_CUDA_CHECK(
      cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  // one_per_sm: more than half an SM's shared memory, so no two blocks of the cluster share one
  // (when the device allows a block that much).
  const size_t spread =
      size_t(sm_smem / 2 + 1024) <= size_t(max_smem) ? size_t(sm_smem / 2 + 1024) : size_t(0);
  auto smem_for = [&](int cs, bool stage) {
    const int64_t rpb = stage || kStageX || kPreR ? (R + cs - 1) / cs : R;
    const size_t b = size_t(kStageX ? round4(router_smem_floats(R, E1, rpb, false)) + (x_D + 1) / 2
                                    : router_smem_floats(R, E1, rpb, stage)) *
                     sizeof(float);
    return lay.one_per_sm ? std::max(b, spread) : b;
  };
  const auto kernel = decode_router_kernel<kVecX, kRegs, kAsync, kStageX, kPreR>;
  const bool stage_mlp = lay.stage_mlp && !kRegs;  // registers instead of shared memory
  const int64_t reg_rows = int64_t(kRouterRegRows) * kRouterWarps;
  L.cs = 1;
  L.smem = smem_for(1, stage_mlp);
  L.stage = stage_mlp && L.smem <= size_t(max_smem);
  if (!L.stage) L.smem = smem_for(1, false);
  if (major >= 9) {
    ZAYA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (int cs : {16, 8, 4, 2}) {
      if (cs > max_cs || (kRegs && (R + cs - 1) / cs > reg_rows)) continue;
      const size_t smem = smem_for(cs, stage_mlp);
      if (smem > size_t(max_smem)) continue;
      ZAYA_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = unsigned(cs), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(unsigned(cs), 1, 1);
      cfg.blockDim = dim3(kRouterThreads, 1, 1);
      cfg.dynamicSmemBytes = smem;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) == cudaSuccess && n >= 1) {
        L.cs = cs, L.smem = smem, L.stage = stage_mlp;
        break;
      }
      (void)cudaGetLastError();  // an unsupported size is not an error of the step
    }
  }
  check(L.smem <= size_t(max_smem), "decode_router: router width too large for shared memory");
  L.ok = !kRegs || (R + L.cs - 1) / L.cs <= reg_rows;
  ZAYA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(L.smem)));
  cached = L;
  return L;
}

// Launches the router; false (nothing launched) when the register form cannot take this size, or
// the st.async form (kAsync) finds no cluster of more than one block.
template <bool kVecX, bool kRegs, bool kAsync, bool kStageX = false, bool kPreR = false>
bool launch_router(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                   const bf16* x_MD, int64_t ldx, const bf16* down_w_RD, const float* down_b_R,
                   const float* state_MR, const float* scale_R, const float* norm_w_R, float eps,
                   const float* fc1_w, const float* fc1_b, const float* fc2_w, const float* fc2_b,
                   const float* out_w, const float* balancing_E1, int64_t M, int64_t D, int64_t R,
                   int64_t E1, bool vec_w, const DecodeRouterLayout& lay, cudaStream_t st,
                   const DecodePolicy& policy, const float* r0 = nullptr) {
  const RouterLaunch L =
      router_launch<kVecX, kRegs, kAsync, kStageX, kPreR>(R, E1, lay, kStageX ? D : 0);
  if (!L.ok || (kAsync && L.cs < 2)) return false;
  // kStageX: one pair of rows per warp.
  if (kStageX && (R + L.cs - 1) / L.cs > 2 * kRouterWarps) return false;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[2];
  unsigned n = 0;
  if (L.cs > 1) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = unsigned(L.cs), at[n].val.clusterDim.y = 1;
    at[n].val.clusterDim.z = 1;
    n++;
  }
  // The kernel follows the pdl_wait rules (weights only before it).
  n = add_pdl_attribute(at, n, policy);
  cfg.gridDim = dim3(unsigned(L.cs), unsigned(M), 1);
  cfg.blockDim = dim3(kRouterThreads, 1, 1);
  cfg.dynamicSmemBytes = L.smem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = n;
  const auto kernel = decode_router_kernel<kVecX, kRegs, kAsync, kStageX, kPreR>;
  ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx,
                                     down_w_RD, down_b_R, state_MR, scale_R, norm_w_R, eps, fc1_w,
                                     fc1_b, fc2_w, fc2_b, out_w, balancing_E1, int(D), int(R),
                                     int(E1), L.stage, vec_w, r0));
  return true;
}

}  // namespace

bool decode_router_pre_down_supported(int64_t R, int64_t E1, const DecodeRouterLayout& lay) {
  if (!(lay.mlp_regs && lay.async_exchange && R % kWarp == 0 && R <= int64_t(kRouterRegK) * kWarp &&
        R <= kRouterThreads && E1 <= int64_t(kRouterRegClassRows) * kRouterWarps))
    return false;
  const RouterLaunch L = router_launch<true, true, true, false, true>(R, E1, lay, 0);
  return L.ok && L.cs >= 2;
}

void decode_router(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                   const bf16* x_MD, int64_t ldx, const bf16* down_w_RD, const float* down_b_R,
                   const float* state_MR, const float* scale_R, const float* norm_w_R, float eps,
                   const float* fc1_w, const float* fc1_b, const float* fc2_w, const float* fc2_b,
                   const float* out_w, const float* balancing_E1, int64_t M, int64_t D, int64_t R,
                   int64_t E1, cudaStream_t st, const DecodeRouterLayout& lay, const float* r0_MR,
                   const DecodePolicy& policy) {
  check(M >= 1 && D > 0 && R > 0 && E1 > 0 && ldx >= D, "decode_router: bad sizes");
  if (r0_MR != nullptr) {
    check(decode_router_pre_down_supported(R, E1, lay),
          "decode_router: the down projection's sums (r0) need decode_router_pre_down_supported");
    const bool vec_w = R % 4 == 0 && aligned16(fc1_w) && aligned16(fc2_w) && aligned16(out_w);
    check(launch_router<true, true, true, false, true>(
              r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx, down_w_RD, down_b_R, state_MR, scale_R,
              norm_w_R, eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D, R, E1, vec_w,
              lay, st, policy, r0_MR),
          "decode_router: the form that starts from r0 could not be launched");
    ZAYA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int mc = lay.max_cluster;
  check(mc == 0 || mc == 1 || mc == 2 || mc == 4 || mc == 8 || mc == 16,
        "decode_router: the cluster size limit must be 1, 2, 4, 8 or 16 (0: 16)");
  const bool vec_x = D % 8 == 0 && ldx % 8 == 0 && aligned16(x_MD) && aligned16(down_w_RD);
  const bool vec_w = R % 4 == 0 && aligned16(fc1_w) && aligned16(fc2_w) && aligned16(out_w);
  // mlp_regs where the register form takes the size (else the shared-memory layout).
  const bool regs = lay.mlp_regs && R % kWarp == 0 && R <= int64_t(kRouterRegK) * kWarp &&
                    E1 <= int64_t(kRouterRegClassRows) * kRouterWarps;
  // Each form falls back to the next: st.async exchange (lay.async_exchange, where the cluster
  // has more than one block), then registers (where the sizes allow), then shared memory.
  auto go = [&](auto vx, auto rg, auto as) {
    return launch_router<decltype(vx)::value, decltype(rg)::value, decltype(as)::value>(
        r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx, down_w_RD, down_b_R, state_MR, scale_R,
        norm_w_R, eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D, R, E1, vec_w, lay, st,
        policy);
  };
  using T = std::true_type;
  using F = std::false_type;
  const bool as = lay.async_exchange;
  if (lay.stage_x && regs && as && vec_x && D % 8 == 0 &&
      launch_router<true, true, true, true>(r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx, down_w_RD,
                                            down_b_R, state_MR, scale_R, norm_w_R, eps, fc1_w,
                                            fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D, R, E1,
                                            vec_w, lay, st, policy)) {
    ZAYA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto with_x = [&](auto vx) {
    if (regs && as && go(vx, T{}, T{})) return;
    if (regs && go(vx, T{}, F{})) return;
    if (as && go(vx, F{}, T{})) return;
    go(vx, F{}, F{});
  };
  if (vec_x)
    with_x(T{});
  else
    with_x(F{});
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_router(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                   const bf16* x_MD, int64_t ldx, const bf16* down_w_RD, const float* down_b_R,
                   const float* state_MR, const float* scale_R, const float* norm_w_R, float eps,
                   const float* fc1_w, const float* fc1_b, const float* fc2_w, const float* fc2_b,
                   const float* out_w, const float* balancing_E1, int64_t M, int64_t D, int64_t R,
                   int64_t E1, cudaStream_t st, int max_cluster, const DecodePolicy& policy) {
  DecodeRouterLayout lay;
  lay.max_cluster = max_cluster;
  decode_router(r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx, down_w_RD, down_b_R, state_MR,
                scale_R, norm_w_R, eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D, R,
                E1, st, lay, nullptr, policy);
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(router)
