// Split-context attention of decode rows over the cache (decode_kernels.h, decode_attention): the
// split form with its chunk partials combined by the last block of each (sequence, kv head), the
// thread-block cluster form, and the form with the CCA finish folded in.
#include "backend/cuda/decode/decode_cca.cuh"

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

}  // namespace

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
                         int64_t Hkv, cudaStream_t st,
    const DecodePolicy& policy) {
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
  // The kernel follows the pdl_wait rules (weights and len only before it).
  const unsigned n = add_pdl_attribute(at, 1, policy);
  cfg.gridDim = dim3(unsigned(plan.cs), unsigned(Hkv), unsigned(M));
  cfg.blockDim = dim3(kAttnClusterWarps * kWarp, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = n;
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
                      int trigger_at,
    const DecodePolicy& policy) {
  const int64_t G = Hq / Hkv;
  check(M >= 1 && M <= kGemvMaxRows && Hq % Hkv == 0 && G <= kAttnMaxG &&
            (d == 32 || d == 64 || d == 128),
        "decode_attention: needs M <= 8, Hq/Hkv <= 8 and a head dim of 32, 64 or 128");
  if (cluster && chunk == 0 && !fin) {
    const bool done = d == 128  ? launch_attn_cluster<128>(o_MHd, q_MHd, kcache, vcache, len_B, cap,
                                                          window, M, Hq, Hkv, st, policy)
                      : d == 64 ? launch_attn_cluster<64>(o_MHd, q_MHd, kcache, vcache, len_B, cap,
                                                          window, M, Hq, Hkv, st, policy)
                                : launch_attn_cluster<32>(o_MHd, q_MHd, kcache, vcache, len_B, cap,
                                                          window, M, Hq, Hkv, st, policy);
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
  launch_k(kernel, grid, dim3(kAttnThreads), smem, st, policy, o_MHd, part_o, part_ml, counters, q_MHd,
           kcache, vcache, len_B, cap, window, int(Hq), int(Hkv), ch, nchunks, flag_at, int(stage),
           0, fin ? *fin : AttnFinishArgs{}, trigger_at);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void decode_attention(bf16* o_MHd, const bf16* q_MHd, const bf16* kcache, const bf16* vcache,
                      const int32_t* len_B, int64_t cap, int64_t window, int64_t M, int64_t Hq,
                      int64_t Hkv, int64_t d, void* ws, cudaStream_t st, int chunk, int pipe,
                      bool stage_combine, bool cluster, bool exact_heads, int trigger_at,
    const DecodePolicy& policy) {
  attention_launch(o_MHd, q_MHd, kcache, vcache, len_B, cap, window, M, Hq, Hkv, d, ws, st, chunk,
                   pipe, stage_combine, cluster, exact_heads, nullptr, trigger_at, policy);
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
                             bool exact_heads,
    const DecodePolicy& policy) {
  check(decode_attention_finish_supported(Hq, Hkv, d, r),
        "decode_attention_finish: needs Hq/Hkv <= 8, a head dim of 32, 64 or 128 and an even "
        "rotary dim up to it");
  AttnFinishArgs f;
  f.conv = conv_MC, f.qkv = qkv, f.ld = ld, f.temp = temp_G, f.kc = kcache, f.vc = vcache;
  f.vd_last = vd_last_B, f.hist = hist_BPC, f.P = int(P), f.theta = theta, f.r = int(r);
  attention_launch(o_MHd, nullptr, kcache, vcache, len_B, cap, window, M, Hq, Hkv, d, ws, st, chunk,
                   pipe, false, false, exact_heads, &f, 0, policy);
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(attention)
