// Decode-step kernels (backend/cuda/decode/decode_kernels.h): weight-streaming matrix-vector products, the expert
// product that picks each row's expert on the device, the CCA finish + cache append for one token,
// split-context attention over the cache, and the small bookkeeping kernels (argmax, lengths).
// Positions come from a device counter so a captured decode step replays unchanged.
// Deliberately not here: batched prefill (it runs the training-path kernels and GEMMs) and
// sampling other than greedy (done on the host from the logits).
#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/decode/decode_kernels.h"
#include "backend/cuda/arch/kernel_utils.cuh"
#include "core/cuda_check.h"

#ifndef ZAYA_DECODE_TRACE
#define ZAYA_DECODE_TRACE 0
#endif

namespace zaya::cuda {
namespace {

namespace cg = cooperative_groups;

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

// Programmatic dependent launch (sm_90; the host launches every decode kernel with
// cudaLaunchAttributeProgrammaticStreamSerialization where the device has it, see launch_k): a
// kernel may start while the previous kernel of the stream is still running, as soon as every
// block of that kernel has executed pdl_trigger() (or exited). Each kernel here therefore
//   1. before pdl_wait() reads nothing but weights (uploaded once at construction, never written
//      by a kernel) and writes nothing but its own registers and shared memory; the exceptions
//      are values whose writer is at least two launches back, which by rule 3 completed before
//      the previous kernel could start: the sequence lengths in decode_attention and the CCA
//      finish (only a step's last launch writes them) and the router's choice and gate in the
//      expert-down kernel;
//   2. has every thread call pdl_wait() (griddepcontrol.wait: returns once the previous kernel
//      has completed and its memory is visible) before its first read of an activation, cache,
//      counter or length, and before its first global store or atomic;
//   3. calls pdl_trigger() right after pdl_wait() (or later: the attention, trigger_at), so at
//      most one kernel runs ahead in its prologue (the next kernel can only start once this
//      one's blocks have all passed their wait, i.e. once the kernel before this one has
//      completed) — except the launches made
//      with an early trigger (pdl_begin_early, DecodeTuning::early_trigger), whose successors'
//      prologues read weights only: those trigger before they wait.
// Completion is transitive: the kernel before has itself waited for the one before it before it
// could complete, so after pdl_wait() every earlier kernel of the stream has completed. Rule 1
// keeps the prologue free of read-after-write and write-after-read hazards with kernels still
// running. Without the attribute (pre-sm_90, ZAYA_DECODE_PDL=0) both instructions are no-ops and
// kernels run serialised as before; the arithmetic is the same either way.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Decode trace (set_decode_trace), compiled in only with -DZAYA_DECODE_TRACE=ON: while c_trace is
// set, thread 0 of block (0, 0, 0) of every decode kernel stamps the global timer as it passes its
// wait (the router also after its stages), appending (ns << 8 | event) after the buffer's leading
// counter. The stamp comes after the trigger, so the next launch is not held back; the atomic adds
// an L2 round trip to that one thread. The pointer is read before the wait (a constant-cache miss
// after it would sit on every kernel's critical path). In the default build trace_mark is empty.
#if ZAYA_DECODE_TRACE
__constant__ unsigned long long* c_trace;
__constant__ unsigned long long c_trace_cap;

__device__ __forceinline__ unsigned long long* trace_ptr() {
  return c_trace;
}
// any_block: thread 0 of whichever block calls it (the attention's combining block), not only of
// block (0, 0, 0).
__device__ __forceinline__ void trace_mark(unsigned long long* t, DecodeTraceEvent ev,
                                           bool any_block = false) {
  if (t == nullptr || threadIdx.x != 0 || (!any_block && (blockIdx.x | blockIdx.y | blockIdx.z)))
    return;
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  const unsigned long long i = atomicAdd(t, 1ull);
  if (i < c_trace_cap) t[1 + i] = (now << 8) | unsigned(ev);
}
// The router's stamps: slots for all of them reserved with its first one (one atomic), the later
// ones written without an atomic, so that the stage marks do not hold the stamping warp for an L2
// round trip each.
constexpr int kRouterStamps = 7;  // Router, Sums, Down, Fc1, Fc2, Logits, Select
struct TraceSlots {
  unsigned long long* t = nullptr;
  unsigned long long base = 0;
};
__device__ __forceinline__ TraceSlots trace_reserve(unsigned long long* t, DecodeTraceEvent ev) {
  TraceSlots s;
  if (t == nullptr || (threadIdx.x | blockIdx.x | blockIdx.y | blockIdx.z) != 0) return s;
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  const unsigned long long i = atomicAdd(t, static_cast<unsigned long long>(kRouterStamps));
  if (i + kRouterStamps > c_trace_cap) return s;
  t[1 + i] = (now << 8) | unsigned(ev);
  s.t = t, s.base = i;
  return s;
}
__device__ __forceinline__ void trace_slot(const TraceSlots& s, int j, DecodeTraceEvent ev) {
  if (s.t == nullptr) return;
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  s.t[1 + s.base + j] = (now << 8) | unsigned(ev);
}
#else
__device__ __forceinline__ unsigned long long* trace_ptr() {
  return nullptr;
}
__device__ __forceinline__ void trace_mark(unsigned long long*, DecodeTraceEvent, bool = false) {}
struct TraceSlots {};
__device__ __forceinline__ TraceSlots trace_reserve(unsigned long long*, DecodeTraceEvent) {
  return {};
}
__device__ __forceinline__ void trace_slot(const TraceSlots&, int, DecodeTraceEvent) {}
#endif

__device__ __forceinline__ void pdl_begin(DecodeTraceEvent ev) {
  unsigned long long* const t = trace_ptr();
  pdl_wait();
  pdl_trigger();
  trace_mark(t, ev);
}
// The early form, for a launch whose successor's prologue reads nothing that a running kernel
// writes (weights only, or values of launches that completed long before): the trigger before
// the wait lets that prologue start while this launch's predecessor still runs, so two launches
// may be in their prologues at once. The successor's own wait still returns only after this
// launch completed, which in turn waited for its predecessor: rule 2 holds for it unchanged.
__device__ __forceinline__ void pdl_begin_early(DecodeTraceEvent ev) {
  unsigned long long* const t = trace_ptr();
  pdl_trigger();
  pdl_wait();
  trace_mark(t, ev);
}
// The late form: the wait alone; the kernel calls pdl_trigger() itself further on, once its own
// dependent loads are done (the attention, DecodeTuning::attn_trigger), so that the successor's
// prologue does not compete with them. Rule 3 holds a fortiori.
__device__ __forceinline__ void pdl_begin_late(DecodeTraceEvent ev) {
  unsigned long long* const t = trace_ptr();
  pdl_wait();
  trace_mark(t, ev);
}

// 16-byte global → shared copies that complete in the background (cp.async, L2 only), and the wait
// for all of this thread's copies.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// A 16-byte piece of a weight row. kEF (an int: kWeightNormal, kWeightEvictFirst or
// kWeightNoL1). kWeightEvictFirst (set_decode_weights_evict_first): loaded with L2 evict_first
// priority, so that the ~1.4 GB of weights a decode step streams through the 50 MB L2 displace
// each other before anything else there — the kernels' code, the KV cache, activations and
// partials, which are read again within the step or the next one. kWeightNoL1 (the LM head's
// DecodeTuning::lm_head_no_l1): not allocated in L1, so that the streamed rows do not evict the
// input row every warp reads there. Otherwise a plain load (the hardware's default policy). The
// value is the same either way.
constexpr int kWeightNormal = 0, kWeightEvictFirst = 1, kWeightNoL1 = 2;
template <int kEF>
__device__ __forceinline__ uint4 ld_weight16(const bf16* p) {
  if constexpr (kEF == kWeightEvictFirst) {
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    uint4 v;
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
  } else if constexpr (kEF == kWeightNoL1) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
  } else {
    return *reinterpret_cast<const uint4*>(p);
  }
}
// The block copies M rows of n bf16 (n a multiple of 8, 16-byte aligned, row stride ld) into
// shared memory dst ([M][n]) and returns dst once every thread's pieces are there (a block barrier:
// every thread calls it).
template <int M = 1>
__device__ __forceinline__ const bf16* stage_rows(const bf16* rows, int64_t ld, int64_t n,
                                                  void* dst) {
  uint4* d = static_cast<uint4*>(dst);
  const int64_t n8 = n / 8;
  for (int64_t j = threadIdx.x; j < M * n8; j += blockDim.x)
    d[j] = reinterpret_cast<const uint4*>(rows + (j / n8) * ld)[j % n8];
  __syncthreads();
  return reinterpret_cast<const bf16*>(d);
}
// acc[m] += Σ_i w8[i] · x[m, k + i] over one 16-byte piece of weights (8 bf16), the fmaf chain in
// element order: every GEMV variant below accumulates through this, so they agree bit for bit.
template <int M>
__device__ __forceinline__ void gemv_piece(float (&acc)[M], const uint4& w8, const bf16* x,
                                           int64_t ldx, int64_t k) {
  float wf[8];
  bf16x8_to_f32(w8, wf);
#pragma unroll
  for (int m = 0; m < M; m++) {
    float xf[8];
    bf16x8_to_f32(*reinterpret_cast<const uint4*>(x + m * ldx + k), xf);
#pragma unroll
    for (int i = 0; i < 8; i++) acc[m] = fmaf(wf[i], xf[i], acc[m]);
  }
}

// The same product with the first kPreChunks 16-byte pieces of each lane's share of the row
// already in registers (loaded up front, see load_row_pieces): the same pieces in the same order
// with the same fmaf chain as the lane-strided loop over all pieces, so every caller agrees bit for
// bit.
constexpr int kPreChunks = 8;  // a whole row for K <= 2048

// Lane `lane`'s first kPreChunks pieces of row w (zeros past K or when !live), all loads issued
// before any is used: one memory round trip per row instead of one per group of unrolled pieces.
template <int kEF = kWeightNormal>
__device__ __forceinline__ void load_row_pieces(uint4 (&wpre)[kPreChunks], const bf16* w, int64_t K,
                                                int lane, bool live = true) {
#pragma unroll
  for (int c = 0; c < kPreChunks; c++) {
    const int64_t k = int64_t(lane) * 8 + int64_t(c) * kWarp * 8;
    wpre[c] = live && k < K ? ld_weight16<kEF>(w + k) : make_uint4(0, 0, 0, 0);
  }
}

template <int M, int kEF = kWeightNormal>
__device__ void gemv_bf16_row_pre(float (&acc)[M], const uint4 (&wpre)[kPreChunks], const bf16* x,
                                  int64_t ldx, const bf16* w, int64_t K, int lane) {
#pragma unroll
  for (int c = 0; c < kPreChunks; c++) {
    const int64_t k = int64_t(lane) * 8 + int64_t(c) * kWarp * 8;
    if (k >= K) break;
    gemv_piece<M>(acc, wpre[c], x, ldx, k);
  }
#pragma unroll 4
  for (int64_t k = int64_t(lane) * 8 + int64_t(kPreChunks) * kWarp * 8; k < K; k += kWarp * 8) {
    gemv_piece<M>(acc, ld_weight16<kEF>(w + k), x, ldx, k);
  }
}

// One warp per output row o; lanes stride over K in 8-element (16-byte) pieces when `vec` (the
// first kPreChunks of them loaded together).
template <int M, bool kVec, int kEF = kWeightNormal>
__device__ void gemv_bf16_row(float (&acc)[M], const bf16* x, int64_t ldx, const bf16* w, int64_t K,
                              int lane) {
  if (kVec) {
    uint4 wpre[kPreChunks];
    load_row_pieces<kEF>(wpre, w, K, lane);
    gemv_bf16_row_pre<M, kEF>(acc, wpre, x, ldx, w, K, lane);
  } else {
    for (int64_t k = lane; k < K; k += kWarp) {
      const float wk = __bfloat162float(w[k]);
#pragma unroll
      for (int m = 0; m < M; m++) acc[m] = fmaf(wk, __bfloat162float(x[m * ldx + k]), acc[m]);
    }
  }
}

// Row kernels for decode (a few rows of D): one 256-thread block per row, so a row's loads are
// spread over the block instead of one warp (the training kernels' layout, which leaves a single
// row latency-bound). Same arithmetic as residual_scale_rmsnorm_fwd / rmsnorm_fwd.
constexpr int kRowThreads = 256;
static_assert(kRowThreads == kRowsPerBlock * kWarp, "the fused tails run in GEMV-sized blocks");

__device__ float block_sum_rows(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < kRowThreads / kWarp; w++) t += red[w];  // same order in every thread
  return t;
}

// The per-element arithmetic of the decode residual norm with its roundings spelled out (the
// intrinsics are never contracted or reordered), so the standalone kernel and the tails fused into
// the o projection and the expert combine give the same bits whatever the surrounding code:
// h' = (a + hb)·hs + (h + rb)·rs with the first product fused, ss += h'², y = (w·h')·rstd.
__device__ __forceinline__ float residual_elem(float a, float hb, float hs, float h, float rb,
                                               float rs) {
  return __fmaf_rn(__fadd_rn(a, hb), hs, __fmul_rn(__fadd_rn(h, rb), rs));
}
__device__ __forceinline__ float norm_rstd(float ss_total, int64_t D, float eps) {
  return 1.0f / sqrtf(ss_total / float(D) + eps);
}

// The vector form: thread t owns the float4 groups t, t + 256, ... (up to kRowVec of them, so
// D <= 4096).
constexpr int kRowVec = 4;

// The residual norm n (DecodeNormIn) computed by the block of the launch that reads it (the q|k|v
// GEMV with DecodeTuning::fold_qkv_norm). Before the
// launch's wait, norm_in_stage copies the norm's five vectors (weights) into shared memory pv
// ([5][D] floats: hs, hb, rs, rb, w) with cp.async; after it, norm_in_row computes row m in the
// vector layout and with the arithmetic of decode_residual_norm_kernel (the same bits): x into xs
// (shared memory, [D] bf16), and when `store` the row of h_out (and of x_out, if set) stored too.
// The row's inputs are read in one round trip. Every thread of the block (kRowThreads) must call
// both; norm_in_row waits for the block's cp.async copies and ends with a barrier.
constexpr int kNormInVecs = 5;

__device__ __forceinline__ void norm_in_stage(const DecodeNormIn& n, int64_t D, float* pv) {
  for (int64_t i = int64_t(threadIdx.x) * 4; i < kNormInVecs * D; i += int64_t(blockDim.x) * 4) {
    const int64_t r = i / D;
    const float* v = r == 0 ? n.hs : r == 1 ? n.hb : r == 2 ? n.rs : r == 3 ? n.rb : n.norm_w;
    cp_async16(pv + i, v + i % D);
  }
}

__device__ void norm_in_row(const DecodeNormIn& n, int64_t m, int64_t D, const float* pv, bf16* xs,
                            bool store, float* red) {
  using kern::load4;
  float hv[kRowVec][4], av[kRowVec][4];
#pragma unroll
  for (int k = 0; k < kRowVec; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    load4(n.h_in + m * D + i, hv[k]), load4(n.a + m * D + i, av[k]);
  }
  cp_async_wait_all();
  __syncthreads();  // every thread's vector copies have landed
  const float *hs = pv, *hb = pv + D, *rs = pv + 2 * D, *rb = pv + 3 * D, *w = pv + 4 * D;
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kRowVec; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    float hsv[4], hbv[4], rsv[4], rbv[4];
    load4(hs + i, hsv), load4(hb + i, hbv), load4(rs + i, rsv), load4(rb + i, rbv);
#pragma unroll
    for (int e = 0; e < 4; e++) {
      hv[k][e] = residual_elem(av[k][e], hbv[e], hsv[e], hv[k][e], rbv[e], rsv[e]);
      ss = __fmaf_rn(hv[k][e], hv[k][e], ss);
    }
    if (store) kern::store4(n.h_out + m * D + i, hv[k]);
  }
  const float rstd = norm_rstd(block_sum_rows(ss, red), D, n.eps);
#pragma unroll
  for (int k = 0; k < kRowVec; k++) {
    const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
    if (i >= D) break;
    float wv[4], o[4];
    load4(w + i, wv);
#pragma unroll
    for (int e = 0; e < 4; e++) o[e] = __fmul_rn(__fmul_rn(wv[e], hv[k][e]), rstd);
    kern::store4(xs + i, o);
    if (store && n.x_out) kern::store4(n.x_out + m * D + i, o);
  }
  __syncthreads();
}

// Arguments of a residual norm fused into the tail of a GEMV or expert launch.
struct TailNorm {
  float* h;
  bf16* y;
  const float *hs, *hb, *rs, *rb, *w;
  float eps;
  unsigned* counters;
  bool vec;  // the float4 form (the standalone kernel's choice for the same pointers and D)
};

__device__ __forceinline__ void ldcg4(const bf16* p, float (&v)[4]) {
  const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p));
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&u);
  const float2 lo = __bfloat1622float2(b[0]), hi = __bfloat1622float2(b[1]);
  v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
}

// Row m of the residual norm by one 256-thread block, a (bf16 [M, D]) written by other blocks of
// the same launch (read through L2). Streams each group (load, compute, store h) instead of
// holding the row in registers as the standalone kernel does, to keep the host kernel's register
// count; each thread's elements, their order in its sum and the block reduction are the
// standalone kernel's, and a thread re-reads only h values it stored itself, so the bits agree.
template <bool kVec>
__device__ void tail_residual_norm_row(const TailNorm& t, const bf16* a, int64_t m, int64_t D,
                                       float* red) {
  float* hr = t.h + m * D;
  const bf16* ar = a + m * D;
  float ss = 0.f;
  if constexpr (kVec) {
    using kern::load4;
#pragma unroll
    for (int k = 0; k < kRowVec; k++) {
      const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
      if (i >= D) break;
      float hv[4], av[4], hsv[4], hbv[4], rsv[4], rbv[4];
      load4(hr + i, hv), ldcg4(ar + i, av);
      load4(t.hs + i, hsv), load4(t.hb + i, hbv), load4(t.rs + i, rsv), load4(t.rb + i, rbv);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        hv[e] = residual_elem(av[e], hbv[e], hsv[e], hv[e], rbv[e], rsv[e]);
        ss = __fmaf_rn(hv[e], hv[e], ss);
      }
      kern::store4(hr + i, hv);
    }
    const float rstd = norm_rstd(block_sum_rows(ss, red), D, t.eps);
#pragma unroll
    for (int k = 0; k < kRowVec; k++) {
      const int64_t i = 4 * (int64_t(threadIdx.x) + int64_t(k) * kRowThreads);
      if (i >= D) break;
      float hv[4], wv[4], o[4];
      load4(hr + i, hv), load4(t.w + i, wv);
#pragma unroll
      for (int e = 0; e < 4; e++) o[e] = __fmul_rn(__fmul_rn(wv[e], hv[e]), rstd);
      kern::store4(t.y + m * D + i, o);
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += kRowThreads) {
      const float v = residual_elem(__bfloat162float(__ldcg(ar + i)), t.hb[i], t.hs[i], hr[i],
                                    t.rb[i], t.rs[i]);
      hr[i] = v;
      ss = __fmaf_rn(v, v, ss);
    }
    const float rstd = norm_rstd(block_sum_rows(ss, red), D, t.eps);
    for (int64_t i = threadIdx.x; i < D; i += kRowThreads)
      t.y[m * D + i] = __float2bfloat16(__fmul_rn(__fmul_rn(t.w[i], hr[i]), rstd));
  }
}

// Counts this block as done with `counter` (its stores made visible first); true in the one block
// that finishes last, which also resets the counter for the next launch or graph replay. Every
// thread of the block must call it.
__device__ bool last_block_done(unsigned* counter, unsigned blocks) {
  __shared__ unsigned flag;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) flag = atomicAdd(counter, 1u) == blocks - 1u;
  __syncthreads();
  if (flag == 0u) return false;
  __threadfence();
  if (threadIdx.x == 0) *counter = 0u;
  return true;
}

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

// Thread-block clusters (sm_90): this block's rank, the cluster's size, a peer block's shared
// memory, and the split cluster barrier (arrive has release, wait acquire semantics, so
// shared-memory writes before an arrive, local or remote, are visible after the matching wait).
// Compiled for an older target (the PTX fallback), a cluster is one block and the launcher asks for
// no clusters.
__device__ __forceinline__ unsigned cl_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().block_rank();
#else
  return 0;
#endif
}
__device__ __forceinline__ unsigned cl_size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().num_blocks();
#else
  return 1;
#endif
}
__device__ __forceinline__ float* cl_map(float* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().map_shared_rank(p, int(rank));
#else
  return p;
#endif
}
__device__ __forceinline__ void cl_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::this_cluster().barrier_arrive();
#endif
}
__device__ __forceinline__ void cl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::this_cluster().barrier_wait();
#else
  __syncthreads();
#endif
}
__device__ __forceinline__ void cl_sync() {
  cl_arrive();
  cl_wait();
}

// Exchange through distributed shared memory without a cluster barrier per round (sm_90): the
// writer stores into a peer's shared memory with st.async, which counts the bytes against an
// mbarrier in that peer's shared memory (complete_tx), and the reader waits for its mbarrier's
// phase to complete — once every expected byte has landed. A release/acquire cluster barrier
// compiles to a GPU-scope memory barrier (MEMBAR.ALL.GPU: the block waits for its outstanding
// global stores too) plus the barrier round itself; this costs neither. kAsyncDsmem is false in the
// PTX fallback (pre-sm_90 targets), whose callers then take the barrier form.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kAsyncDsmem = false;
#else
constexpr bool kAsyncDsmem = true;
#endif
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif
// Thread-wise: initialise mbarrier `bar` for one arrival and make that arrival now, expecting
// `bytes` of st.async stores.
__device__ __forceinline__ void xbar_init_expect(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}
// The initialisations above made visible to the cluster's other blocks (before the cluster
// barrier that precedes their first store), and that barrier's relaxed arrive.
__device__ __forceinline__ void xbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cl_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The cluster addresses of p and bar in the shared memory of block `rank`.
__device__ __forceinline__ void cl_remote(const void* p, const uint64_t* bar, unsigned rank,
                                          uint32_t& rp, uint32_t& rb) {
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rp) : "r"(smem_addr(p)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(rb)
               : "r"(smem_addr(bar)), "r"(rank));
}
#endif
// v stored at p's offset in the shared memory of block `rank`, counted on that block's `bar`.
__device__ __forceinline__ void st_async_f32(float* p, uint64_t* bar, unsigned rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t rp, rb;
  cl_remote(p, bar, rank, rp, rb);
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(rp),
      "r"(__float_as_uint(v)), "r"(rb)
      : "memory");
#endif
}
// Four floats (16-byte aligned p) stored at p's offset in the shared memory of block `rank`,
// counted on that block's `bar`.
__device__ __forceinline__ void st_async_f32x4(float* p, uint64_t* bar, unsigned rank,
                                               const float (&v)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t rp, rb;
  cl_remote(p, bar, rank, rp, rb);
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(rp),
      "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])),
      "r"(__float_as_uint(v[3])), "r"(rb)
      : "memory");
#endif
}
// Until phase 0 of this block's `bar` completes (each mbarrier here is used once per launch), with
// acquire semantics at cluster scope: the other blocks' stores counted on it are visible after.
__device__ __forceinline__ void xbar_wait(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred done;\n XBAR_WAIT_%=:\n"
      " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n"
      " @!done bra XBAR_WAIT_%=;\n}\n" ::"r"(smem_addr(bar))
      : "memory");
#endif
}

// Split-context attention, one launch: block (chunk, kv head g, sequence m) handles `ch` keys of
// the cache for the G query heads of g and writes unnormalised partial outputs with their max and
// sum; the last block of (g, m) to finish (a counter per (m, g), reset by that block) combines the
// partials of the chunks that hold visible keys, in chunk order, so the result does not depend on
// which block finished last.
// Scores: the lanes of a warp form four groups of 8, one key per group (16 keys per pass of the
// block); a lane holds PER = d/8 consecutive values of the key row (16-byte loads at d = 64, 128),
// and the group's dot products are summed by three butterfly shuffles inside the group. P·V: one
// key per warp at a time, lanes across the head dim (d/32 values each, one load per lane), the four
// warps' sums added in order. Shared memory: G·d floats of q (pre-scaled by 1/sqrt(d)), G·ch
// scores, 4·G·d partial outputs, and one flag.
constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * kWarp;
constexpr int kAttnMaxG = 8;
constexpr int kAttnMlPerLane = 8;  // (max, sum) pairs a lane of the combine holds in registers
constexpr int kAttnExactMaxChunks = kWarp * kAttnMlPerLane;  // the kG form's combine: one round
constexpr int kAttnKeysPerPass = kAttnWarps * 4;

template <int PER>
__device__ __forceinline__ void load_bf16_vals(float (&f)[PER], const bf16* p) {
  if constexpr (PER % 8 == 0) {
#pragma unroll
    for (int i = 0; i < PER / 8; i++)
      bf16x8_to_f32(reinterpret_cast<const uint4*>(p)[i], f + 8 * i);
  } else if constexpr (PER == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
    const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  } else if constexpr (PER == 2) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    f[0] = a.x, f[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < PER; i++) f[i] = __bfloat162float(p[i]);
  }
}

// The CCA finish folded into the attention (kFin, DecodeTuning::attn_finish): what
// decode_qkv_finish reads and writes besides q, which then never leaves shared memory.
struct AttnFinishArgs {
  const float* conv = nullptr;  // [M, C] convolution outputs
  const bf16* qkv = nullptr;    // rows q0 | k0 | v_cur | v_del, stride ld
  int64_t ld = 0;
  const float* temp = nullptr;        // [Hkv] key temperatures
  bf16 *kc = nullptr, *vc = nullptr;  // the caches (the kernel's kcache, vcache), written at pos
  float* vd_last = nullptr;           // [M, VH]
  float* hist = nullptr;              // [M, P, C] or null
  int P = 0;
  float theta = 0.f;
  int r = 0;
};
// Shared memory of the folded finish after the attention's own arrays: the group's G + 1 heads
// before the rotation ([G + 1][D] floats), their scales (G + 1 <= kAttnMaxG + 1, in 16 floats,
// which keeps what follows 64-byte aligned), and the new key and value rows as the cache holds
// them (2·D bf16 = D floats).
constexpr int kAttnFinishScales = 16;
static_assert(kAttnFinishScales >= kAttnMaxG + 1, "a scale per head of the group and the key");
__host__ __device__ constexpr int attn_finish_floats(int G, int D) {
  return (G + 1) * D + kAttnFinishScales + D;
}

// The finish of kv head g's group for row m by the whole block, into shared memory (kFin): the
// mean skip, QK-norm and RoPE of the G query heads, whose rounded values land in qs pre-scaled as
// the attention reads q (float(bf16(·))·scale), and of the key head, whose cache row lands in kn;
// the value row of the new token in vn — those two only when `own` (the block whose chunk holds
// pos: the previous token's delayed values it reads are overwritten by that block alone). The same
// per-element arithmetic as qkv_finish_head and qkv_finish_value (the same bits).
template <int D>
__device__ __forceinline__ void attn_finish_group(float* qs, bf16* kn, bf16* vn, float* vb,
                                                  const AttnFinishArgs& f, bool own, int m, int g,
                                                  int G, int Hq, int Hkv, int64_t pos,
                                                  const RopePre& pre, float temp_g, float scale,
                                                  int warp, int lane, int nwarps) {
  const int QD = Hq * D, KD = Hkv * D, C = QD + KD, VH = KD / 2;
  const bf16* row = f.qkv + int64_t(m) * f.ld;
  const float* cv = f.conv + int64_t(m) * C;
  float* sc = vb + (G + 1) * D;    // the heads' scales
  const int nh = own ? G + 1 : G;  // the key head (index G) only for the owner
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float k0 = __bfloat162float(row[QD + g * D + j]);
    float sk = 0.f;
    for (int t = 0; t < G; t++) {
      const int h = g * G + t;
      const float mq = (__bfloat162float(row[h * D + j]) + k0) * 0.5f;
      vb[t * D + j] = cv[h * D + j] + mq;
      sk += mq;
    }
    if (own) {
      vb[G * D + j] = cv[QD + g * D + j] + sk / float(G);
      const int e = g * D + j;  // this element of the value row
      vn[j] = e < VH ? row[C + e] : __float2bfloat16(f.vd_last[int64_t(m) * VH + e - VH]);
    }
  }
  __syncthreads();
  for (int t = warp; t < nh; t += nwarps) {
    float ss = 0.f;
    for (int j = lane; j < D; j += kWarp) ss = qk_square_acc(vb[t * D + j], ss);
    ss = warp_sum(ss);
    if (lane == 0) sc[t] = qk_scale(ss, t < G ? 1.f : temp_g, D);
  }
  __syncthreads();
  const int h2 = f.r / 2;
  for (int j = threadIdx.x, i = 0; j < D; j += blockDim.x, i++) {
    if (j >= h2 && j < f.r) continue;  // the second of a pair: done by its first
    float c = 1.f, s = 0.f;
    if (j < h2) {
      if (i < kRopePre)
        c = pre.c[i], s = pre.s[i];
      else
        rope_angle(c, s, pos, f.theta, f.r, j);
    }
    for (int t = 0; t < nh; t++) {
      const float a = sc[t];
      bf16 y0, y1;
      if (j < h2)
        rope_rotate(vb[t * D + j], vb[t * D + j + h2], a, c, s, y0, y1);
      else
        y0 = __float2bfloat16(__fmul_rn(vb[t * D + j], a));
      if (t < G) {
        qs[t * D + j] = __bfloat162float(y0) * scale;
        if (j < h2) qs[t * D + j + h2] = __bfloat162float(y1) * scale;
      } else {
        kn[j] = y0;
        if (j < h2) kn[j + h2] = y1;
      }
    }
  }
  __syncthreads();
}

// kG > 0: the query heads per kv head fixed at compile time (the loops over heads then hold kG
// heads' code instead of kAttnMaxG's with a runtime bound; the same arithmetic); 0: Hq / Hkv.
// kFin: the CCA finish of the block's group folded in (AttnFinishArgs; the split form only): every
// visible block finishes its group's heads itself after the wait (q never goes through memory),
// uses the new key and value from shared memory for the token at pos, and the block whose chunk
// holds pos writes them to the caches, moves the group's delayed values on and advances the
// group's convolution history — what decode_qkv_finish does, the same bits.
template <int D, int kPipe, int kW, bool kCluster, int kG = 0, bool kFin = false>
__global__ void __launch_bounds__(kW* kWarp)
    decode_attn_kernel(bf16* o, float* part_o, float* part_ml, unsigned* counters, const bf16* q,
                       const bf16* kcache, const bf16* vcache, const int32_t* len, int64_t cap,
                       int64_t window, int Hq, int Hkv, int ch, int nchunks, int flag_at,
                       int stage_chunks, int cbuf_at, AttnFinishArgs fin, int trigger_at) {
  static_assert(!(kFin && kCluster), "the finish folds into the split form only");
  constexpr int PER = D / 8;     // key values per lane in the score pass
  constexpr int PV = D / kWarp;  // value dims per lane in the P·V pass
  constexpr int kThreads = kW * kWarp;
  constexpr int kKeysPerPass = kW * 4;
  extern __shared__ __align__(16) float sh[];
  const int c = blockIdx.x, g = blockIdx.y, m = blockIdx.z;
  // kCluster: the chunks of (g, m) are one thread-block cluster (chunk c = block rank c), and each
  // block writes its partials straight into the shared memory of rank 0 (cml: [G][nchunks] (max,
  // sum) pairs, cpart: [G][nchunks][D]; the same offset cbuf_at in every block), which combines
  // them after one cluster barrier — no global partials, fence or counter.
  if constexpr (kCluster) cl_arrive();  // paired with the wait before the first remote write
  float* const cml = sh + cbuf_at;
  float* const cpart = cml + 2 * (Hq / Hkv) * nchunks;
  {
    // Before pdl_wait: this chunk's K and V rows of kv head g towards L2 (a hint, issued for the
    // whole chunk since len is not read yet). Earlier tokens' rows are final; the newest one, which
    // the predecessor writes, is read after the wait through L2, where the write lands.
    constexpr int kLines = D * int(sizeof(bf16)) / 128;  // 128-byte lines per key row
    const int64_t row = int64_t(Hkv) * D;
    for (int i = threadIdx.x; i < 2 * ch * (kLines > 0 ? kLines : 1); i += kThreads) {
      const int per = kLines > 0 ? kLines : 1;
      const int64_t key = int64_t(c) * ch + i / (2 * per);
      if (key >= cap) break;
      const bf16* base =
          (i % 2 ? vcache : kcache) + (int64_t(m) * cap + key) * row + int64_t(g) * D;
      prefetch_l2(base + (i / 2 % per) * 64);
    }
  }
  // len is written only by the last launch of a step (advance_lengths), which completed before the
  // previous kernel could start (see the PDL rules above), so it is final here: read before the
  // wait.
  const int64_t pos = __ldcg(len + m);  // the new token (already in the cache) is at pos
  // kFin: the rotations at pos and the key temperature (a weight) before the wait too.
  RopePre rpre{};
  float temp_g = 1.f;
  if constexpr (kFin) {
    rpre = rope_pre(pos, fin.theta, fin.r);
    temp_g = fin.temp[g];
  }
  // trigger_at (DecodeTuning::attn_trigger): where the block lets the o projection start — 0 right
  // after the wait (rule 3 above), 1 once its scores are in shared memory, 2 once its partials are
  // stored. Later triggers keep the o projection's prologue (4 MB of weight rows at ZAYA1's size)
  // out of the memory system while this kernel's own dependent loads are on the critical path.
  // q and the cache come from earlier kernels
  trigger_at == 0 ? pdl_begin(DecodeTraceEvent::Attention)
                  : pdl_begin_late(DecodeTraceEvent::Attention);
  if constexpr (kCluster) cl_wait();  // every block of the cluster has started
  constexpr int kGMax = kG > 0 ? kG : kAttnMaxG;
  const int G = kG > 0 ? kG : Hq / Hkv;
  const int64_t lo = window > 0 ? (pos - window + 1 > 0 ? pos - window + 1 : 0) : 0;
  const int64_t k0 = int64_t(c) * ch;
  const int64_t kb = k0 > lo ? k0 : lo;
  const int64_t ke = (k0 + ch < pos + 1) ? k0 + ch : pos + 1;
  const int64_t slot = (int64_t(m) * Hq + int64_t(g) * G) * nchunks + c;  // + t·nchunks per head
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* qs = sh;           // [G, D]
  float* sc = qs + G * D;   // [G, ch]
  float* po = sc + G * ch;  // [warps, G, D]
  unsigned* flag = reinterpret_cast<unsigned*>(sh + flag_at);
  const int64_t row = int64_t(Hkv) * D;  // elements between consecutive keys in the cache
  if (kb < ke) {
    const float scale = rsqrtf(float(D));
    const int n = int(ke - kb);
    const bf16* kbase = kcache + (int64_t(m) * cap + kb) * row + int64_t(g) * D;
    const bf16* vbase = vcache + (int64_t(m) * cap + kb) * row + int64_t(g) * D;
    const int grp = lane / 8, sub = lane % 8;
    // The loads of one round trip, issued together right after the wait: the first kPipe passes'
    // K rows, the first kVPre value rows of this warp's P·V share, and q (into shared memory).
    // kPipe passes of 16 keys at a time: their K rows are loaded together, then scored pass by
    // pass in the same order. A group past the chunk's end reads key 0 again (all lanes stay
    // converged for the shuffles) and stores nothing.
    // kFin: the new token's key and value rows (index jpos of the chunk, if it holds pos) come
    // from shared memory, where the folded finish puts them; the loads issued before it are
    // patched once it is done.
    float* const fvb = po + kW * G * D;  // kFin: attn_finish_floats(G, D) floats
    bf16* const kn = reinterpret_cast<bf16*>(fvb + (G + 1) * D + kAttnFinishScales);
    bf16* const vn = kn + D;
    const int jpos = kFin && pos >= kb && pos < ke ? int(pos - kb) : -1;
    float kf[kPipe][PER];
    auto load_k = [&](int j0) {
#pragma unroll
      for (int p = 0; p < kPipe; p++) {
        const int j = j0 + p * kKeysPerPass + warp * 4 + grp;
        const int64_t at = int64_t(j < n ? j : 0) * row + sub * PER;
        load_bf16_vals<PER>(kf[p], kFin && j == jpos ? kn + sub * PER : kbase + at);
        prefetch_l2(vbase + at);  // the P·V pass reads this row next
      }
    };
    load_k(0);
    constexpr int kVPre = 8;  // the P·V keys warp, warp + 4, ... loaded before the scores
    float vpre[kVPre][PV];
#pragma unroll
    for (int i = 0; i < kVPre; i++) {
      const int j = warp + i * kW;
      if (j < n) load_bf16_vals<PV>(vpre[i], vbase + int64_t(j) * row + lane * PV);
    }
    if constexpr (kFin) {
      attn_finish_group<D>(qs, kn, vn, fvb, fin, jpos >= 0, m, g, G, Hq, Hkv, pos, rpre, temp_g,
                           scale, warp, lane, kW);
      if (jpos >= 0) {  // the rows loaded above for key jpos were the cache's old ones
#pragma unroll
        for (int p = 0; p < kPipe; p++)
          if (p * kKeysPerPass + warp * 4 + grp == jpos) load_bf16_vals<PER>(kf[p], kn + sub * PER);
#pragma unroll
        for (int i = 0; i < kVPre; i++)
          if (warp + i * kW == jpos) load_bf16_vals<PV>(vpre[i], vn + lane * PV);
        // This block owns the new token of (g, m): its cache rows, the group's share of the
        // delayed values (read above by the thread that overwrites them) and the group's
        // convolution history (the convolutions, a launch back, have read it).
        const int QD = Hq * D, KD = Hkv * D, C = QD + KD, VH = KD / 2;
        const bf16* qrow = fin.qkv + int64_t(m) * fin.ld;
        const int64_t at = ((int64_t(m) * cap + pos) * Hkv + g) * D;
        for (int j = threadIdx.x; j < D; j += kThreads) {
          fin.kc[at + j] = kn[j];
          fin.vc[at + j] = vn[j];
          const int e = g * D + j;
          if (e >= VH) fin.vd_last[int64_t(m) * VH + e - VH] = __bfloat162float(qrow[C + e]);
          if (fin.hist && fin.P > 0) {
            for (int t = 0; t < G; t++)
              conv_hist_advance(fin.hist, qrow, fin.P, C, m, (g * G + t) * D + j);
            conv_hist_advance(fin.hist, qrow, fin.P, C, m, QD + g * D + j);
          }
        }
      }
    } else {
      for (int i = threadIdx.x; i < G * D; i += kThreads)
        qs[i] = __bfloat162float(q[(int64_t(m) * Hq + int64_t(g) * G) * D + i]) * scale;
      __syncthreads();
    }
    for (int j0 = 0; j0 < n; j0 += kPipe * kKeysPerPass) {
      if (j0 > 0) load_k(j0);
#pragma unroll
      for (int p = 0; p < kPipe; p++) {
        const int j = j0 + p * kKeysPerPass + warp * 4 + grp;
#pragma unroll
        for (int t = 0; t < kGMax; t++) {
          if (t >= G) break;
          const float* qt = qs + t * D + sub * PER;
          float s = 0.f;
#pragma unroll
          for (int e = 0; e < PER; e++) s = fmaf(qt[e], kf[p][e], s);
          s += __shfl_xor_sync(0xffffffffu, s, 4);
          s += __shfl_xor_sync(0xffffffffu, s, 2);
          s += __shfl_xor_sync(0xffffffffu, s, 1);
          if (sub == 0 && j < n) sc[t * ch + j] = s;
        }
      }
    }
    __syncthreads();
    if (trigger_at == 1) pdl_trigger();
    trace_mark(trace_ptr(), DecodeTraceEvent::AttnScores);  // block (0, 0, 0)
    // Per head: max and sum over the chunk (one warp per head), probabilities in place.
    for (int t = warp; t < G; t += kW) {
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
        if constexpr (kCluster) {
          float* r = cl_map(cml, 0) + 2 * (t * nchunks + c);
          r[0] = mx, r[1] = sum;
        } else {
          part_ml[2 * (slot + int64_t(t) * nchunks)] = mx;
          part_ml[2 * (slot + int64_t(t) * nchunks) + 1] = sum;
        }
      }
    }
    __syncthreads();
    // P·V: warps split the keys, lanes the head dim; then the warps' sums are added in order.
    float acc[kGMax][PV];
#pragma unroll
    for (int t = 0; t < kGMax; t++)
#pragma unroll
      for (int e = 0; e < PV; e++) acc[t][e] = 0.f;
    // Keys in the same order as ever (warp, warp + 4, ...): the preloaded rows, then the rest.
    auto pv_key = [&](int j, const float(&vf)[PV]) {
#pragma unroll
      for (int t = 0; t < kGMax; t++) {
        if (t >= G) break;
        const float p = sc[t * ch + j];
#pragma unroll
        for (int e = 0; e < PV; e++) acc[t][e] = fmaf(p, vf[e], acc[t][e]);
      }
    };
#pragma unroll
    for (int i = 0; i < kVPre; i++)
      if (warp + i * kW < n) pv_key(warp + i * kW, vpre[i]);
#pragma unroll 4  // a warp's next 4 keys: their V loads in flight together
    for (int j = warp + kVPre * kW; j < n; j += kW) {
      float vf[PV];
      load_bf16_vals<PV>(vf,
                         kFin && j == jpos ? vn + lane * PV : vbase + int64_t(j) * row + lane * PV);
      pv_key(j, vf);
    }
    trace_mark(trace_ptr(), DecodeTraceEvent::AttnPV);  // block (0, 0, 0), its warp 0
#pragma unroll
    for (int t = 0; t < kGMax; t++) {
      if (t >= G) break;
#pragma unroll
      for (int e = 0; e < PV; e++) po[(warp * G + t) * D + lane * PV + e] = acc[t][e];
    }
    __syncthreads();
    float* const dst = kCluster ? cl_map(cpart, 0) + int64_t(c) * D : nullptr;
    for (int i = threadIdx.x; i < G * D; i += kThreads) {
      float s = 0.f;
      for (int w = 0; w < kW; w++) s += po[w * G * D + i];
      const int t = i / D, e = i % D;
      if constexpr (kCluster)
        dst[int64_t(t) * nchunks * D + e] = s;
      else
        part_o[(slot + int64_t(t) * nchunks) * D + e] = s;
    }
  }
  // Blocks without visible keys (and trigger_at 2) trigger here; every block triggers once.
  if (trigger_at == 2 || (trigger_at == 1 && kb >= ke)) pdl_trigger();
  trace_mark(trace_ptr(), DecodeTraceEvent::AttnPartials);  // block (0, 0, 0): chunk 0's stored
  if constexpr (kCluster) {
    // Every partial is in rank 0's shared memory once the barrier completes (release/acquire);
    // rank 0 combines, the others are done (nothing reads their shared memory).
    cl_sync();
    if (c != 0) return;
  } else {
    // Every block of (g, m) counts itself; the last one combines.
    __threadfence();
    __syncthreads();
    unsigned* counter = counters + int64_t(m) * Hkv + g;
    if (threadIdx.x == 0) *flag = atomicAdd(counter, 1u) == unsigned(gridDim.x) - 1u;
    __syncthreads();
    if (*flag == 0u) return;
    __threadfence();
    if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch (or graph replay)
  }
  trace_mark(trace_ptr(), DecodeTraceEvent::AttnCombine, g == 0 && m == 0);  // (g, m) = (0, 0)
  // The partials: global (loaded through L2, where the other blocks' stores landed) or, for the
  // cluster, this block's shared memory.
  auto ld = [&](const auto* p) { return kCluster ? *p : __ldcg(p); };
  // Combine the chunks holding visible keys: per head, the weights exp(max_c − max) of the chunks
  // and the total (one warp per head, fixed lane order), then each output in chunk order.
  const int c_lo = int(lo / ch), c_hi = int(pos / ch);
  float* wts = sh;                 // [G, nchunks]
  float* lsum = sh + G * nchunks;  // [G]
  // stage_chunks > 0: the visible chunks' partial rows, when that many fit, copied into shared
  // memory (after wts and lsum, 16-byte aligned) with cp.async now, so that their round trip runs
  // beside the (max, sum) pass below instead of after it; the sums are the same either way.
  float* staged = sh + ((G * (nchunks + 1) + 3) / 4) * 4;  // [chunk - c_lo][G][D]
  // The form compiled for kG heads (the decode default) carries neither the staged path nor the
  // general (max, sum) loop below: its launcher takes it only without staging and for at most
  // kAttnExactMaxChunks chunks, so its code stays small (the code's size shows in the latency).
  const bool stage = kG == 0 && stage_chunks > 0 && c_hi - c_lo + 1 <= stage_chunks;
  if (stage) {
    const int n4 = G * D / 4;  // 16-byte pieces per chunk (all G heads)
    for (int i = threadIdx.x; i < (c_hi - c_lo + 1) * n4; i += kThreads) {
      const int cc = i / n4, t = i % n4 / (D / 4), q4 = i % (D / 4);
      cp_async16(
          staged + (int64_t(cc) * G + t) * D + 4 * q4,
          part_o + ((int64_t(m) * Hq + int64_t(g) * G + t) * nchunks + c_lo + cc) * D + 4 * q4);
    }
  }
  for (int t = warp; t < G; t += kW) {
    const float* ml = kCluster ? cml + 2 * int64_t(t) * nchunks
                               : part_ml + 2 * ((int64_t(m) * Hq + int64_t(g) * G + t) * nchunks);
    float mx = -INFINITY, l = 0.f;
    if (kG > 0 || c_hi - c_lo < kWarp * kAttnMlPerLane) {
      // Each lane's (max, sum) pairs loaded once, all in flight together (8-byte loads: ml is
      // 8-byte aligned), then the same max and sum in the same order as the general path below.
      float2 pr[kAttnMlPerLane];
#pragma unroll
      for (int q = 0; q < kAttnMlPerLane; q++) {
        const int cc = c_lo + lane + q * kWarp;
        pr[q] =
            cc <= c_hi ? ld(reinterpret_cast<const float2*>(ml) + cc) : make_float2(-INFINITY, 0.f);
      }
#pragma unroll
      for (int q = 0; q < kAttnMlPerLane; q++)
        if (c_lo + lane + q * kWarp <= c_hi) mx = fmaxf(mx, pr[q].x);
      mx = warp_max(mx);
#pragma unroll
      for (int q = 0; q < kAttnMlPerLane; q++) {
        const int cc = c_lo + lane + q * kWarp;
        if (cc > c_hi) break;
        const float w = pr[q].y > 0.f ? expf(pr[q].x - mx) : 0.f;
        wts[t * nchunks + cc] = w;
        l += pr[q].y * w;
      }
    } else {
      for (int cc = c_lo + lane; cc <= c_hi; cc += kWarp) mx = fmaxf(mx, ld(ml + 2 * cc));
      mx = warp_max(mx);
      for (int cc = c_lo + lane; cc <= c_hi; cc += kWarp) {
        const float lc = ld(ml + 2 * cc + 1);
        const float w = lc > 0.f ? expf(ld(ml + 2 * cc) - mx) : 0.f;
        wts[t * nchunks + cc] = w;
        l += lc * w;
      }
    }
    l = warp_sum(l);
    if (lane == 0) lsum[t] = l;
  }
  if (stage) cp_async_wait_all();
  __syncthreads();
  for (int i = threadIdx.x; i < G * D / 4; i += kThreads) {
    const int t = 4 * i / D, e = 4 * i % D;
    const int64_t base = (int64_t(m) * Hq + int64_t(g) * G + t) * nchunks;
    const float* const parts = kCluster ? cpart + int64_t(t) * nchunks * D : part_o + base * D;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (stage) {
      for (int cc = c_lo; cc <= c_hi; cc++) {
        const float w = wts[t * nchunks + cc];
        const float4 p =
            *reinterpret_cast<const float4*>(staged + (int64_t(cc - c_lo) * G + t) * D + e);
        a.x = fmaf(p.x, w, a.x), a.y = fmaf(p.y, w, a.y), a.z = fmaf(p.z, w, a.z),
        a.w = fmaf(p.w, w, a.w);
      }
    } else {
      // Unrolled so that 16 chunks' loads are in flight at once (the sum order is unchanged): at
      // ~65 chunks a loop that waits on each L2 round trip in turn costs several microseconds.
#pragma unroll 16
      for (int cc = c_lo; cc <= c_hi; cc++) {
        const float w = wts[t * nchunks + cc];
        const float4 p = ld(reinterpret_cast<const float4*>(parts + int64_t(cc) * D + e));
        a.x = fmaf(p.x, w, a.x), a.y = fmaf(p.y, w, a.y), a.z = fmaf(p.z, w, a.z),
        a.w = fmaf(p.w, w, a.w);
      }
    }
    const float l = lsum[t], r = l > 0.f ? 1.f / l : 0.f;
    bf16* dst = o + (int64_t(m) * Hq + int64_t(g) * G + t) * D + e;
    dst[0] = __float2bfloat16(a.x * r), dst[1] = __float2bfloat16(a.y * r);
    dst[2] = __float2bfloat16(a.z * r), dst[3] = __float2bfloat16(a.w * r);
  }
}

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
// must not alias h_in (the other blocks still read it). Uses: the post-attention norm with the
// router's down-projection sums (DecodeTuning::router_down_in_norm: out32 = r0, the router then
// starts from them), and the post-MLP norm with the next layer's q|k|v projection
// (DecodeTuning::qkv_norm_gemv: out16 = qkv).
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
//
// kNorm (with kVecX, kRegs and kAsync; DecodeTuning::router_norm): the post-attention residual
// norm `nin` computed by the cluster itself instead of a launch of its own before it. The norm
// kernel's 256 threads are spread over the cluster's blocks — block q plays threads
// [q·tpb, (q+1)·tpb), tpb = 256/cs, each thread the float4 groups t, t + 256, ... of
// decode_residual_norm_kernel — so each block reads only its share of the row (its five vectors
// copied into shared memory before the wait), stores that share of h_out and of x_out, and sends
// w ⊙ h' (the products the norm rounds before its rstd) and each played thread's sum of squares to
// every block with st.async. Every block then reduces the 256 sums in the norm kernel's order
// (a butterfly per warp of 32, then the 8 warps' sums in order), so rstd and x are the norm
// kernel's bits; the down projection reads x from shared memory.
__host__ __device__ inline int64_t router_norm_floats(int64_t cs, int64_t D) {
  const int64_t nk = (D / 4 + kRouterThreads - 1) / kRouterThreads;  // groups per played thread
  return 5 * (kRouterThreads / cs) * nk * 4 + D + kRouterThreads + (D + 1) / 2;
}
__host__ __device__ inline int64_t round4(int64_t n) {
  return (n + 3) / 4 * 4;
}

// kStageX (with kVecX, kRegs and kAsync, not kNorm; DecodeRouterLayout::stage_x): the block copies
// its row of x into shared memory once after the wait, beside its down-projection rows' loads, and
// its warps read x there (gemv_bf16's stage_x); the same sums.
// kPreR (with kRegs and kAsync, neither kNorm nor kStageX; DecodeTuning::router_down_in_norm): the
// down projection's sums r0 = x·W_down + b come from decode_norm_gemv_kernel, the launch before;
// every block loads all R of them and the EDA state, forms the full vector itself (its own rows
// stored as the next layer's state) and starts at the RMSNorm — no down-projection rows, no x and
// no first exchange. The same arithmetic in the same order: the same bits.
template <bool kVecX, bool kRegs, bool kAsync = false, bool kNorm = false, bool kStageX = false,
          bool kPreR = false>
__global__ void __launch_bounds__(kRouterThreads)
    decode_router_kernel(float* r, float* probs, int32_t* choice, float* gate, const bf16* x,
                         int64_t ldx, const bf16* Wd, const float* bd, const float* state,
                         const float* scale, const float* norm_w, float eps, const float* fc1_w,
                         const float* fc1_b, const float* fc2_w, const float* fc2_b,
                         const float* out_w, const float* bal, int D, int R, int E1, bool stage,
                         bool vec_w, DecodeNormIn nin, const float* r0) {
  static_assert(!kNorm || (kVecX && kRegs && kAsync), "the folded norm rides on the st.async form");
  static_assert(!kStageX || (kVecX && kRegs && kAsync && !kNorm), "x staged: the st.async form");
  static_assert(!kPreR || (kRegs && kAsync && !kNorm && !kStageX), "r0 given: the st.async form");
  extern __shared__ __align__(16) float sh[];
  constexpr bool kA = kAsync && kAsyncDsmem;
  constexpr bool kN = kNorm && kA;
  __shared__ __align__(8) uint64_t xbar[4];  // kA: v, h1, h2 (rank 0) complete; kN: the norm's
  const unsigned q = cl_rank(), cs = cl_size();
  if constexpr (kA) {
    if (threadIdx.x == 0) {
      if constexpr (!kPreR) xbar_init_expect(xbar + 0, unsigned(R) * 4u);
      xbar_init_expect(xbar + 1, unsigned(R) * 4u);
      if (q == 0) xbar_init_expect(xbar + 2, unsigned(R) * 4u);
      if constexpr (kN) xbar_init_expect(xbar + 3, unsigned(D + kRouterThreads) * 4u);
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
  // kN: the norm's shared memory after the layout above (w1.. unused: kRegs), its vectors now.
  const int tpb = kRouterThreads / int(cs);                              // norm threads played here
  const int nk = (D / 4 + kRouterThreads - 1) / kRouterThreads;          // their float4 groups
  float* const nv = sh + round4(router_smem_floats(R, E1, rpb, false));  // [5][tpb][nk][4]
  float* const wh = nv + 5 * tpb * nk * 4;                               // [D]: w ⊙ h'
  float* const ssp = wh + D;                                             // [256]: sums of squares
  bf16* const xs = reinterpret_cast<bf16*>(ssp + kRouterThreads);        // [D]: x
  const int vt = int(q) * tpb + int(threadIdx.x);  // the norm thread this one plays (< tpb)
  if constexpr (kN) {
    if (int(threadIdx.x) < tpb)
      for (int k = 0; k < nk; k++) {
        const int i = 4 * (vt + k * kRouterThreads);
        if (i >= D) break;
        const float* vecs[5] = {nin.hs, nin.hb, nin.rs, nin.rb, nin.norm_w};
#pragma unroll
        for (int j = 0; j < 5; j++)
          cp_async16(nv + ((j * tpb + int(threadIdx.x)) * nk + k) * 4, vecs[j] + i);
      }
  }
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
  if constexpr (kN) {
    // One pair of rows per warp (kRegs: rpb <= 2·kRouterWarps). Their loads come after the
    // norm's exchange, from L2 (hinted there before the wait): held in registers across it they
    // would take the block to ~220 registers a thread, and a block that large only becomes
    // resident on an SM with nothing else on it.
    const int o = o0 + warp, ob = o + kRouterWarps;
    const bool has_a = o < o1, has_b = ob < o1;
    const bf16* wa = Wd + int64_t(has_a ? o : o0) * D;
    const bf16* wb = Wd + int64_t(has_b ? ob : o0) * D;
    cl_wait();  // every peer has started: remote stores from here on
    waited = true;
    if (int(threadIdx.x) < tpb) {
      // Norm thread vt: its groups' h' and x as decode_residual_norm_kernel computes them.
      using kern::load4;
      float hv[kRowVec][4], av[kRowVec][4];
#pragma unroll
      for (int k = 0; k < kRowVec; k++) {
        const int i = 4 * (vt + k * kRouterThreads);
        if (k >= nk || i >= D) break;
        load4(nin.h_in + m * D + i, hv[k]), load4(nin.a + m * D + i, av[k]);
      }
      cp_async_wait_all();  // this thread's own vector copies
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < kRowVec; k++) {
        const int i = 4 * (vt + k * kRouterThreads);
        if (k >= nk || i >= D) break;
        const float* v0 = nv + (int(threadIdx.x) * nk + k) * 4;  // hs; then hb, rs, rb, w
        const int vs = tpb * nk * 4;
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          hv[k][e] =
              residual_elem(av[k][e], v0[vs + e], v0[e], hv[k][e], v0[3 * vs + e], v0[2 * vs + e]);
          ss = __fmaf_rn(hv[k][e], hv[k][e], ss);
          p[e] = __fmul_rn(v0[4 * vs + e], hv[k][e]);
        }
        kern::store4(nin.h_out + m * D + i, hv[k]);
        for (unsigned t = 0; t < cs; t++) st_async_f32x4(wh + i, xbar + 3, t, p);
      }
      for (unsigned t = 0; t < cs; t++) st_async_f32(ssp + vt, xbar + 3, t, ss);
    }
    xbar_wait(xbar + 3);
    trace_slot(ts, 1, DecodeTraceEvent::RouterSums);  // here: the norm's exchange complete
    // rstd as block_sum_rows reduces: each warp of 32 norm threads by butterfly, then in order.
    float tot = 0.f;
    for (int w = 0; w < kRouterThreads / kWarp; w++) tot += warp_sum(ssp[w * kWarp + lane]);
    const float rstd = norm_rstd(tot, D, nin.eps);
    for (int i = 4 * int(threadIdx.x); i < D; i += 4 * kRouterThreads) {
      float xv[4];
#pragma unroll
      for (int e = 0; e < 4; e++) xv[e] = __fmul_rn(wh[i + e], rstd);
      kern::store4(xs + i, xv);
      // x_out: this block's own groups (the SwiGLU and the skip path read it after this launch).
      const int g = i / 4 % kRouterThreads;
      if (g >= int(q) * tpb && g < int(q + 1) * tpb) kern::store4(nin.x_out + m * D + i, xv);
    }
    uint4 pa[kPreChunks], pb[kPreChunks];
    load_row_pieces(pa, wa, D, lane, has_a);
    load_row_pieces(pb, wb, D, lane, has_b);
    const float st_a = state && has_a ? state[m * R + o] : 0.f;
    const float st_b = state && has_b ? state[m * R + ob] : 0.f;
    __syncthreads();  // x complete in shared memory
    float acc[1] = {0.f}, accb[1] = {0.f};
    if (has_a) gemv_bf16_row_pre<1>(acc, pa, xs, 0, wa, D, lane);
    if (has_b) gemv_bf16_row_pre<1>(accb, pb, xs, 0, wb, D, lane);
    if (has_a) finish_row(o, acc[0], st_a);
    if (has_b) finish_row(ob, accb[0], st_b);
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
    const bf16* xr = stage_rows(x + m * ldx, 0, D, nv);  // [D] bf16
    float acc[1] = {0.f}, accb[1] = {0.f};
    if (has_a) gemv_bf16_row_pre<1>(acc, pa, xr, 0, wa, D, lane);
    if (has_b) gemv_bf16_row_pre<1>(accb, pb, xr, 0, wb, D, lane);
    if (has_a) finish_row(o, acc[0], st_a);
    if (has_b) finish_row(ob, accb[0], st_b);
  }
  for (int o = o0 + warp; !kN && !kStageX && !kPreR && o < o1; o += 2 * kRouterWarps) {
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
  pdl_begin(DecodeTraceEvent::Argmax);
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

__global__ void argmax_final_kernel(int32_t* out, const float* part_v, const int64_t* part_i,
                                    int32_t* hist, const int32_t* len) {
  pdl_begin(DecodeTraceEvent::ArgmaxFinal);
  const int64_t m = blockIdx.x;
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int s = threadIdx.x; s < kArgmaxSlices; s += blockDim.x)
    argmax_merge(bv, bi, part_v[m * kArgmaxSlices + s], part_i[m * kArgmaxSlices + s]);
  block_argmax(bv, bi);
  if (threadIdx.x == 0) {
    out[m] = int32_t(bi < 0 ? 0 : bi);
    if (hist) hist[int64_t(len[m]) * gridDim.x + m] = int32_t(bi < 0 ? 0 : bi);
  }
}

// The greedy step's end in two launches instead of four (DecodeTuning::fused_step_ends): the LM
// head's GEMV reduces each block's rows to one 64-bit key per sequence, (order-preserving bits of
// the logit) << 32 | ~index, and folds it into keys[m] with a fire-and-forget atomic max; so the
// largest logit wins and, among equal logits, the lowest index (argmax_rows' rule; −0 counts as +0,
// and a NaN logit outranks every number, where argmax_rows keeps whichever it met first). The
// logits themselves are the same bits as gemv_bf16's. token_commit then turns the key into the
// token (next input, token history), zeroes the key for the next step and advances the lengths.
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
  if (v == 0.f) v = 0.f;
  unsigned u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xFFFFFFFFu - unsigned(i));
}

// kPre (lm_head_greedy's prefetch): each warp's first kPreChunks pieces of its row loaded before
// the wait, as gemv_bf16_kernel's register prologue — so the blocks of the first wave, which
// start while the last residual norm still waits on the experts (its early trigger), have their
// rows in flight when x lands. The same bits. kStage (lm_head_greedy's stage_x): the block copies
// the M input rows into shared memory once after the wait and its warps read them there. kEF
// kWeightNoL1 (lm_head_greedy's no_l1): the streamed rows are not allocated in L1.
template <int M, int kEF = kWeightNormal, bool kPre = false, bool kStage = false>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    gemv_argmax_kernel(float* y32, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                       int64_t ldw, const float* bias, int64_t O, int64_t K,
                       unsigned long long* keys) {
  __shared__ unsigned long long best[M][kRowsPerBlock];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const bool live = o < O;
  const bf16* w = W + (live ? o : 0) * ldw;
  uint4 wpre[kPreChunks];
  if constexpr (kPre) load_row_pieces<kEF>(wpre, w, K, lane, live);
  pdl_begin(DecodeTraceEvent::Gemv);
  if constexpr (kStage) {
    extern __shared__ __align__(16) float lm_x_sh[];  // [M][K]
    x = stage_rows<M>(x, ldx, K, lm_x_sh), ldx = K;
  }
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  if constexpr (kPre) {
    if (live) gemv_bf16_row_pre<M, kEF>(acc, wpre, x, ldx, w, K, lane);
  } else {
    if (live) gemv_bf16_row<M, true, kEF>(acc, x, ldx, w, K, lane);
  }
#pragma unroll
  for (int m = 0; m < M; m++) {
    const float s = warp_sum(acc[m]) + (bias && live ? bias[o] : 0.f);  // as gemv_bf16_kernel
    if (lane == 0) {
      if (live && y32) y32[m * ldy + o] = s;
      best[m][warp] = live ? argmax_key(s, o) : 0ull;
    }
  }
  __syncthreads();
  if (threadIdx.x < M) {
    unsigned long long b = 0ull;
#pragma unroll
    for (int w = 0; w < kRowsPerBlock; w++) b = b > best[threadIdx.x][w] ? b : best[threadIdx.x][w];
    atomicMax(keys + threadIdx.x, b);
  }
}

// The LM head's greedy GEMV as a persistent grid (DecodeTuning::lm_head_persistent): as many
// blocks as fit on the device at once, each warp taking rows o, o + step, ... (step = the grid's
// warps) with the next row's loads in flight while it sums the current one, and one atomic max
// per block at the end — instead of ~32K blocks of one row per warp in ~31 waves, each block
// paying its start, its reduction and its atomic. Each row's sum is gemv_argmax_kernel's (the
// same pieces, the same fmaf chain, the same bias expression), and the key maximum does not
// depend on the order rows are visited, so logits and tokens are the same bits. kPre: the first
// row's loads issued before the wait (weights only).
template <int M, bool kPre>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    gemv_argmax_persistent_kernel(float* y32, int64_t ldy, const bf16* x, int64_t ldx,
                                  const bf16* W, int64_t ldw, const float* bias, int64_t O,
                                  int64_t K, unsigned long long* keys) {
  __shared__ unsigned long long best[M][kRowsPerBlock];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t step = int64_t(gridDim.x) * kRowsPerBlock;
  int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  unsigned long long b[M];
#pragma unroll
  for (int m = 0; m < M; m++) b[m] = 0ull;
  uint4 ra[kPreChunks], rb[kPreChunks];
  auto load = [&](uint4(&r)[kPreChunks], int64_t row) {
    load_row_pieces(r, W + (row < O ? row : 0) * ldw, K, lane, row < O);
  };
  if constexpr (kPre) load(ra, o);
  pdl_begin(DecodeTraceEvent::Gemv);
  if constexpr (!kPre) load(ra, o);
  // Row `row` from `cur`, with the loads of row + step into `nxt` issued first.
  auto row_step = [&](uint4(&cur)[kPreChunks], uint4(&nxt)[kPreChunks], int64_t row) {
    load(nxt, row + step);
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.f;
    gemv_bf16_row_pre<M>(acc, cur, x, ldx, W + row * ldw, K, lane);
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float s = warp_sum(acc[m]) + (bias ? bias[row] : 0.f);  // as gemv_argmax_kernel
      if (lane == 0 && y32) y32[m * ldy + row] = s;
      const unsigned long long k = argmax_key(s, row);
      b[m] = b[m] > k ? b[m] : k;
    }
  };
  while (o < O) {  // unrolled by two, so the two register sets swap roles without copies
    row_step(ra, rb, o);
    o += step;
    if (o >= O) break;
    row_step(rb, ra, o);
    o += step;
  }
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; m++) best[m][warp] = b[m];
  }
  __syncthreads();
  if (threadIdx.x < M) {
    unsigned long long v = 0ull;
#pragma unroll
    for (int w = 0; w < kRowsPerBlock; w++) v = v > best[threadIdx.x][w] ? v : best[threadIdx.x][w];
    atomicMax(keys + threadIdx.x, v);
  }
}

__global__ void token_commit_kernel(int32_t* ids, int32_t* hist, int32_t* len,
                                    unsigned long long* keys, int M) {
  pdl_begin(DecodeTraceEvent::Advance);
  const int m = threadIdx.x;
  if (m >= M) return;
  const unsigned long long k = keys[m];
  keys[m] = 0ull;
  const int32_t tok = k == 0ull ? 0 : int32_t(0xFFFFFFFFu - unsigned(k & 0xFFFFFFFFull));
  ids[m] = tok;
  if (hist) hist[int64_t(len[m]) * M + m] = tok;
  len[m] += 1;
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
  pdl_begin(DecodeTraceEvent::Advance);
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < B) len[b] += n;
}

void check(bool ok, const char* what) {
  if (!ok)
    ::zaya::detail::platform_fail("CUDA", "decode kernel arguments", __FILE__, __LINE__, what);
}

// Opts `kernel` into `bytes` of dynamic shared memory on the current device, once per kernel,
// device and size (the first decode step runs eagerly, so this happens outside graph captures).
void allow_dynamic_smem(const void* kernel, size_t bytes) {
  struct Done {
    const void* kernel;
    int device;
    size_t bytes;
  };
  static std::vector<Done> done;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  for (const Done& d : done)
    if (d.kernel == kernel && d.device == dev && d.bytes >= bytes) return;
  ZAYA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done.push_back({kernel, dev, bytes});
}

// The decode kernels' preferred shared-memory carveout (set_decode_smem_carveout): -1, the
// driver's choice per kernel, or a percentage of the largest shared-memory configuration that
// every decode launch asks for, so that consecutive kernels want the same L1/shared split. Applied
// as each kernel is launched (once per kernel, device and value; the first step after a change
// runs eagerly, so a captured step sets nothing).
int g_smem_carveout = -1;
void apply_carveout(const void* kernel) {
  struct Set {
    const void* kernel;
    int device, value;
  };
  static std::vector<Set> set;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  for (Set& e : set)
    if (e.kernel == kernel && e.device == dev) {
      if (e.value != g_smem_carveout) {
        ZAYA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             g_smem_carveout));
        e.value = g_smem_carveout;
      }
      return;
    }
  if (g_smem_carveout != -1)
    ZAYA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         g_smem_carveout));
  set.push_back({kernel, dev, g_smem_carveout});
}

// Programmatic dependent launch: used on devices of compute capability 9.0 and later unless
// switched off (set_decode_pdl(false), or ZAYA_DECODE_PDL=0 in the environment). Decided once
// per device on the first launch, which runs eagerly, so a captured step makes no such queries.
int g_pdl_setting = -1;              // -1: the environment decides; 0 off; 1 on where supported
bool g_weights_evict_first = false;  // set_decode_weights_evict_first

bool pdl_active() {
  static int cached_dev = -1, cached_setting = -2;
  static bool cached = false;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev == cached_dev && g_pdl_setting == cached_setting) return cached;
  int major = 0;
  ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  bool want = true;
  if (g_pdl_setting >= 0) {
    want = g_pdl_setting == 1;
  } else if (const char* e = std::getenv("ZAYA_DECODE_PDL")) {
    want = !(e[0] == '0' && e[1] == '\0');
  }
  cached = want && major >= 9;
  cached_dev = dev, cached_setting = g_pdl_setting;
  return cached;
}

// Launches a decode kernel on st, with the programmatic-stream-serialisation attribute where PDL
// is active (the kernel then follows the pdl_wait rules above); plain stream order otherwise. Under
// stream capture the attribute becomes a programmatic edge of the graph.
template <typename... KArgs, typename... Args>
void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
              Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl_active() ? 1 : 0;
  apply_carveout(reinterpret_cast<const void*>(kernel));
  ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The standalone residual norm's choice of the float4 form; the fused tails make the same one.
bool residual_norm_vec(int64_t D, std::initializer_list<const void*> ptrs) {
  return D % 4 == 0 && D <= 4 * kRowVec * kRowThreads && kern::vec4_ok(D, ptrs);
}

TailNorm tail_norm(const DecodeResidualNorm* rn, const bf16* a, int64_t D) {
  TailNorm t{};
  if (!rn) return t;
  check(rn->h && rn->y && rn->hs && rn->hb && rn->rs && rn->rb && rn->norm_w && rn->counters,
        "decode residual norm tail: every pointer is needed");
  t.h = rn->h, t.y = rn->y, t.hs = rn->hs, t.hb = rn->hb, t.rs = rn->rs, t.rb = rn->rb;
  t.w = rn->norm_w, t.eps = rn->eps, t.counters = rn->counters;
  t.vec = residual_norm_vec(D, {rn->h, rn->y, a, rn->hs, rn->hb, rn->rs, rn->rb, rn->norm_w});
  return t;
}

// Rows up to which the GEMV loads its weights into registers before pdl_wait: grids of about one
// wave (the o, qkv and router-sized products); the LM head's many waves keep the leaner kernel.
constexpr int64_t kPreMaxRows = 16384;

template <int M>
void launch_gemv_bf16(float* y32, bf16* y16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                      int64_t ldw, const float* bias, int64_t O, int64_t K, const TailNorm& tn,
                      cudaStream_t st, bool early, bool stage_x) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kRowsPerBlock * kWarp);
  const bool vec = K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && aligned16(x) && aligned16(W);
  // Staged input rows only where they fit the default 48 KB of dynamic shared memory.
  const size_t xs_bytes = size_t(M) * size_t(K) * sizeof(bf16);
  const bool stage = stage_x && vec && xs_bytes <= 48 * 1024;
  const bool pre = vec && O <= kPreMaxRows;
  const bool tail = tn.counters != nullptr;
#define ZAYA_GEMV_LAUNCH(V, P, T)                                                                \
  (stage ? launch_k(gemv_bf16_kernel<M, V, P, T, false, V>, grid, block, xs_bytes, st, y32, y16, \
                    ldy, x, ldx, W, ldw, bias, O, K, tn, DecodeNormIn{}, early)                  \
         : launch_k(gemv_bf16_kernel<M, V, P, T>, grid, block, 0, st, y32, y16, ldy, x, ldx, W,  \
                    ldw, bias, O, K, tn, DecodeNormIn{}, early))
  if (pre && !tail && !stage && g_weights_evict_first) {
    launch_k(gemv_bf16_kernel<M, true, true, false, false, false, true>, grid, block, 0, st, y32,
             y16, ldy, x, ldx, W, ldw, bias, O, K, tn, DecodeNormIn{}, early);
  } else if (tail) {
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
                              int64_t K, const DecodeNormIn& n, cudaStream_t st) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const auto kernel = gemv_bf16_kernel<M, true, true, false, true>;
  const size_t smem = norm_in_smem(M, K);
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch_k(kernel, grid, dim3(kRowsPerBlock * kWarp), smem, st, nullptr, y16, ldy, nullptr, K, W,
           ldw, nullptr, O, K, TailNorm{}, n, false);
}

template <int M>
void launch_gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                     int64_t ldw, const float* bias, int64_t O, int64_t K, cudaStream_t st) {
  const dim3 grid(unsigned((O + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kRowsPerBlock * kWarp);
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && aligned16(x) && aligned16(W);
  if (vec)
    launch_k(gemv_f32_kernel<M, true>, grid, block, 0, st, y, ldy, x, ldx, W, ldw, bias, O, K);
  else
    launch_k(gemv_f32_kernel<M, false>, grid, block, 0, st, y, ldy, x, ldx, W, ldw, bias, O, K);
}

// Calls f(std::integral_constant<int, M>{}) for a row count M in 1..kGemvMaxRows (the GEMV kernels
// are instantiated per row count).
template <typename F>
void with_rows(int64_t M, F&& f) {
  static_assert(kGemvMaxRows == 8, "one case per row count");
  switch (M) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
  }
}

void gemv_bf16_any(float* y_f32, bf16* y_bf16, int64_t ldy, const bf16* x, int64_t ldx,
                   const bf16* W, int64_t ldw, const float* bias, int64_t M, int64_t O, int64_t K,
                   const TailNorm& tn, cudaStream_t st, bool early = false, bool stage_x = false) {
  check(M >= 1 && M <= kGemvMaxRows && O > 0 && K > 0 && ldw >= K && ldx >= K && ldy >= O,
        "gemv_bf16: need 1 <= M <= 8, O, K > 0, ldw, ldx >= K, ldy >= O");
  with_rows(M, [&](auto n) {
    launch_gemv_bf16<decltype(n)::value>(y_f32, y_bf16, ldy, x, ldx, W, ldw, bias, O, K, tn, st,
                                         early, stage_x);
  });
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void set_decode_pdl(bool on) {
  g_pdl_setting = on ? 1 : 0;
}

void set_decode_smem_carveout(int percent) {
  check(percent >= -1 && percent <= 100,
        "decode shared-memory carveout: -1 (the driver's choice) or 0 to 100 percent");
  g_smem_carveout = percent;
}

void set_decode_weights_evict_first(bool on) {
  g_weights_evict_first = on;
}

bool decode_trace_built() {
  return ZAYA_DECODE_TRACE != 0;
}

void set_decode_trace(unsigned long long* buf, size_t capacity) {
#if ZAYA_DECODE_TRACE
  const unsigned long long cap = buf ? capacity : 0;
  ZAYA_CUDA_CHECK(cudaMemcpyToSymbol(c_trace, &buf, sizeof(buf)));
  ZAYA_CUDA_CHECK(cudaMemcpyToSymbol(c_trace_cap, &cap, sizeof(cap)));
#else
  (void)capacity;
  check(buf == nullptr,
        "decode trace: this build has no decode tracing (configure with -DZAYA_DECODE_TRACE=ON; "
        "it stays out of the default build, whose kernels it would slow)");
#endif
}

const char* decode_trace_event_name(DecodeTraceEvent ev) {
  switch (ev) {
    case DecodeTraceEvent::Gemv: return "gemv";
    case DecodeTraceEvent::GemvF32: return "gemv_f32";
    case DecodeTraceEvent::ExpertSwiglu: return "expert_swiglu";
    case DecodeTraceEvent::ExpertDown: return "expert_down";
    case DecodeTraceEvent::ExpertActDone: return "expert_act_done";
    case DecodeTraceEvent::CcaConv: return "cca_conv";
    case DecodeTraceEvent::CcaFinish: return "cca_finish";
    case DecodeTraceEvent::Attention: return "attention";
    case DecodeTraceEvent::AttnScores: return "attn_scores";
    case DecodeTraceEvent::AttnPV: return "attn_pv";
    case DecodeTraceEvent::AttnPartials: return "attn_partials";
    case DecodeTraceEvent::AttnCombine: return "attn_combine";
    case DecodeTraceEvent::Norm: return "residual_norm";
    case DecodeTraceEvent::Router: return "router";
    case DecodeTraceEvent::RouterSums: return "router_sums";
    case DecodeTraceEvent::RouterDown: return "router_down";
    case DecodeTraceEvent::RouterFc1: return "router_fc1";
    case DecodeTraceEvent::RouterFc2: return "router_fc2";
    case DecodeTraceEvent::RouterLogits: return "router_logits";
    case DecodeTraceEvent::RouterSelect: return "router_select";
    case DecodeTraceEvent::Argmax: return "argmax";
    case DecodeTraceEvent::ArgmaxFinal: return "argmax_final";
    case DecodeTraceEvent::Advance: return "advance";
    case DecodeTraceEvent::Count: break;
  }
  return "?";
}

bool decode_pdl_active() {
  return pdl_active();
}

size_t decode_tail_counter_bytes() {
  return size_t(2 * kGemvMaxRows + 1) * sizeof(unsigned);
}

void gemv_bf16(float* y_f32, bf16* y_bf16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
               int64_t ldw, const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st,
               bool early_trigger, bool stage_x) {
  gemv_bf16_any(y_f32, y_bf16, ldy, x, ldx, W, ldw, bias, M, O, K, TailNorm{}, st, early_trigger,
                stage_x);
}

bool decode_norm_in_supported(const DecodeNormIn& n, int64_t M, int64_t D) {
  return M >= 1 && M <= kGemvMaxRows && D % 8 == 0 && D <= 4 * kRowVec * kRowThreads &&
         norm_in_smem(M, D) <= 144 * 1024 && n.h_in && n.h_out && n.a && n.hs && n.hb && n.rs &&
         n.rb && n.norm_w && n.h_in != n.h_out &&
         kern::vec4_ok(D, {n.h_in, n.h_out, n.a, n.hs, n.hb, n.rs, n.rb, n.norm_w, n.x_out});
}

void gemv_bf16_norm_in(bf16* y_bf16, int64_t ldy, const bf16* W, int64_t ldw, int64_t M, int64_t O,
                       int64_t K, const DecodeNormIn& n, cudaStream_t st) {
  check(decode_norm_in_supported(n, M, K) && y_bf16 && O > 0 && ldw >= K && ldy >= O &&
            ldw % 8 == 0 && aligned16(W),
        "gemv_bf16_norm_in: needs decode_norm_in_supported(n, M, K) and 16-byte aligned W rows");
  with_rows(M, [&](auto r) {
    launch_gemv_bf16_norm_in<decltype(r)::value>(y_bf16, ldy, W, ldw, O, K, n, st);
  });
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void gemv_bf16_residual_norm(bf16* a_MO, const bf16* x, int64_t ldx, const bf16* W, int64_t ldw,
                             int64_t M, int64_t O, int64_t K, const DecodeResidualNorm& rn,
                             cudaStream_t st) {
  check(a_MO != nullptr, "gemv_bf16_residual_norm: needs the bf16 output");
  gemv_bf16_any(nullptr, a_MO, O, x, ldx, W, ldw, nullptr, M, O, K, tail_norm(&rn, a_MO, O), st);
}

void gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W, int64_t ldw,
              const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st) {
  check(M >= 1 && M <= kGemvMaxRows && O > 0 && K > 0 && ldw >= K && ldx >= K && ldy >= O,
        "gemv_f32: need 1 <= M <= 8, O, K > 0, ldw, ldx >= K, ldy >= O");
  with_rows(M, [&](auto n) {
    launch_gemv_f32<decltype(n)::value>(y, ldy, x, ldx, W, ldw, bias, O, K, st);
  });
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

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
                    bool down_l2, bool stage_x, int down_rows) {
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
               expert_fused_smem(M, I), st, out_MD, act_MI, x_MD, D, gate_up_E2ID, 2 * I * D,
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
  const bool stage = stage_x && vec && !rn && !g_weights_evict_first && !down_smem && !down_l2 &&
                     std::max(D, I) * int64_t(sizeof(bf16)) <= 48 * 1024;
  if (stage) {
    launch_k(expert_swiglu_kernel<true, false, false, true>, g1, block, size_t(D) * sizeof(bf16),
             st, act_MI, x_MD, D, gate_up_E2ID, 2 * I * D, choice_M, E, I, D, down_EDI, D * I, D);
    const auto down_k =
        down_rows == 2   ? expert_down_combine_kernel<true, false, false, false, true, 2>
        : down_rows == 4 ? expert_down_combine_kernel<true, false, false, false, true, 4>
                         : expert_down_combine_kernel<true, false, false, false, true>;
    const dim3 g2r{unsigned((D + down_rows - 1) / down_rows), unsigned(M)};
    launch_k(down_k, g2r, dim3(down_rows * kWarp), size_t(I) * sizeof(bf16), st, out_MD, act_MI,
             x_MD, down_EDI, D * I, gate_M, choice_M, E, skip_scaled_input, D, I, tn);
    ZAYA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const auto down = vec ? (rn                      ? expert_down_combine_kernel<true, true>
                           : g_weights_evict_first ? expert_down_combine_kernel<true, false, true>
                           : down_smem ? expert_down_combine_kernel<true, false, false, true>
                                       : expert_down_combine_kernel<true, false>)
                        : (rn ? expert_down_combine_kernel<false, true>
                              : expert_down_combine_kernel<false, false>);
  const auto swiglu = !vec                    ? expert_swiglu_kernel<false>
                      : g_weights_evict_first ? expert_swiglu_kernel<true, true>
                      : down_l2               ? expert_swiglu_kernel<true, false, true>
                                              : expert_swiglu_kernel<true>;
  launch_k(swiglu, g1, block, 0, st, act_MI, x_MD, D, gate_up_E2ID, 2 * I * D, choice_M, E, I, D,
           down_EDI, D * I, D);
  launch_k(down, g2, block, 0, st, out_MD, act_MI, x_MD, down_EDI, D * I, gate_M, choice_M, E,
           skip_scaled_input, D, I, tn);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

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
                        int64_t t1, cudaStream_t st) {
  check(decode_conv_finish_supported(M, Hq, Hkv, d, t0, t1, r, wg_Cdt1) && P == (t0 - 1) + (t1 - 1),
        "decode_conv_finish: needs decode_conv_finish_supported and P = (t0 - 1) + (t1 - 1)");
  const int64_t VH = Hkv * d / 2, threads = int64_t(kConvFinWarps) * kWarp;
  const int64_t X = (VH + threads - 1) / threads;
  const int nv = conv_nv(d * t1, wg_Cdt1);
  const auto kernel = nv == 1   ? decode_conv_finish_kernel<1>
                      : nv == 2 ? decode_conv_finish_kernel<2>
                                : decode_conv_finish_kernel<0>;
  launch_k(kernel, dim3(unsigned(Hq + Hkv + X)), dim3(unsigned(threads)),
           conv_finish_smem(M, d, t1), st, q_MHd, kcache, vcache, vd_last_B, hist_BPC, qkv, ld,
           wdw_Ct0, bdw_C, wg_Cdt1, bg_C, temp_G, len_B, cap, theta, int(r), int(M), int(Hq),
           int(Hkv), int(d), int(t0), int(t1));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_conv(float* y_MC, const bf16* qkv, int64_t ld, const float* hist_BPC,
                 const float* wdw_Ct0, const float* bdw_C, const float* wg_Cdt1, const float* bg_C,
                 int64_t M, int64_t C, int64_t d, int64_t t0, int64_t t1, cudaStream_t st) {
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
  launch_k(kernel, dim3(grid), dim3(kConvWarps * kWarp), smem, st, y_MC, qkv, ld, hist_BPC, wdw_Ct0,
           bdw_C, wg_Cdt1, bg_C, int(M), int(C), int(d), int(t0), int(t1));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_qkv_finish(bf16* q_MHd, bf16* kcache, bf16* vcache, float* vd_last_B, float* hist_BPC,
                       int64_t P, const float* conv_MC, const bf16* qkv, int64_t ld,
                       const float* temp_G, const int32_t* len_B, int64_t cap, float theta,
                       int64_t r, int64_t M, int64_t Hq, int64_t Hkv, int64_t d, cudaStream_t st) {
  check(Hq % Hkv == 0 && r % 2 == 0 && r <= d && (Hkv * d) % 2 == 0,
        "decode_qkv_finish: heads must divide, rotary dim even and <= head dim");
  const int64_t C = (Hq + Hkv) * d, VH = Hkv * d / 2;
  const int64_t X = (std::max(C, VH) + kQkvThreads - 1) / kQkvThreads;
  const size_t smem = size_t(d + 1) * sizeof(float);
  launch_k(decode_qkv_finish_kernel, dim3(unsigned(Hq + Hkv + X), unsigned(M)), dim3(kQkvThreads),
           smem, st, q_MHd, kcache, vcache, vd_last_B, conv_MC, qkv, ld, temp_G, len_B, cap, theta,
           int(r), int(Hq), int(Hkv), int(d), hist_BPC, int(P));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

// Keys per split-context block: a multiple of 16 (one pass of the block), the smallest that keeps
// the blocks of all sequences and kv heads to about one per SM (128), at most 256 so the scores fit
// shared memory. Each 16-key pass is a dependent round trip of the block and each chunk a partial
// the combine reads: on the H200 at 1,097 keys (8 ZAYA1-base layers, batch 1), 32 keys per chunk
// (70 blocks) gave 0.695 ms per decode step, 16 (138 blocks) 0.701, 64 0.721, 128 0.792, 256
// 0.917 (docs/bench/h200-2026-12-03g).
constexpr int kAttnMaxChunk = 256;
constexpr int64_t kAttnStageBytes = 96 * 1024;  // staged partial rows of the combine (at most)
constexpr int kAttnTargetBlocks = 128;

int attn_chunk(int64_t M, int64_t Hkv, int64_t cap) {
  int ch = kAttnKeysPerPass;
  while (ch < kAttnMaxChunk && (cap + ch - 1) / ch * Hkv * M > kAttnTargetBlocks) ch *= 2;
  return ch;
}

// Workspace: the (m, g) counters first (room for kGemvMaxRows sequences of up to Hq kv heads, so
// the offset does not depend on M), then the partial outputs and their (max, sum).
size_t attn_counter_bytes(int64_t Hq) {
  return size_t((kGemvMaxRows * Hq * 4 + 255) / 256 * 256);
}

size_t decode_attention_workspace_bytes(int64_t M, int64_t Hq, int64_t d, int64_t cap) {
  // The largest chunk count any batch up to M takes (smaller batches may use smaller chunks).
  const int64_t nchunks = (cap + kAttnKeysPerPass - 1) / kAttnKeysPerPass;
  return attn_counter_bytes(Hq) + size_t(M * Hq * nchunks * (d + 2)) * sizeof(float);
}

// The cluster form of decode_attention (DecodeTuning::attn_cluster): 16 warps per block, the
// chunks of each (kv head, sequence) one thread-block cluster of up to 16 blocks (every key in one
// chunk per block), combined in rank 0's shared memory. Returns false (nothing launched) where
// the device cannot schedule it or the chunks would exceed kAttnClusterMaxChunk keys.
constexpr int kAttnClusterWarps = 16;
constexpr int kAttnClusterMaxChunk = 1024;

// The cluster size, chunk and shared-memory layout the device takes for (D, G, cap), found once
// (the cluster-size query and the attribute calls cost host time on every eager step otherwise).
struct AttnClusterPlan {
  int device = -1, d = 0;
  int64_t G = 0, cap = 0;
  int cs = 0;  // 0: the cluster form does not fit this device
  int64_t ch = 0, cbuf_at = 0, floats = 0;
};

template <int D>
bool launch_attn_cluster(bf16* o_MHd, const bf16* q_MHd, const bf16* kcache, const bf16* vcache,
                         const int32_t* len_B, int64_t cap, int64_t window, int64_t M, int64_t Hq,
                         int64_t Hkv, cudaStream_t st) {
  const int64_t G = Hq / Hkv;
  const auto kernel = decode_attn_kernel<D, 2, kAttnClusterWarps, true>;
  static AttnClusterPlan plan;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  if (plan.device != dev || plan.d != D || plan.G != G || plan.cap != cap) {
    AttnClusterPlan p;
    p.device = dev, p.d = D, p.G = G, p.cap = cap;
    int major = 0, max_smem = 0;
    ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ZAYA_CUDA_CHECK(
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (major >= 9)
      ZAYA_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (int cs : {16, 8}) {
      if (major < 9) break;
      const int64_t ch = ((cap + cs - 1) / cs + 15) / 16 * 16;
      if (ch > kAttnClusterMaxChunk) break;
      // [qs G·D | scores G·ch | per-warp outputs W·G·D] (the combine's weights G·(cs + 1) reuse
      // the start), then the cluster's partials at cbuf_at: (max, sum) [G][cs], outputs
      // [G][cs][D], then the (unused) flag.
      const int64_t main =
          std::max<int64_t>(G * D + G * ch + kAttnClusterWarps * G * D, G * (cs + 1));
      const int64_t cbuf_at = (main + 3) / 4 * 4;
      const int64_t floats = cbuf_at + 2 * G * cs + G * cs * D + 1;
      const size_t smem = size_t(floats) * sizeof(float);
      if (smem > size_t(max_smem)) continue;
      ZAYA_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = unsigned(cs), at[0].val.clusterDim.y = 1;
      at[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(unsigned(cs), 1, 1);
      cfg.blockDim = dim3(kAttnClusterWarps * kWarp, 1, 1);
      cfg.dynamicSmemBytes = smem;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) == cudaSuccess && n >= 1) {
        p.cs = cs, p.ch = ch, p.cbuf_at = cbuf_at, p.floats = floats;
        break;
      }
      (void)cudaGetLastError();  // an unsupported size is not an error of the step
    }
    plan = p;
  }
  if (plan.cs == 0) return false;
  const size_t smem = size_t(plan.floats) * sizeof(float);
  // Once per size (a graph capture replays this launch without the attribute call).
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(plan.cs), at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  unsigned n = 1;
  if (pdl_active()) {  // the kernel follows the pdl_wait rules (weights and len only before it)
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    n = 2;
  }
  cfg.gridDim = dim3(unsigned(plan.cs), unsigned(Hkv), unsigned(M));
  cfg.blockDim = dim3(kAttnClusterWarps * kWarp, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = n;
  apply_carveout(reinterpret_cast<const void*>(kernel));
  ZAYA_CUDA_CHECK(cudaLaunchKernelEx(
      &cfg, kernel, o_MHd, static_cast<float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<unsigned*>(nullptr), q_MHd, kcache, vcache, len_B, cap, window, int(Hq), int(Hkv),
      int(plan.ch), plan.cs, int(plan.floats - 1), 0, int(plan.cbuf_at), AttnFinishArgs{}, 0));
  return true;
}

namespace {

// decode_attention, and with fin (the split form only) decode_attention_finish.
void attention_launch(bf16* o_MHd, const bf16* q_MHd, const bf16* kcache, const bf16* vcache,
                      const int32_t* len_B, int64_t cap, int64_t window, int64_t M, int64_t Hq,
                      int64_t Hkv, int64_t d, void* ws, cudaStream_t st, int chunk, int pipe,
                      bool stage_combine, bool cluster, bool exact_heads, const AttnFinishArgs* fin,
                      int trigger_at) {
  const int64_t G = Hq / Hkv;
  check(M >= 1 && M <= kGemvMaxRows && Hq % Hkv == 0 && G <= kAttnMaxG &&
            (d == 32 || d == 64 || d == 128),
        "decode_attention: needs M <= 8, Hq/Hkv <= 8 and a head dim of 32, 64 or 128");
  if (cluster && chunk == 0 && !fin) {
    const bool done = d == 128  ? launch_attn_cluster<128>(o_MHd, q_MHd, kcache, vcache, len_B, cap,
                                                          window, M, Hq, Hkv, st)
                      : d == 64 ? launch_attn_cluster<64>(o_MHd, q_MHd, kcache, vcache, len_B, cap,
                                                          window, M, Hq, Hkv, st)
                                : launch_attn_cluster<32>(o_MHd, q_MHd, kcache, vcache, len_B, cap,
                                                          window, M, Hq, Hkv, st);
    if (done) {
      ZAYA_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  check(chunk == 0 || (chunk % kAttnKeysPerPass == 0 && chunk <= kAttnMaxChunk),
        "decode_attention: keys per chunk must be a multiple of 16 up to 256 (0: automatic)");
  check(pipe == 1 || pipe == 2 || pipe == 4,
        "decode_attention: passes in flight must be 1, 2 or 4");
  check(trigger_at >= 0 && trigger_at <= 2,
        "decode_attention: the trigger point must be 0 (after the wait), 1 (after the scores) or 2 "
        "(after the partials)");
  const int ch = chunk > 0 ? chunk : attn_chunk(M, Hkv, cap);
  const int nchunks = int((cap + ch - 1) / ch);
  unsigned* counters = static_cast<unsigned*>(ws);
  float* part_o = reinterpret_cast<float*>(static_cast<char*>(ws) + attn_counter_bytes(Hq));
  float* part_ml = part_o + M * Hq * nchunks * d;
  // The main pass's arrays, or the combine's weights, whichever is larger; then the flag.
  // stage_combine: room for the partial rows of up to `stage` chunks (at most kAttnStageBytes), so
  // that a combine over that many visible chunks stages them in one round.
  // The folded finish: no staged combine, and one pass in flight outside the exact form.
  const int64_t stage =
      stage_combine && !fin && aligned16(part_o)
          ? std::min<int64_t>(nchunks, kAttnStageBytes / (G * d * int64_t(sizeof(float))))
          : 0;
  const int64_t combine =
      stage > 0 ? (G * (nchunks + 1) + 3) / 4 * 4 + stage * G * d : G * (nchunks + 1);
  const int64_t main_pass =
      G * d + G * ch + kAttnWarps * G * d + (fin ? attn_finish_floats(int(G), int(d)) : 0);
  const size_t smem = size_t(std::max<int64_t>(main_pass, combine) + 1) * sizeof(float);
  const int flag_at = int(smem / sizeof(float)) - 1;
  const dim3 grid{unsigned(nchunks), unsigned(Hkv), unsigned(M)};
  const bool exact = exact_heads && pipe <= 2 && d == 128 && G == 4 && stage == 0 &&
                     nchunks <= kAttnExactMaxChunks;
  const auto kernel =
      fin         ? (exact      ? (pipe == 2 ? decode_attn_kernel<128, 2, kAttnWarps, false, 4, true>
                                             : decode_attn_kernel<128, 1, kAttnWarps, false, 4, true>)
                     : d == 128 ? decode_attn_kernel<128, 1, kAttnWarps, false, 0, true>
                     : d == 64  ? decode_attn_kernel<64, 1, kAttnWarps, false, 0, true>
                                : decode_attn_kernel<32, 1, kAttnWarps, false, 0, true>)
      : exact     ? (pipe == 2 ? decode_attn_kernel<128, 2, kAttnWarps, false, 4>
                               : decode_attn_kernel<128, 1, kAttnWarps, false, 4>)
      : pipe == 4 ? (d == 128  ? decode_attn_kernel<128, 4, kAttnWarps, false>
                     : d == 64 ? decode_attn_kernel<64, 4, kAttnWarps, false>
                               : decode_attn_kernel<32, 4, kAttnWarps, false>)
      : pipe == 2 ? (d == 128  ? decode_attn_kernel<128, 2, kAttnWarps, false>
                     : d == 64 ? decode_attn_kernel<64, 2, kAttnWarps, false>
                               : decode_attn_kernel<32, 2, kAttnWarps, false>)
                  : (d == 128  ? decode_attn_kernel<128, 1, kAttnWarps, false>
                     : d == 64 ? decode_attn_kernel<64, 1, kAttnWarps, false>
                               : decode_attn_kernel<32, 1, kAttnWarps, false>);
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch_k(kernel, grid, dim3(kAttnThreads), smem, st, o_MHd, part_o, part_ml, counters, q_MHd,
           kcache, vcache, len_B, cap, window, int(Hq), int(Hkv), ch, nchunks, flag_at, int(stage),
           0, fin ? *fin : AttnFinishArgs{}, trigger_at);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void decode_attention(bf16* o_MHd, const bf16* q_MHd, const bf16* kcache, const bf16* vcache,
                      const int32_t* len_B, int64_t cap, int64_t window, int64_t M, int64_t Hq,
                      int64_t Hkv, int64_t d, void* ws, cudaStream_t st, int chunk, int pipe,
                      bool stage_combine, bool cluster, bool exact_heads, int trigger_at) {
  attention_launch(o_MHd, q_MHd, kcache, vcache, len_B, cap, window, M, Hq, Hkv, d, ws, st, chunk,
                   pipe, stage_combine, cluster, exact_heads, nullptr, trigger_at);
}

bool decode_attention_finish_supported(int64_t Hq, int64_t Hkv, int64_t d, int64_t r) {
  // The attention's head dims and group sizes; rotary pairs (j, j + r/2) within the head.
  return Hkv > 0 && Hq % Hkv == 0 && Hq / Hkv <= kAttnMaxG && (d == 32 || d == 64 || d == 128) &&
         r >= 0 && r <= d && r % 2 == 0;
}

void decode_attention_finish(bf16* o_MHd, bf16* kcache, bf16* vcache, float* vd_last_B,
                             float* hist_BPC, int64_t P, const float* conv_MC, const bf16* qkv,
                             int64_t ld, const float* temp_G, const int32_t* len_B, int64_t cap,
                             float theta, int64_t r, int64_t window, int64_t M, int64_t Hq,
                             int64_t Hkv, int64_t d, void* ws, cudaStream_t st, int chunk, int pipe,
                             bool exact_heads) {
  check(decode_attention_finish_supported(Hq, Hkv, d, r),
        "decode_attention_finish: needs Hq/Hkv <= 8, a head dim of 32, 64 or 128 and an even "
        "rotary dim up to it");
  AttnFinishArgs f;
  f.conv = conv_MC, f.qkv = qkv, f.ld = ld, f.temp = temp_G, f.kc = kcache, f.vc = vcache;
  f.vd_last = vd_last_B, f.hist = hist_BPC, f.P = int(P), f.theta = theta, f.r = int(r);
  attention_launch(o_MHd, nullptr, kcache, vcache, len_B, cap, window, M, Hq, Hkv, d, ws, st, chunk,
                   pipe, false, false, exact_heads, &f, 0);
}

void decode_residual_norm(float* h_MD, bf16* y_MD, const bf16* a_MD, const float* hs_D,
                          const float* hb_D, const float* rs_D, const float* rb_D,
                          const float* norm_w_D, float eps, int64_t M, int64_t D, cudaStream_t st,
                          bool early_trigger) {
  const bool vec = residual_norm_vec(D, {h_MD, y_MD, a_MD, hs_D, hb_D, rs_D, rb_D, norm_w_D});
  launch_k(vec ? decode_residual_norm_kernel<true> : decode_residual_norm_kernel<false>,
           dim3(unsigned(M)), dim3(kRowThreads), 0, st, h_MD, y_MD, a_MD, hs_D, hb_D, rs_D, rb_D,
           norm_w_D, eps, D, early_trigger);
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
                 cudaStream_t st, int32_t* hist, const int32_t* len_B) {
  check(hist == nullptr || len_B != nullptr, "argmax_rows: a token history needs the lengths");
  int64_t* part_i = static_cast<int64_t*>(ws);
  float* part_v = reinterpret_cast<float*>(part_i + M * kArgmaxSlices);
  launch_k(argmax_slices_kernel, dim3{unsigned(kArgmaxSlices), unsigned(M)}, dim3(256), 0, st,
           part_v, part_i, logits_MV, V);
  launch_k(argmax_final_kernel, dim3(unsigned(M)), dim3(256), 0, st, ids_out, part_v, part_i, hist,
           len_B);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

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
  bool stage = true;   // the MLP weights go through shared memory
  bool ok = true;      // kRegs: the chosen cluster leaves at most kRouterRegRows rows per warp
  int64_t norm_D = 0;  // kNorm: the folded norm's row width (its shared memory)
};

template <bool kVecX, bool kRegs, bool kAsync, bool kNorm = false, bool kStageX = false,
          bool kPreR = false>
RouterLaunch router_launch(int64_t R, int64_t E1, const DecodeRouterLayout& lay,
                           int64_t norm_D = 0) {
  const int max_cs = lay.max_cluster > 0 ? lay.max_cluster : 16;
  static RouterLaunch cached;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  if (cached.R == R && cached.E1 == E1 && cached.device == dev && cached.max_cs == max_cs &&
      cached.stage_mlp == lay.stage_mlp && cached.one_per_sm == lay.one_per_sm &&
      cached.norm_D == norm_D)
    return cached;
  RouterLaunch L;
  L.R = R, L.E1 = E1, L.device = dev, L.max_cs = max_cs, L.norm_D = norm_D;
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
    const int64_t rpb = stage || kNorm || kStageX || kPreR ? (R + cs - 1) / cs : R;
    const int64_t extra = kNorm ? router_norm_floats(cs, norm_D) : kStageX ? (norm_D + 1) / 2 : 0;
    const size_t b = size_t(kNorm || kStageX ? round4(router_smem_floats(R, E1, rpb, false)) + extra
                                             : router_smem_floats(R, E1, rpb, stage)) *
                     sizeof(float);
    return lay.one_per_sm ? std::max(b, spread) : b;
  };
  const auto kernel = decode_router_kernel<kVecX, kRegs, kAsync, kNorm, kStageX, kPreR>;
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
template <bool kVecX, bool kRegs, bool kAsync, bool kNorm = false, bool kStageX = false,
          bool kPreR = false>
bool launch_router(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                   const bf16* x_MD, int64_t ldx, const bf16* down_w_RD, const float* down_b_R,
                   const float* state_MR, const float* scale_R, const float* norm_w_R, float eps,
                   const float* fc1_w, const float* fc1_b, const float* fc2_w, const float* fc2_b,
                   const float* out_w, const float* balancing_E1, int64_t M, int64_t D, int64_t R,
                   int64_t E1, bool vec_w, const DecodeRouterLayout& lay, cudaStream_t st,
                   const DecodeNormIn& nin = DecodeNormIn{}, const float* r0 = nullptr) {
  const RouterLaunch L = router_launch<kVecX, kRegs, kAsync, kNorm, kStageX, kPreR>(
      R, E1, lay, kNorm || kStageX ? D : 0);
  if (!L.ok || (kAsync && L.cs < 2)) return false;
  // kNorm, kStageX: one pair of rows per warp; kNorm: the norm's 256 threads split evenly over the
  // cluster.
  if ((kNorm || kStageX) && (R + L.cs - 1) / L.cs > 2 * kRouterWarps) return false;
  if (kNorm && kRouterThreads % L.cs != 0) return false;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[2];
  unsigned n = 0;
  if (L.cs > 1) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = unsigned(L.cs), at[n].val.clusterDim.y = 1;
    at[n].val.clusterDim.z = 1;
    n++;
  }
  if (pdl_active()) {  // the kernel follows the pdl_wait rules (weights only before it)
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  cfg.gridDim = dim3(unsigned(L.cs), unsigned(M), 1);
  cfg.blockDim = dim3(kRouterThreads, 1, 1);
  cfg.dynamicSmemBytes = L.smem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = n;
  const auto kernel = decode_router_kernel<kVecX, kRegs, kAsync, kNorm, kStageX, kPreR>;
  apply_carveout(reinterpret_cast<const void*>(kernel));
  ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx,
                                     down_w_RD, down_b_R, state_MR, scale_R, norm_w_R, eps, fc1_w,
                                     fc1_b, fc2_w, fc2_b, out_w, balancing_E1, int(D), int(R),
                                     int(E1), L.stage, vec_w, nin, r0));
  return true;
}

}  // namespace

bool decode_router_pre_down_supported(int64_t R, int64_t E1, const DecodeRouterLayout& lay) {
  if (!(lay.mlp_regs && lay.async_exchange && R % kWarp == 0 && R <= int64_t(kRouterRegK) * kWarp &&
        R <= kRouterThreads && E1 <= int64_t(kRouterRegClassRows) * kRouterWarps))
    return false;
  const RouterLaunch L = router_launch<true, true, true, false, false, true>(R, E1, lay, 0);
  return L.ok && L.cs >= 2;
}

bool decode_norm_gemv_supported(int64_t D, std::initializer_list<const void*> ptrs) {
  return residual_norm_vec(D, ptrs) && D % 8 == 0 && size_t(D) * sizeof(bf16) <= 48 * 1024;
}

void decode_norm_gemv(const float* h_in_MD, float* h_out_MD, bf16* y_MD, const bf16* a_MD,
                      const float* hs_D, const float* hb_D, const float* rs_D, const float* rb_D,
                      const float* norm_w_D, float eps, const bf16* W_OD, const float* bias_O,
                      float* out32, bf16* out16, int64_t ldo, int64_t M, int64_t D, int64_t O,
                      cudaStream_t st, bool early_trigger) {
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
    launch_k(kernel, grid, dim3(kRowThreads), smem, st, h_in_MD, h_out_MD, y_MD, a_MD, hs_D, hb_D,
             rs_D, rb_D, norm_w_D, eps, D, W_OD, bias_O, out32, out16, ldo, O, early_trigger);
  };
  if (groups <= 1)
    go(decode_norm_gemv_kernel<1>);
  else if (groups <= 2)
    go(decode_norm_gemv_kernel<2>);
  else
    go(decode_norm_gemv_kernel<4>);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void decode_router(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                   const bf16* x_MD, int64_t ldx, const bf16* down_w_RD, const float* down_b_R,
                   const float* state_MR, const float* scale_R, const float* norm_w_R, float eps,
                   const float* fc1_w, const float* fc1_b, const float* fc2_w, const float* fc2_b,
                   const float* out_w, const float* balancing_E1, int64_t M, int64_t D, int64_t R,
                   int64_t E1, cudaStream_t st, const DecodeRouterLayout& lay,
                   const DecodeNormIn* nin, const float* r0_MR) {
  check(M >= 1 && D > 0 && R > 0 && E1 > 0 && ldx >= D, "decode_router: bad sizes");
  if (r0_MR != nullptr) {
    check(nin == nullptr && decode_router_pre_down_supported(R, E1, lay),
          "decode_router: the down projection's sums (r0) need decode_router_pre_down_supported "
          "and no folded norm");
    const bool vec_w = R % 4 == 0 && aligned16(fc1_w) && aligned16(fc2_w) && aligned16(out_w);
    check(launch_router<true, true, true, false, false, true>(
              r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx, down_w_RD, down_b_R, state_MR, scale_R,
              norm_w_R, eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D, R, E1, vec_w,
              lay, st, DecodeNormIn{}, r0_MR),
          "decode_router: the form that starts from r0 could not be launched");
    ZAYA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  check(nin == nullptr || (nin->x_out == x_MD && ldx == D),
        "decode_router: the folded norm's x must be the router's input rows");
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
        norm_w_R, eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D, R, E1, vec_w, lay,
        st);
  };
  using T = std::true_type;
  using F = std::false_type;
  const bool as = lay.async_exchange;
  // The folded norm (nin) where its form applies; otherwise the norm as a launch of its own first.
  if (nin != nullptr) {
    const bool fold =
        regs && as && vec_x && D % 4 == 0 && D <= int64_t(4) * kRouterThreads * kRowVec &&
        aligned16(nin->h_in) && aligned16(nin->h_out) && aligned16(nin->a) && aligned16(nin->hs) &&
        aligned16(nin->hb) && aligned16(nin->rs) && aligned16(nin->rb) && aligned16(nin->norm_w);
    if (fold && launch_router<true, true, true, true>(
                    r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx, down_w_RD, down_b_R, state_MR,
                    scale_R, norm_w_R, eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D,
                    R, E1, vec_w, lay, st, *nin)) {
      ZAYA_CUDA_CHECK(cudaGetLastError());
      return;
    }
    check(nin->h_in == nin->h_out, "decode_router: the norm's residual is updated in place");
    decode_residual_norm(nin->h_out, nin->x_out, nin->a, nin->hs, nin->hb, nin->rs, nin->rb,
                         nin->norm_w, nin->eps, M, D, st, nin->early_trigger);
  }
  if (lay.stage_x && regs && as && vec_x && D % 8 == 0 &&
      launch_router<true, true, true, false, true>(r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx,
                                                   down_w_RD, down_b_R, state_MR, scale_R, norm_w_R,
                                                   eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w,
                                                   balancing_E1, M, D, R, E1, vec_w, lay, st)) {
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
                   int64_t E1, cudaStream_t st, int max_cluster) {
  DecodeRouterLayout lay;
  lay.max_cluster = max_cluster;
  decode_router(r_MR, probs_ME1, choice_M, gate_M, x_MD, ldx, down_w_RD, down_b_R, state_MR,
                scale_R, norm_w_R, eps, fc1_w, fc1_b, fc2_w, fc2_b, out_w, balancing_E1, M, D, R,
                E1, st, lay);
}

L2Persist set_l2_persisting(size_t bytes) {
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  ZAYA_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  L2Persist r;
  const size_t aside = std::min(bytes, size_t(p.persistingL2CacheMaxSize));
  ZAYA_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, aside));
  if (aside == 0) {
    ZAYA_CUDA_CHECK(cudaCtxResetPersistingL2Cache());
    return r;
  }
  r.bytes = std::min(bytes, size_t(p.accessPolicyMaxWindowSize));
  r.hit_ratio = r.bytes > aside ? float(double(aside) / double(r.bytes)) : 1.f;
  return r;
}

bool lm_head_greedy_supported(int64_t M, int64_t V, int64_t D, const bf16* x, int64_t ldx,
                              const bf16* W) {
  return M >= 1 && M <= kGemvMaxRows && V > 0 && V < int64_t(0xFFFFFFFFu) && D > 0 && D % 8 == 0 &&
         ldx % 8 == 0 && aligned16(x) && aligned16(W);
}

void lm_head_greedy(float* logits_MV, const bf16* x, int64_t ldx, const bf16* W, int64_t M,
                    int64_t V, int64_t D, unsigned long long* keys_M, int32_t* ids_out,
                    int32_t* hist, int32_t* len_B, cudaStream_t st, L2Persist persist,
                    bool prefetch, bool persistent, bool stage_x, bool no_l1) {
  check(lm_head_greedy_supported(M, V, D, x, ldx, W) && keys_M && ids_out && len_B,
        "lm_head_greedy: needs lm_head_greedy_supported, the keys, the ids and the lengths");
  // persist_bytes: the first rows of W marked to stay in L2 across launches (an access policy
  // window on this launch; the device's persisting set-aside is set by set_l2_persisting).
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((V + kRowsPerBlock - 1) / kRowsPerBlock));
  cfg.blockDim = dim3(kRowsPerBlock * kWarp);
  cfg.stream = st;
  cudaLaunchAttribute at[2];
  unsigned n_at = 0;
  if (pdl_active()) {
    at[n_at].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n_at++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (persist.bytes > 0) {
    at[n_at].id = cudaLaunchAttributeAccessPolicyWindow;
    at[n_at].val.accessPolicyWindow.base_ptr = const_cast<bf16*>(W);
    at[n_at].val.accessPolicyWindow.num_bytes =
        std::min(persist.bytes, size_t(V) * size_t(D) * sizeof(bf16));
    at[n_at].val.accessPolicyWindow.hitRatio = persist.hit_ratio;
    at[n_at].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    at[n_at++].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  }
  cfg.attrs = at;
  cfg.numAttrs = n_at;
  with_rows(M, [&](auto n) {
    constexpr int kM = decltype(n)::value;
    if (persistent) {
      const auto kernel = prefetch ? gemv_argmax_persistent_kernel<kM, true>
                                   : gemv_argmax_persistent_kernel<kM, false>;
      // As many blocks as are resident at once on the whole device (queried once per kernel and
      // device; not inside a capture: the first decode step runs eagerly), at most one per
      // 8-row group of the head.
      static int known_dev[2] = {-1, -1}, known_grid[2] = {0, 0};
      int dev = 0;
      ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
      const int slot = prefetch ? 1 : 0;
      if (known_dev[slot] != dev) {
        int per_sm = 0, sms = 0;
        ZAYA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel,
                                                                      kRowsPerBlock * kWarp, 0));
        ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        known_grid[slot] = std::max(1, per_sm * sms);
        known_dev[slot] = dev;
      }
      cfg.gridDim = dim3(
          unsigned(std::min<int64_t>(known_grid[slot], (V + kRowsPerBlock - 1) / kRowsPerBlock)));
      apply_carveout(reinterpret_cast<const void*>(kernel));
      ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, logits_MV, V, x, ldx, W, D,
                                         static_cast<const float*>(nullptr), V, D, keys_M));
      return;
    }
    // stage_x and no_l1 only without the prefetch and evict_first forms; staged rows within the
    // default 48 KB of dynamic shared memory.
    const bool stage = stage_x && !prefetch && !g_weights_evict_first &&
                       size_t(kM) * size_t(D) * sizeof(bf16) <= 48 * 1024;
    const bool nol1 = no_l1 && !prefetch && !g_weights_evict_first;
    auto kernel = prefetch
                      ? (g_weights_evict_first ? gemv_argmax_kernel<kM, kWeightEvictFirst, true>
                                               : gemv_argmax_kernel<kM, kWeightNormal, true>)
                      : (g_weights_evict_first ? gemv_argmax_kernel<kM, kWeightEvictFirst>
                                               : gemv_argmax_kernel<kM, kWeightNormal>);
    if (stage || nol1)
      kernel = stage ? (nol1 ? gemv_argmax_kernel<kM, kWeightNoL1, false, true>
                             : gemv_argmax_kernel<kM, kWeightNormal, false, true>)
                     : gemv_argmax_kernel<kM, kWeightNoL1>;
    cfg.dynamicSmemBytes = stage ? size_t(kM) * size_t(D) * sizeof(bf16) : 0;
    apply_carveout(reinterpret_cast<const void*>(kernel));
    ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, logits_MV, V, x, ldx, W, D,
                                       static_cast<const float*>(nullptr), V, D, keys_M));
  });
  launch_k(token_commit_kernel, dim3(1), dim3(kWarp), 0, st, ids_out, hist, len_B, keys_M, int(M));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

bool decode_embed_norm_supported(int64_t D, std::initializer_list<const void*> ptrs) {
  return residual_norm_vec(D, ptrs);
}

void decode_embed_norm(float* h_MD, bf16* y_MD, const int32_t* ids_M, const bf16* table_VD,
                       const float* s_D, const float* b_D, int32_t* bad_id_flag,
                       const float* norm_w_D, float eps, int64_t M, int64_t D, int64_t V,
                       cudaStream_t st) {
  check(M >= 1 && decode_embed_norm_supported(D, {h_MD, y_MD, table_VD, s_D, b_D, norm_w_D}),
        "decode_embed_norm: needs D a multiple of 4 up to 4096 and 16-byte aligned rows");
  launch_k(decode_embed_norm_kernel, dim3(unsigned(M)), dim3(kRowThreads), 0, st, h_MD, y_MD, ids_M,
           table_VD, s_D, b_D, bad_id_flag, norm_w_D, eps, D, V);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void advance_lengths(int32_t* len_B, int32_t n, int64_t B, cudaStream_t st) {
  launch_k(advance_kernel, dim3(unsigned((B + 127) / 128)), dim3(128), 0, st, len_B, n, B);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda
