// Split-context attention of decode rows over the cache (decode_kernels.h, decode_attention): the
// chunk partials combined by the last block of each (sequence, kv head).
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

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

// kG > 0: the query heads per kv head fixed at compile time (the loops over heads then hold kG
// heads' code instead of kAttnMaxG's with a runtime bound; the same arithmetic); 0: Hq / Hkv.
template <int D, int kPipe, int kG = 0>
__global__ void __launch_bounds__(kAttnThreads)
    decode_attn_kernel(bf16* o, float* part_o, float* part_ml, unsigned* counters, const bf16* q,
                       const bf16* kcache, const bf16* vcache, const int32_t* len, int64_t cap,
                       int64_t window, int Hq, int Hkv, int ch, int nchunks, int flag_at,
                       int trigger_at) {
  constexpr int PER = D / 8;     // key values per lane in the score pass
  constexpr int PV = D / kWarp;  // value dims per lane in the P·V pass
  constexpr int kW = kAttnWarps;
  constexpr int kThreads = kAttnThreads;
  constexpr int kKeysPerPass = kAttnKeysPerPass;
  extern __shared__ __align__(16) float sh[];
  const int c = blockIdx.x, g = blockIdx.y, m = blockIdx.z;
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
  // trigger_at: where the block lets the o projection start — 0 right
  // after the wait (rule 3 above), 1 once its scores are in shared memory, 2 once its partials are
  // stored. Later triggers keep the o projection's prologue (4 MB of weight rows at ZAYA1's size)
  // out of the memory system while this kernel's own dependent loads are on the critical path.
  // q and the cache come from earlier kernels
  trigger_at == 0 ? pdl_begin(DecodeTraceEvent::Attention)
                  : pdl_begin_late(DecodeTraceEvent::Attention);
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
    float kf[kPipe][PER];
    auto load_k = [&](int j0) {
#pragma unroll
      for (int p = 0; p < kPipe; p++) {
        const int j = j0 + p * kKeysPerPass + warp * 4 + grp;
        const int64_t at = int64_t(j < n ? j : 0) * row + sub * PER;
        load_bf16_vals<PER>(kf[p], kbase + at);
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
    for (int i = threadIdx.x; i < G * D; i += kThreads)
      qs[i] = __bfloat162float(q[(int64_t(m) * Hq + int64_t(g) * G) * D + i]) * scale;
    __syncthreads();
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
        part_ml[2 * (slot + int64_t(t) * nchunks)] = mx;
        part_ml[2 * (slot + int64_t(t) * nchunks) + 1] = sum;
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
      load_bf16_vals<PV>(vf, vbase + int64_t(j) * row + lane * PV);
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
    for (int i = threadIdx.x; i < G * D; i += kThreads) {
      float s = 0.f;
      for (int w = 0; w < kW; w++) s += po[w * G * D + i];
      const int t = i / D, e = i % D;
      part_o[(slot + int64_t(t) * nchunks) * D + e] = s;
    }
  }
  // Blocks without visible keys (and trigger_at 2) trigger here; every block triggers once.
  if (trigger_at == 2 || (trigger_at == 1 && kb >= ke)) pdl_trigger();
  trace_mark(trace_ptr(), DecodeTraceEvent::AttnPartials);  // block (0, 0, 0): chunk 0's stored
  // Every block of (g, m) counts itself; the last one combines.
  __threadfence();
  __syncthreads();
  unsigned* counter = counters + int64_t(m) * Hkv + g;
  if (threadIdx.x == 0) *flag = atomicAdd(counter, 1u) == unsigned(gridDim.x) - 1u;
  __syncthreads();
  if (*flag == 0u) return;
  __threadfence();
  if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch (or graph replay)
  trace_mark(trace_ptr(), DecodeTraceEvent::AttnCombine, g == 0 && m == 0);  // (g, m) = (0, 0)
  // The partials, loaded through L2 (where the other blocks' stores landed).
  // Combine the chunks holding visible keys: per head, the weights exp(max_c − max) of the chunks
  // and the total (one warp per head, fixed lane order), then each output in chunk order.
  const int c_lo = int(lo / ch), c_hi = int(pos / ch);
  float* wts = sh;                 // [G, nchunks]
  float* lsum = sh + G * nchunks;  // [G]
  // The form compiled for kG heads (the decode default) carries no general (max, sum) loop below:
  // its launcher takes it only for at most kAttnExactMaxChunks chunks, so its code stays small
  // (the code's size shows in the latency).
  for (int t = warp; t < G; t += kW) {
    const float* ml = part_ml + 2 * ((int64_t(m) * Hq + int64_t(g) * G + t) * nchunks);
    float mx = -INFINITY, l = 0.f;
    if (kG > 0 || c_hi - c_lo < kWarp * kAttnMlPerLane) {
      // Each lane's (max, sum) pairs loaded once, all in flight together (8-byte loads: ml is
      // 8-byte aligned), then the same max and sum in the same order as the general path below.
      float2 pr[kAttnMlPerLane];
#pragma unroll
      for (int q = 0; q < kAttnMlPerLane; q++) {
        const int cc = c_lo + lane + q * kWarp;
        pr[q] = cc <= c_hi ? __ldcg(reinterpret_cast<const float2*>(ml) + cc)
                           : make_float2(-INFINITY, 0.f);
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
      for (int cc = c_lo + lane; cc <= c_hi; cc += kWarp) mx = fmaxf(mx, __ldcg(ml + 2 * cc));
      mx = warp_max(mx);
      for (int cc = c_lo + lane; cc <= c_hi; cc += kWarp) {
        const float lc = __ldcg(ml + 2 * cc + 1);
        const float w = lc > 0.f ? expf(__ldcg(ml + 2 * cc) - mx) : 0.f;
        wts[t * nchunks + cc] = w;
        l += lc * w;
      }
    }
    l = warp_sum(l);
    if (lane == 0) lsum[t] = l;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D / 4; i += kThreads) {
    const int t = 4 * i / D, e = 4 * i % D;
    const int64_t base = (int64_t(m) * Hq + int64_t(g) * G + t) * nchunks;
    const float* const parts = part_o + base * D;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    // Unrolled so that 16 chunks' loads are in flight at once (the sum order is unchanged): at
    // ~65 chunks a loop that waits on each L2 round trip in turn costs several microseconds.
#pragma unroll 16
    for (int cc = c_lo; cc <= c_hi; cc++) {
      const float w = wts[t * nchunks + cc];
      const float4 p = __ldcg(reinterpret_cast<const float4*>(parts + int64_t(cc) * D + e));
      a.x = fmaf(p.x, w, a.x), a.y = fmaf(p.y, w, a.y), a.z = fmaf(p.z, w, a.z),
      a.w = fmaf(p.w, w, a.w);
    }
    const float l = lsum[t], r = l > 0.f ? 1.f / l : 0.f;
    bf16* dst = o + (int64_t(m) * Hq + int64_t(g) * G + t) * D + e;
    dst[0] = __float2bfloat16(a.x * r), dst[1] = __float2bfloat16(a.y * r);
    dst[2] = __float2bfloat16(a.z * r), dst[3] = __float2bfloat16(a.w * r);
  }
}

}  // namespace

// Keys per split-context block: a multiple of 16 (one pass of the block), the smallest that keeps
// the blocks of all sequences and kv heads to about one per SM (128), at most 256 so the scores fit
// shared memory. Each 16-key pass is a dependent round trip of the block and each chunk a partial
// the combine reads: on the H200 at 1,097 keys (8 ZAYA1-base layers, batch 1), 32 keys per chunk
// (70 blocks) gave 0.695 ms per decode step, 16 (138 blocks) 0.701, 64 0.721, 128 0.792, 256
// 0.917 (docs/bench/h200-2026-12-03g).
constexpr int kAttnMaxChunk = 256;
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

void decode_attention(bf16* o_MHd, const bf16* q_MHd, const bf16* kcache, const bf16* vcache,
                      const int32_t* len_B, int64_t cap, int64_t window, int64_t M, int64_t Hq,
                      int64_t Hkv, int64_t d, void* ws, cudaStream_t st, int chunk, int pipe,
                      bool exact_heads, int trigger_at, const DecodePolicy& policy) {
  const int64_t G = Hq / Hkv;
  check(M >= 1 && M <= kGemvMaxRows && Hq % Hkv == 0 && G <= kAttnMaxG &&
            (d == 32 || d == 64 || d == 128),
        "decode_attention: needs M <= 8, Hq/Hkv <= 8 and a head dim of 32, 64 or 128");
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
  const int64_t combine = G * (nchunks + 1);
  const int64_t main_pass = G * d + G * ch + kAttnWarps * G * d;
  const size_t smem = size_t(std::max<int64_t>(main_pass, combine) + 1) * sizeof(float);
  const int flag_at = int(smem / sizeof(float)) - 1;
  const dim3 grid{unsigned(nchunks), unsigned(Hkv), unsigned(M)};
  const bool exact =
      exact_heads && pipe <= 2 && d == 128 && G == 4 && nchunks <= kAttnExactMaxChunks;
  const auto kernel =
      exact       ? (pipe == 2 ? decode_attn_kernel<128, 2, 4> : decode_attn_kernel<128, 1, 4>)
      : pipe == 4 ? (d == 128  ? decode_attn_kernel<128, 4>
                     : d == 64 ? decode_attn_kernel<64, 4>
                               : decode_attn_kernel<32, 4>)
      : pipe == 2 ? (d == 128  ? decode_attn_kernel<128, 2>
                     : d == 64 ? decode_attn_kernel<64, 2>
                               : decode_attn_kernel<32, 2>)
                  : (d == 128  ? decode_attn_kernel<128, 1>
                     : d == 64 ? decode_attn_kernel<64, 1>
                               : decode_attn_kernel<32, 1>);
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch_k(kernel, grid, dim3(kAttnThreads), smem, st, policy, o_MHd, part_o, part_ml, counters,
           q_MHd, kcache, vcache, len_B, cap, window, int(Hq), int(Hkv), ch, nchunks, flag_at,
           trigger_at);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(attention)
