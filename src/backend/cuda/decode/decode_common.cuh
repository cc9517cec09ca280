// Internal to the decode kernels (backend/cuda/decode/*.cu; the contracts are in decode_kernels.h):
// the device pieces that several kernel families share — programmatic dependent launch (the rules
// every decode kernel follows), the decode trace, weight-row loads and GEMV rows, the residual
// norm's arithmetic, the cluster exchange — and the host side of a launch
// (argument checks, dynamic shared memory, launch_k under a DecodePolicy, dispatch on the row
// count). Everything here is in an unnamed namespace: each .cu compiles its own copy (the build
// has no relocatable device code), the decode trace's constants included (decode_launch.cu sets
// every file's through the ZAYA_DECODE_TRACE_UNIT setters).
#pragma once
#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/arch/kernel_utils.cuh"
#include "backend/cuda/decode/decode_kernels.h"
#include "core/cuda_check.h"

#ifndef ZAYA_DECODE_TRACE
#define ZAYA_DECODE_TRACE 0
#endif

namespace zaya::cuda {

namespace detail {
// Whether launches under `policy` on the current device use programmatic dependent launch: the
// policy asks for it and the device has it (compute capability 9.0 and later; queried once per
// device, on the first launch, which runs eagerly, so a captured step makes no such query).
bool pdl_on(const DecodePolicy& policy);
}  // namespace detail

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
//      with an early trigger (pdl_begin_early), whose successors'
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
// This file's copy of the trace constants set (set_decode_trace calls it through the setter that
// ZAYA_DECODE_TRACE_UNIT defines at the end of every decode .cu).
inline void set_trace_constants(unsigned long long* buf, unsigned long long cap) {
  ZAYA_CUDA_CHECK(cudaMemcpyToSymbol(c_trace, &buf, sizeof(buf)));
  ZAYA_CUDA_CHECK(cudaMemcpyToSymbol(c_trace_cap, &cap, sizeof(cap)));
}
#define ZAYA_DECODE_TRACE_UNIT(name)                                       \
  namespace zaya::cuda::detail {                                           \
  void set_trace_##name(unsigned long long* buf, unsigned long long cap) { \
    set_trace_constants(buf, cap);                                         \
  }                                                                        \
  }
#else
#define ZAYA_DECODE_TRACE_UNIT(name)
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
// dependent loads are done (the attention's trigger_at), so that the successor's
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
// A 16-byte piece of a weight row. kEF (an int: kWeightNormal or kWeightNoL1). kWeightNoL1 (the
// LM head's no_l1): not allocated in L1, so that the streamed rows do not evict the input row
// every warp reads there. Otherwise a plain load (the hardware's default policy). The value is the
// same either way.
constexpr int kWeightNormal = 0, kWeightNoL1 = 1;
template <int kEF>
__device__ __forceinline__ uint4 ld_weight16(const bf16* p) {
  if constexpr (kEF == kWeightNoL1) {
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
// intrinsics are never contracted or reordered), so every decode norm kernel gives the same bits
// whatever the surrounding code:
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

// The host side of a decode launch.
inline void check(bool ok, const char* what) {
  if (!ok)
    ::zaya::detail::platform_fail("CUDA", "decode kernel arguments", __FILE__, __LINE__, what);
}

// Opts `kernel` into `bytes` of dynamic shared memory on the current device, once per kernel,
// device and size (the first decode step runs eagerly, so this happens outside graph captures).
inline void allow_dynamic_smem(const void* kernel, size_t bytes) {
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

// Appends the programmatic-stream-serialisation attribute to at[0, n) where PDL is on (the kernel
// then follows the pdl_wait rules above); returns the new count.
inline unsigned add_pdl_attribute(cudaLaunchAttribute* at, unsigned n, const DecodePolicy& policy) {
  if (!detail::pdl_on(policy)) return n;
  at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[n].val.programmaticStreamSerializationAllowed = 1;
  return n + 1;
}

// Launches a decode kernel on st, with programmatic dependent launch where the policy has it on
// (add_pdl_attribute); plain stream order otherwise. Under stream capture the attribute becomes a
// programmatic edge of the graph.
template <typename... KArgs, typename... Args>
void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
              const DecodePolicy& policy, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  cfg.attrs = at;
  cfg.numAttrs = add_pdl_attribute(at, 0, policy);
  ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The residual norm's choice of the float4 form.
inline bool residual_norm_vec(int64_t D, std::initializer_list<const void*> ptrs) {
  return D % 4 == 0 && D <= 4 * kRowVec * kRowThreads && kern::vec4_ok(D, ptrs);
}

// Calls f(std::integral_constant<int, M>{}) for a row count M in 1..kGemvMaxRows (the GEMV kernels
// are instantiated per row count).
template <typename F>
inline void with_rows(int64_t M, F&& f) {
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

}  // namespace
}  // namespace zaya::cuda
