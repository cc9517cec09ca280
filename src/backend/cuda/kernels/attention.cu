// Fused causal GQA flash attention for the CUDA backend (backend/cuda/ops.h: attention_fwd,
// attention_bwd, attention_bwd_workspace_bytes); the specification is cpu::attention and
// cpu::attention_backward.
//
// FlashAttention-2 structure on mma.sync.m16n8k16 (bf16 in, fp32 accumulate), ldmatrix for shared →
// register fragments, cp.async double buffering of the streamed tiles:
//   forward   one block of 4 warps per (128-query tile, batch·query head); each warp owns 32 query
//             rows (two m16 tiles, so every K/V fragment feeds two mma), streams 32-key K/V tiles,
//             keeps the online softmax (base 2, scores pre-scaled by scale·log2e) and the O
//             accumulator in registers. Key tiles above the causal diagonal or left of the sliding
//             window are never visited, by the block or (finer) by a warp whose rows see none of
//             the tile; only tiles that straddle a boundary (diagonal, window edge, sequence end)
//             for the warp's rows pay for the mask.
//   backward  (1) D_i = rowsum(dO ⊙ O) into workspace; (2) dK/dV: one block of 8 warps per
//             (128-key tile, batch·kv head), each warp owns 16 keys and loops over the G query
//             heads of its group and the 64-row query tiles that can see its keys, recomputing P
//             from lse (a warp whose keys the step's queries cannot see skips it); dK/dV live in
//             registers for the whole loop, so nothing is atomically accumulated; (3) dQ: one block
//             of 8 warps per (128-query tile, batch·query head) looping over 64-key tiles
//             (recomputes S and dP a second time). Both stream their tiles through a three-stage
//             cp.async ring with one barrier per step. Every output element is written by exactly
//             one thread after a fixed reduction order, so the backward is bit-reproducible. Grids
//             are linear with the tile index slowest, so the longest causal tiles of every head
//             start first.
// Both directions take the general form: S queries at positions q_start.. against Sk keys at
// 0..Sk-1 (decode, chunked prefill, context parallelism's local chunk against the gathered keys);
// tiles and masks work on positions, q/dO/lse/D on the local rows. The backward's dK/dV grid covers
// all Sk keys, and key tiles no query sees store zeros. Self-attention (q_start 0, Sk = S, the
// training hot path) is the special case: no extra tiles, masks or changes to the reduction order.
// Probabilities and dS are rounded to bf16 before their matmuls (as in FlashAttention-2); all sums
// are fp32. Shared-memory rows are padded by 16 bytes, which makes every ldmatrix and cp.async row
// access hit 8 distinct 16-byte bank groups without a swizzle.
//
// Deliberately not here: dropout, ALiBi/softcap, non-causal attention, head dims other than 32/64/
// 128, strided (non-contiguous) q/k/v rows, a dedicated decode kernel (decode S=1 runs the
// general forward: correct, with 127 of 128 rows idle), and a leaner path for the backward's key
// tiles that no query sees (their blocks run and store zeros).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/arch/mma_utils.cuh"
#include "backend/cuda/ops.h"
#include "core/cuda_check.h"

namespace zaya::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps: forward and D kernels (the dK/dV and dQ kernels take NW)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- PTX wrappers: backend/cuda/arch/mma_utils.cuh ----
using namespace mma;

// ---- fragment helpers (all per warp; lane = threadIdx.x & 31) ----
// The C fragment of m16n8 holds rows lane/4 and lane/4+8, columns 2·(lane%4)+{0,1}. Two adjacent C
// fragments (columns 16k..16k+15) are exactly the A fragment of k-step k, which is how P and dS
// feed the next matmul without a trip through shared memory.
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                       const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}
// A fragment (16 rows × 16 columns at (row0, col0)) of a row-major smem tile with stride LD.
template <int LD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int row0, int col0,
                                       int lane) {
  ldmatrix_x4(a, s + (row0 + (lane & 15)) * LD + col0 + (lane >> 4) * 8);
}
// B fragments of two n8 tiles for the product X·Yᵀ where Y is a row-major smem tile (rows = n):
// rows n0..n0+15, k columns k0..k0+15. b[0],b[1] → n-tile n0, b[2],b[3] → n-tile n0+8.
template <int LD>
__device__ __forceinline__ void load_b_nt(uint32_t (&b)[4], const bf16* s, int n0, int k0,
                                          int lane) {
  ldmatrix_x4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + k0 + ((lane >> 3) & 1) * 8);
}
// B fragments of two n8 tiles for X·Y where Y is a row-major smem tile (rows = k): k rows
// k0..k0+15, n columns n0..n0+15. b[0],b[1] → n-tile n0, b[2],b[3] → n-tile n0+8.
template <int LD>
__device__ __forceinline__ void load_b_nn(uint32_t (&b)[4], const bf16* s, int k0, int n0,
                                          int lane) {
  ldmatrix_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}

// ROWS×D bf16 rows from global (row stride gstride elements) into smem (stride D+8); rows at or
// past `nvalid` are zero-filled. `safe` is any valid global address (never dereferenced for them).
template <int ROWS, int D, int NT = kThreads>
__device__ __forceinline__ void load_rows(bf16* s, const bf16* g, int64_t gstride, int nvalid,
                                          const bf16* safe, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = tid; c < ROWS * kChunks; c += NT) {
    const int r = c / kChunks, ch = c % kChunks;
    const bool ok = r < nvalid;
    cp_async16(s + r * (D + 8) + ch * 8, ok ? g + r * gstride + ch * 8 : safe, ok);
  }
}

// Keys visible to query position qp: lo(qp) <= key <= qp.
__device__ __forceinline__ bool key_visible(int key, int qp, int window) {
  return key <= qp && (window <= 0 || key > qp - window);
}

// ---- forward ----
// Block = 4 warps × 32 query rows (two m16 tiles per warp): every K/V fragment read from shared
// memory feeds two mma instead of one. Per warp and 32-key tile at d=128 that is 48 ldmatrix.x4
// for 128 mma (0.375 per mma; 16-row warps with 64-key tiles and Q held in registers need 0.5),
// and each K/V tile serves 128 queries, halving its L2 traffic. 32-key tiles because S for 32 rows
// × 64 keys next to the 32×128 O accumulator spills at d=128 (ptxas: 255 registers + 152 bytes);
// with 32 keys it is 248 registers, no spills, and two blocks (8 warps) still fit per SM.
constexpr int kFwdBM = 128, kFwdBN = 32, kFwdMT = 2;  // kFwdMT m16 tiles per warp

template <int D>
constexpr int fwd_smem_bytes() {
  return (kFwdBM + 4 * kFwdBN) * (D + 8) * int(sizeof(bf16));
}

// grid ceil(S/128)·B·Hq, linear: block x processes query tile ntiles-1-x/(B·Hq) of batch·head
// x%(B·Hq), so the longest causal rows of every head start first (longest-processing-time order),
// which evens out the tail of the launch.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_kernel(bf16* __restrict__ o, float* __restrict__ lse, const bf16* __restrict__ q,
                    const bf16* __restrict__ k, const bf16* __restrict__ v, int S, int Sk,
                    int q_start, int Hq, int Hkv, int window, float scale_log2) {
  constexpr int BM = kFwdBM, BN = kFwdBN, LD = D + 8, MT = kFwdMT;
  static_assert(BM == 4 * 16 * MT, "4 warps × MT m16 tiles");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // BM×LD
  bf16* sK = sQ + BM * LD;                       // 2 stages × BN×LD
  bf16* sV = sK + 2 * BN * LD;                   // 2 stages × BN×LD

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ntiles = (S + BM - 1) / BM, nbh = int(gridDim.x) / ntiles;
  const int bh = int(blockIdx.x) % nbh;
  const int m0 = (ntiles - 1 - int(blockIdx.x) / nbh) * BM;
  const int b = bh / Hq, h = bh % Hq, g = h / (Hq / Hkv);
  const int64_t q_rs = int64_t(Hq) * D, kv_rs = int64_t(Hkv) * D;

  const int qp_first = q_start + m0, qp_last = q_start + min(m0 + BM, S) - 1;
  const int key_lo = window > 0 ? max(0, qp_first - window + 1) : 0;
  const int t_lo = key_lo / BN, t_hi = qp_last / BN;  // qp_last < Sk by contract

  const bf16* qg = q + (int64_t(b) * S + m0) * q_rs + int64_t(h) * D;
  const bf16* kg = k + int64_t(b) * Sk * kv_rs + int64_t(g) * D;
  const bf16* vg = v + int64_t(b) * Sk * kv_rs + int64_t(g) * D;

  load_rows<BM, D>(sQ, qg, q_rs, S - m0, q, tid);
  load_rows<BN, D>(sK, kg + int64_t(t_lo) * BN * kv_rs, kv_rs, Sk - t_lo * BN, k, tid);
  load_rows<BN, D>(sV, vg + int64_t(t_lo) * BN * kv_rs, kv_rs, Sk - t_lo * BN, v, tid);
  cp_async_commit();

  const int wrow = warp * 16 * MT;  // the warp's first row; its m16 tile mt starts at wrow + 16·mt
  // This thread's rows: wrow + 16·mt + lane/4 + 8·r (r = 0, 1), as query positions.
  int qp[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) qp[mt][r] = qp_first + wrow + 16 * mt + (lane >> 2) + 8 * r;
  // The warp's own first and last query positions: a warp none of whose rows sees a key tile (the
  // upper rows of a 128-row tile at its last diagonal key tile, or past the window) skips it, and
  // one that sees all of it skips the per-element mask.
  const int wq_first = qp_first + wrow, wq_last = q_start + min(m0 + wrow + 16 * MT, S) - 1;
  const bool warp_empty = m0 + wrow >= S;
  float acc[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int i = 0; i < D / 8; i++)
      acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) m_run[mt][r] = -INFINITY, l_run[mt][r] = 0.f;

  for (int t = t_lo; t <= t_hi; t++) {
    const int stage = (t - t_lo) & 1;
    if (t < t_hi) {
      const int n1 = (t + 1) * BN;
      load_rows<BN, D>(sK + (stage ^ 1) * BN * LD, kg + int64_t(n1) * kv_rs, kv_rs, Sk - n1, k,
                       tid);
      load_rows<BN, D>(sV + (stage ^ 1) * BN * LD, vg + int64_t(n1) * kv_rs, kv_rs, Sk - n1, v,
                       tid);
    }
    cp_async_commit();  // possibly empty: keeps wait_group<1> meaning "tile t has landed"
    cp_async_wait<1>();
    __syncthreads();
    const int n0 = t * BN;
    const bool warp_idle =
        warp_empty || n0 > wq_last || (window > 0 && n0 + BN - 1 <= wq_first - window);
    if (!warp_idle) {
      const bf16* sKs = sK + stage * BN * LD;
      const bf16* sVs = sV + stage * BN * LD;

      // S = Q·Kᵀ for this warp's 32 rows × BN keys; the Q fragments come from shared memory at
      // every tile (holding them would cost 64 registers).
      float s[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
          s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) load_a<LD>(qa[mt], sQ, wrow + 16 * mt, kk * 16, lane);
#pragma unroll
        for (int nn = 0; nn < BN / 16; nn++) {
          uint32_t kb[4];
          load_b_nt<LD>(kb, sKs, nn * 16, kk * 16, lane);
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma16816(s[mt][2 * nn], qa[mt], kb[0], kb[1]);
            mma16816(s[mt][2 * nn + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }

      const bool need_mask =
          n0 + BN - 1 > wq_first || (window > 0 && n0 <= wq_last - window) || n0 + BN > Sk;
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            s[mt][i][e] *= scale_log2;
            if (need_mask) {
              const int key = n0 + i * 8 + (lane & 3) * 2 + (e & 1);
              if (!key_visible(key, qp[mt][e >> 1], window)) s[mt][i][e] = -INFINITY;
            }
          }

          // Online softmax in base 2. A row can be fully masked in one tile (window edge, or the
          // diagonal tile of a row above it); its running max stays -inf and the exp base falls
          // back to 0 so no inf-inf appears.
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          float mx = m_run[mt][r];
#pragma unroll
          for (int i = 0; i < BN / 8; i++)
            mx = fmaxf(mx, fmaxf(s[mt][i][2 * r], s[mt][i][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float base = mx == -INFINITY ? 0.f : mx;
          const float alpha = exp2f(m_run[mt][r] - base);
          m_run[mt][r] = mx;
          float sum = 0.f;
#pragma unroll
          for (int i = 0; i < BN / 8; i++) {
            s[mt][i][2 * r] = exp2f(s[mt][i][2 * r] - base);
            s[mt][i][2 * r + 1] = exp2f(s[mt][i][2 * r + 1] - base);
            sum += s[mt][i][2 * r] + s[mt][i][2 * r + 1];
          }
          l_run[mt][r] = l_run[mt][r] * alpha + sum;  // per-thread partial; quad summed at the end
#pragma unroll
          for (int i = 0; i < D / 8; i++) {
            acc[mt][i][2 * r] *= alpha;
            acc[mt][i][2 * r + 1] *= alpha;
          }
        }

        // O += P·V; each V fragment feeds both m16 tiles.
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) c_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < D / 16; dn++) {
          uint32_t vb[4];
          load_b_nn<LD>(vb, sVs, kk * 16, dn * 16, lane);
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma16816(acc[mt][2 * dn], pa[mt], vb[0], vb[1]);
            mma16816(acc[mt][2 * dn + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before the next iteration refills it
  }

  // Epilogue: normalise, stage the bf16 tile in sQ (free now) and write 16-byte rows. Rows past the
  // end of the sequence (l = 0 when their warp skipped everything) are neither stored nor given an
  // lse; inv = 0 keeps them finite.
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    const int row0 = wrow + 16 * mt + (lane >> 2);
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float l = l_run[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[r] = l > 0.f ? 1.f / l : 0.f;
      const int row = m0 + row0 + 8 * r;
      if (lse && (lane & 3) == 0 && row < S)
        lse[(int64_t(b) * Hq + h) * S + row] = (m_run[mt][r] + log2f(l)) * kLn2;
    }
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
      const int col = i * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t*>(sQ + row0 * LD + col) =
          pack_bf16(acc[mt][i][0] * inv[0], acc[mt][i][1] * inv[0]);
      *reinterpret_cast<uint32_t*>(sQ + (row0 + 8) * LD + col) =
          pack_bf16(acc[mt][i][2] * inv[1], acc[mt][i][3] * inv[1]);
    }
  }
  __syncthreads();
  bf16* og = o + (int64_t(b) * S + m0) * q_rs + int64_t(h) * D;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < BM * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    if (m0 + r < S)
      *reinterpret_cast<uint4*>(og + r * q_rs + ch * 8) =
          *reinterpret_cast<const uint4*>(sQ + r * LD + ch * 8);
  }
}

// ---- backward: D = rowsum(dO ⊙ O) ----
// One warp per (b, t, h) row; Dv laid out [B,Hq,S] like lse.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dot_kernel(float* __restrict__ Dv, const bf16* __restrict__ dout,
                        const bf16* __restrict__ o, int64_t rows, int S, int Hq) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;      // row = (b·S + t)·Hq + h, the token-major order of o
  constexpr int kPer = D / 32;  // 1, 2 or 4 elements per lane
  const bf16* a = dout + row * D + lane * kPer;
  const bf16* c = o + row * D + lane * kPer;
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; i++) acc += __bfloat162float(a[i]) * __bfloat162float(c[i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int h = int(row % Hq);
    const int64_t bt = row / Hq;
    const int t = int(bt % S), b = int(bt / S);
    Dv[(int64_t(b) * Hq + h) * S + t] = acc;
  }
}

// ---- backward: dK, dV ----
// Block = NW warps × 16 keys (128 keys with the 8 warps launched). A wider key tile halves the
// global/L2 traffic of the streamed Q/dO/lse/D tiles per FLOP and the barriers per FLOP compared
// with 64 keys; every warp still owns 16 keys, so dK/dV stay in registers (128 floats per thread
// at d=128). Each step stages 64 query rows; a warp consumes them in passes of SUB columns so that
// Sᵀ and dPᵀ (2·SUB/2 floats per thread) fit next to dK/dV without spilling at d=128.
constexpr int kBwdBM = 64;   // query rows staged per step
constexpr int kBwdKvNW = 8;  // warps per dK/dV block
// The streamed tiles of both backward kernels rotate through three shared-memory stages: the copy
// for step i+2 is issued at step i, after the step's single barrier has proven that every warp is
// done with step i-1 (whose stage it overwrites). One barrier per step instead of two, and two
// steps of copy latency hidden, which matters with one 8-warp block per SM.
constexpr int kStages = 3;
template <int D>
constexpr int bwd_kv_sub() {
  return D == 128 ? 32 : 64;
}
template <int D, int NW>
constexpr int bwd_kv_smem_bytes() {
  return (2 * 16 * NW + 2 * kStages * kBwdBM) * (D + 8) * int(sizeof(bf16)) +
         2 * kStages * kBwdBM * int(sizeof(float));
}

// grid ceil(Sk/BN)·B·Hkv, linear: block x owns key tile x/(B·Hkv) of batch·kv head x%(B·Hkv) and
// walks the G query heads of the group, each over the query tiles from the diagonal to the end of
// the sequence (or of the window). Key tile 0 has the most work; ordering the tile index slowest
// starts the heavy tiles of every head first (longest-processing-time order). Queries (S local
// rows) sit at positions q_start.., keys at 0..Sk-1: masks compare positions, while q, dO, lse and
// D are indexed by the local row. A key tile that no query sees runs no step and stores zeros.
template <int D, int NW>
__global__ void __launch_bounds__(NW * 32)
    attn_bwd_dkdv_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv,
                         const bf16* __restrict__ dout, const float* __restrict__ lse,
                         const float* __restrict__ Dv, const bf16* __restrict__ q,
                         const bf16* __restrict__ k, const bf16* __restrict__ v, int S, int Sk,
                         int q_start, int Hq, int Hkv, int window, float scale, float scale_log2) {
  constexpr int NT = NW * 32, BN = 16 * NW, BM = kBwdBM, SUB = bwd_kv_sub<D>(), LD = D + 8;
  static_assert(NT >= 2 * BM && BM % SUB == 0, "lse/D staging needs a thread per value");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);                  // BN×LD
  bf16* sV = sK + BN * LD;                                       // BN×LD
  bf16* sQ = sV + BN * LD;                                       // kStages × BM×LD
  bf16* sO = sQ + kStages * BM * LD;                             // dO, kStages × BM×LD
  float* sL = reinterpret_cast<float*>(sO + kStages * BM * LD);  // lse, kStages × BM
  float* sD = sL + kStages * BM;                                 // D, kStages × BM

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nbh = int(gridDim.x) / ((Sk + BN - 1) / BN);
  const int bg = int(blockIdx.x) % nbh;
  const int n0 = int(blockIdx.x) / nbh * BN;
  const int b = bg / Hkv, g = bg % Hkv, G = Hq / Hkv;
  const int64_t q_rs = int64_t(Hq) * D, kv_rs = int64_t(Hkv) * D;

  // The local query rows that can see a key of the tile: first_q (the tile's first key as a query
  // position, or row 0) to last_q (the last row, or the last position inside the window of the
  // tile's last key). Empty (first_q > last_q) for a tile past the queries or before the window
  // of the first one: no steps, and dK = dV = 0.
  const int first_q = max(0, n0 - q_start);
  const int last_q =
      window > 0 ? int(min(int64_t(S - 1), int64_t(n0) + BN - 1 + window - 1 - q_start)) : S - 1;
  const int tq_lo = first_q / BM;
  const int ntq = first_q <= last_q ? last_q / BM - tq_lo + 1 : 0;
  const int iters = G * ntq;

  const bf16* kg = k + (int64_t(b) * Sk + n0) * kv_rs + int64_t(g) * D;
  const bf16* vg = v + (int64_t(b) * Sk + n0) * kv_rs + int64_t(g) * D;
  if (iters > 0) {
    load_rows<BN, D, NT>(sK, kg, kv_rs, Sk - n0, k, tid);
    load_rows<BN, D, NT>(sV, vg, kv_rs, Sk - n0, v, tid);
  }

  // Loads the query tile of step `it` (head h = g·G + it/ntq, tile tq_lo + it%ntq) into `stage`.
  auto load_step = [&](int it, int stage) {
    const int h = g * G + it / ntq, m0 = (tq_lo + it % ntq) * BM;
    const int64_t tok = int64_t(b) * S + m0;
    load_rows<BM, D, NT>(sQ + stage * BM * LD, q + tok * q_rs + int64_t(h) * D, q_rs, S - m0, q,
                         tid);
    load_rows<BM, D, NT>(sO + stage * BM * LD, dout + tok * q_rs + int64_t(h) * D, q_rs, S - m0,
                         dout, tid);
    if (tid < 2 * BM) {  // threads 0..BM-1 fetch lse, BM..2BM-1 fetch D
      const int r = tid % BM;
      const bool ok = m0 + r < S;
      const int64_t li = (int64_t(b) * Hq + h) * S + m0 + r;
      if (tid < BM)
        cp_async4(sL + stage * BM + r, ok ? lse + li : lse, ok);
      else
        cp_async4(sD + stage * BM + r, ok ? Dv + li : Dv, ok);
    }
  };
  if (iters > 0) load_step(0, 0);
  cp_async_commit();
  if (iters > 1) load_step(1, 1);
  cp_async_commit();  // possibly empty: group i always holds step i

  float dK[D / 8][4], dV[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) dK[i][e] = dV[i][e] = 0.f;
  const int krow0 = warp * 16;  // this warp's keys within the tile
  const int key[2] = {n0 + krow0 + (lane >> 2), n0 + krow0 + (lane >> 2) + 8};

  for (int it = 0; it < iters; it++) {
    const int stage = it % kStages;
    cp_async_wait<1>();  // step it has landed (step it+1 may still be in flight) ...
    __syncthreads();     // ... for every thread; and every warp has finished step it-1
    if (it + 2 < iters) load_step(it + 2, (it + 2) % kStages);
    cp_async_commit();
    const bf16* sQs = sQ + stage * BM * LD;
    const bf16* sOs = sO + stage * BM * LD;
    const float* sLs = sL + stage * BM;
    const float* sDs = sD + stage * BM;
    const int m0 = (tq_lo + it % ntq) * BM, qp0 = q_start + m0;  // local row, its position
    // Only steps whose 128-query block straddles the block's diagonal, the window edge or the
    // sequence end pay for the mask. (A per-warp skip of the steps a warp's 16 keys cannot see,
    // with a per-warp mask decision, measured 6.5% slower on the H200 at B4 S4096 Hq8 Hkv2 d128:
    // 2.15 against 2.01 ms, docs/bench/h200-2026-12-03d/attention_dkdv_ab.txt.) Keys past Sk lie
    // above every query position, so the diagonal term covers them.
    const bool need_mask =
        qp0 < n0 + BN - 1 || (window > 0 && qp0 + BM - 1 - window >= n0) || m0 + BM > S;

    // Passes of SUB query columns; not unrolled so that two passes never hold registers at once.
#pragma unroll 1
    for (int c0 = 0; c0 < BM; c0 += SUB) {
      // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for 16 keys × SUB queries.
      float st[SUB / 8][4], dpt[SUB / 8][4];
#pragma unroll
      for (int i = 0; i < SUB / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t ka[4], va[4];
        load_a<LD>(ka, sK, krow0, kk * 16, lane);
        load_a<LD>(va, sV, krow0, kk * 16, lane);
#pragma unroll
        for (int nn = 0; nn < SUB / 16; nn++) {
          uint32_t qb[4], ob[4];
          load_b_nt<LD>(qb, sQs, c0 + nn * 16, kk * 16, lane);
          load_b_nt<LD>(ob, sOs, c0 + nn * 16, kk * 16, lane);
          mma16816(st[2 * nn], ka, qb[0], qb[1]);
          mma16816(st[2 * nn + 1], ka, qb[2], qb[3]);
          mma16816(dpt[2 * nn], va, ob[0], ob[1]);
          mma16816(dpt[2 * nn + 1], va, ob[2], ob[3]);
        }
      }

      // Pᵀ = exp2(S·scale·log2e − lse·log2e); dSᵀ = Pᵀ ⊙ (dPᵀ − D). The softmax scale of dS is
      // applied once to dK at the end.
#pragma unroll
      for (int i = 0; i < SUB / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int qi = c0 + i * 8 + (lane & 3) * 2 + (e & 1);
          float p = exp2f(st[i][e] * scale_log2 - sLs[qi] * kLog2e);
          if (need_mask && (m0 + qi >= S || !key_visible(key[e >> 1], qp0 + qi, window))) p = 0.f;
          st[i][e] = p;
          dpt[i][e] = p * (dpt[i][e] - sDs[qi]);
        }

        // dV += Pᵀ·dO, dK += dSᵀ·Q
#pragma unroll
      for (int kq = 0; kq < SUB / 16; kq++) {
        uint32_t pa[4], sa[4];
        c_to_a(pa, st[2 * kq], st[2 * kq + 1]);
        c_to_a(sa, dpt[2 * kq], dpt[2 * kq + 1]);
#pragma unroll
        for (int dn = 0; dn < D / 16; dn++) {
          uint32_t ob[4], qb[4];
          load_b_nn<LD>(ob, sOs, c0 + kq * 16, dn * 16, lane);
          load_b_nn<LD>(qb, sQs, c0 + kq * 16, dn * 16, lane);
          mma16816(dV[2 * dn], pa, ob[0], ob[1]);
          mma16816(dV[2 * dn + 1], pa, ob[2], ob[3]);
          mma16816(dK[2 * dn], sa, qb[0], qb[1]);
          mma16816(dK[2 * dn + 1], sa, qb[2], qb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending; never exit with copies in flight
  __syncthreads();     // every warp is done reading sK/sV

  // Stage the bf16 tiles in sK/sV for 16-byte coalesced stores.
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = krow0 + (lane >> 2) + 8 * r;
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
      const int col = i * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t*>(sK + row * LD + col) =
          pack_bf16(dK[i][2 * r] * scale, dK[i][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(sV + row * LD + col) = pack_bf16(dV[i][2 * r], dV[i][2 * r + 1]);
    }
  }
  __syncthreads();
  bf16* dkg = dk + (int64_t(b) * Sk + n0) * kv_rs + int64_t(g) * D;
  bf16* dvg = dv + (int64_t(b) * Sk + n0) * kv_rs + int64_t(g) * D;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < BN * kChunks; c += NT) {
    const int r = c / kChunks, ch = c % kChunks;
    if (n0 + r < Sk) {
      *reinterpret_cast<uint4*>(dkg + r * kv_rs + ch * 8) =
          *reinterpret_cast<const uint4*>(sK + r * LD + ch * 8);
      *reinterpret_cast<uint4*>(dvg + r * kv_rs + ch * 8) =
          *reinterpret_cast<const uint4*>(sV + r * LD + ch * 8);
    }
  }
}

// ---- backward: dQ ----
// Block = NW warps × 16 query rows (128 with the 8 warps launched), 64-key K/V tiles
// double-buffered: the wider query tile halves the K/V traffic per FLOP against 64 rows.
constexpr int kDqBN = 64;
constexpr int kDqNW = 8;
template <int D, int NW>
constexpr int bwd_dq_smem_bytes() {
  return (2 * 16 * NW + 2 * kStages * kDqBN) * (D + 8) * int(sizeof(bf16));
}

// grid ceil(S/BM)·B·Hq, linear, last query tile first (as the forward). Each warp owns 16 query
// rows and sums dS·K over the visible key tiles in ascending order. Query row m0 + r (local: q,
// dO, lse, D, dQ) sits at position q_start + m0 + r; keys at 0..Sk-1.
template <int D, int NW>
__global__ void __launch_bounds__(NW * 32)
    attn_bwd_dq_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout,
                       const float* __restrict__ lse, const float* __restrict__ Dv,
                       const bf16* __restrict__ q, const bf16* __restrict__ k,
                       const bf16* __restrict__ v, int S, int Sk, int q_start, int Hq, int Hkv,
                       int window, float scale, float scale_log2) {
  constexpr int NT = NW * 32, BM = 16 * NW, BN = kDqBN, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // BM×LD
  bf16* sO = sQ + BM * LD;                       // dO, BM×LD
  bf16* sK = sO + BM * LD;                       // kStages × BN×LD
  bf16* sV = sK + kStages * BN * LD;             // kStages × BN×LD

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ntiles = (S + BM - 1) / BM, nbh = int(gridDim.x) / ntiles;
  const int bh = int(blockIdx.x) % nbh;
  const int m0 = (ntiles - 1 - int(blockIdx.x) / nbh) * BM;
  const int b = bh / Hq, h = bh % Hq, g = h / (Hq / Hkv);
  const int64_t q_rs = int64_t(Hq) * D, kv_rs = int64_t(Hkv) * D;
  const int qp_first = q_start + m0, qp_last = q_start + min(m0 + BM, S) - 1;  // positions
  const int t_lo = (window > 0 ? max(0, qp_first - window + 1) : 0) / BN;
  const int t_hi = qp_last / BN;  // qp_last < Sk by contract

  const int64_t tok = int64_t(b) * S + m0;
  load_rows<BM, D, NT>(sQ, q + tok * q_rs + int64_t(h) * D, q_rs, S - m0, q, tid);
  load_rows<BM, D, NT>(sO, dout + tok * q_rs + int64_t(h) * D, q_rs, S - m0, dout, tid);
  const bf16* kg = k + int64_t(b) * Sk * kv_rs + int64_t(g) * D;
  const bf16* vg = v + int64_t(b) * Sk * kv_rs + int64_t(g) * D;
  load_rows<BN, D, NT>(sK, kg + int64_t(t_lo) * BN * kv_rs, kv_rs, Sk - t_lo * BN, k, tid);
  load_rows<BN, D, NT>(sV, vg + int64_t(t_lo) * BN * kv_rs, kv_rs, Sk - t_lo * BN, v, tid);
  cp_async_commit();
  // Loads key tile t into stage (t - t_lo) % kStages.
  auto load_kv = [&](int t) {
    const int n1 = t * BN, st = (t - t_lo) % kStages;
    load_rows<BN, D, NT>(sK + st * BN * LD, kg + int64_t(n1) * kv_rs, kv_rs, Sk - n1, k, tid);
    load_rows<BN, D, NT>(sV + st * BN * LD, vg + int64_t(n1) * kv_rs, kv_rs, Sk - n1, v, tid);
  };
  if (t_lo < t_hi) load_kv(t_lo + 1);
  cp_async_commit();  // possibly empty: group j always holds key tile t_lo + j

  const int row0 = warp * 16 + (lane >> 2);
  const int qi[2] = {m0 + row0, m0 + row0 + 8};            // local rows
  const int qpos[2] = {q_start + qi[0], q_start + qi[1]};  // their positions
  // The warp's own first and last query rows: a warp whose 16 rows see only part of a key tile
  // masks, the others (most warps on a 128-row tile's diagonal tiles) skip the per-element test.
  const int wq_first = m0 + warp * 16, wq_last = min(wq_first + 15, S - 1);  // local
  const int wp_first = q_start + wq_first, wp_last = q_start + wq_last;      // positions
  float lse2[2], dd[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const bool ok = qi[r] < S;
    const int64_t li = (int64_t(b) * Hq + h) * S + qi[r];
    lse2[r] = ok ? lse[li] * kLog2e : 0.f;
    dd[r] = ok ? Dv[li] : 0.f;
  }
  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  for (int t = t_lo; t <= t_hi; t++) {
    const int stage = (t - t_lo) % kStages;
    cp_async_wait<1>();  // key tile t has landed (t+1 may still be in flight) ...
    __syncthreads();     // ... for every thread; and every warp has finished tile t-1
    if (t + 2 <= t_hi) load_kv(t + 2);
    cp_async_commit();
    const int n0 = t * BN;
    // A warp whose rows all lie above this key tile's first key (possible at the diagonal of a
    // 128-row block) or all past the window has nothing to add: P is 0 for every element.
    const bool warp_idle =
        wp_last < n0 || (window > 0 && wp_first - window + 1 > n0 + BN - 1) || wq_first >= S;
    if (!warp_idle) {
      const bf16* sKs = sK + stage * BN * LD;
      const bf16* sVs = sV + stage * BN * LD;

      // S = Q·Kᵀ, dP = dO·Vᵀ (16 rows × BN keys per warp)
      float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
      for (int i = 0; i < BN / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t qa[4], oa[4];
        load_a<LD>(qa, sQ, warp * 16, kk * 16, lane);
        load_a<LD>(oa, sO, warp * 16, kk * 16, lane);
#pragma unroll
        for (int nn = 0; nn < BN / 16; nn++) {
          uint32_t kb[4], vb[4];
          load_b_nt<LD>(kb, sKs, nn * 16, kk * 16, lane);
          load_b_nt<LD>(vb, sVs, nn * 16, kk * 16, lane);
          mma16816(s[2 * nn], qa, kb[0], kb[1]);
          mma16816(s[2 * nn + 1], qa, kb[2], kb[3]);
          mma16816(dp[2 * nn], oa, vb[0], vb[1]);
          mma16816(dp[2 * nn + 1], oa, vb[2], vb[3]);
        }
      }

      const bool need_mask =
          n0 + BN - 1 > wp_first || (window > 0 && n0 <= wp_last - window) || n0 + BN > Sk;
#pragma unroll
      for (int i = 0; i < BN / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = e >> 1;
          float p = exp2f(s[i][e] * scale_log2 - lse2[r]);
          if (need_mask && !key_visible(n0 + i * 8 + (lane & 3) * 2 + (e & 1), qpos[r], window))
            p = 0.f;
          s[i][e] = p * (dp[i][e] - dd[r]);  // dS (unscaled)
        }

        // dQ += dS·K
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        uint32_t sa[4];
        c_to_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < D / 16; dn++) {
          uint32_t kb[4];
          load_b_nn<LD>(kb, sKs, kk * 16, dn * 16, lane);
          mma16816(acc[2 * dn], sa, kb[0], kb[1]);
          mma16816(acc[2 * dn + 1], sa, kb[2], kb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending
  __syncthreads();     // every warp is done reading sQ

  // Stage through sQ for 16-byte coalesced stores.
#pragma unroll
  for (int i = 0; i < D / 8; i++) {
    const int col = i * 8 + (lane & 3) * 2;
    *reinterpret_cast<uint32_t*>(sQ + row0 * LD + col) =
        pack_bf16(acc[i][0] * scale, acc[i][1] * scale);
    *reinterpret_cast<uint32_t*>(sQ + (row0 + 8) * LD + col) =
        pack_bf16(acc[i][2] * scale, acc[i][3] * scale);
  }
  __syncthreads();
  bf16* dqg = dq + tok * q_rs + int64_t(h) * D;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < BM * kChunks; c += NT) {
    const int r = c / kChunks, ch = c % kChunks;
    if (m0 + r < S)
      *reinterpret_cast<uint4*>(dqg + r * q_rs + ch * 8) =
          *reinterpret_cast<const uint4*>(sQ + r * LD + ch * 8);
  }
}

// ---- host side ----
[[noreturn]] void bad_args(const std::string& what) {
  ::zaya::detail::platform_fail("CUDA", "attention", __FILE__, __LINE__, what);
}

void check_shapes(int64_t B, int64_t S, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv,
                  int64_t d) {
  if (d != 32 && d != 64 && d != 128)
    bad_args("head dim " + std::to_string(d) + " not supported (32, 64 or 128)");
  if (B < 0 || S < 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    bad_args("bad shape: B " + std::to_string(B) + " S " + std::to_string(S) + " Hq " +
             std::to_string(Hq) + " Hkv " + std::to_string(Hkv));
  if (q_start < 0 || Sk < q_start + S)
    bad_args("keys " + std::to_string(Sk) + " do not cover queries at " + std::to_string(q_start) +
             "+" + std::to_string(S));
  // Kernel index arithmetic is 32-bit within one sequence; the grids are linear over
  // (tile, batch·head) with at most 2³¹−1 blocks (64-row tiles are the smallest).
  if (Sk > (int64_t(1) << 30) || B * Hq > 65535 || (S + 63) / 64 * B * Hq > INT32_MAX)
    bad_args("sequence or batch·heads too large for the attention grid");
}

// Raises a kernel's dynamic shared-memory limit above the 48 KiB default. Called on every launch
// (about a microsecond) because the attribute belongs to the current device's context.
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  ZAYA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int D>
void launch_fwd(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                int64_t S, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t window,
                cudaStream_t st) {
  constexpr int smem = fwd_smem_bytes<D>();
  allow_smem(attn_fwd_kernel<D>, smem);
  const dim3 grid(unsigned((S + kFwdBM - 1) / kFwdBM * B * Hq));
  const float scale_log2 = float(1.0 / std::sqrt(double(D))) * kLog2e;
  attn_fwd_kernel<D><<<grid, kThreads, smem, st>>>(o, lse, q, k, v, int(S), int(Sk), int(q_start),
                                                   int(Hq), int(Hkv), int(window), scale_log2);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* o, const float* lse,
                const bf16* q, const bf16* k, const bf16* v, float* Dv, int64_t B, int64_t S,
                int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t window,
                cudaStream_t st) {
  constexpr int smem_kv = bwd_kv_smem_bytes<D, kBwdKvNW>(), smem_dq = bwd_dq_smem_bytes<D, kDqNW>();
  allow_smem(attn_bwd_dkdv_kernel<D, kBwdKvNW>, smem_kv);
  allow_smem(attn_bwd_dq_kernel<D, kDqNW>, smem_dq);
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float scale_log2 = scale * kLog2e;

  const int64_t rows = B * S * Hq;
  const int64_t warps_per_block = kThreads / 32;
  attn_bwd_dot_kernel<D>
      <<<unsigned((rows + warps_per_block - 1) / warps_per_block), kThreads, 0, st>>>(
          Dv, dout, o, rows, int(S), int(Hq));
  ZAYA_CUDA_CHECK(cudaGetLastError());

  constexpr int kv_bn = 16 * kBwdKvNW, dq_bm = 16 * kDqNW;
  // dK/dV: one block per key tile over all Sk keys (tiles no query sees store zeros).
  const dim3 grid_kv(unsigned((Sk + kv_bn - 1) / kv_bn * B * Hkv));
  attn_bwd_dkdv_kernel<D, kBwdKvNW><<<grid_kv, kBwdKvNW * 32, smem_kv, st>>>(
      dk, dv, dout, lse, Dv, q, k, v, int(S), int(Sk), int(q_start), int(Hq), int(Hkv), int(window),
      scale, scale_log2);
  ZAYA_CUDA_CHECK(cudaGetLastError());

  const dim3 grid_dq(unsigned((S + dq_bm - 1) / dq_bm * B * Hq));
  attn_bwd_dq_kernel<D, kDqNW><<<grid_dq, kDqNW * 32, smem_dq, st>>>(
      dq, dout, lse, Dv, q, k, v, int(S), int(Sk), int(q_start), int(Hq), int(Hkv), int(window),
      scale, scale_log2);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention_fwd(bf16* o, float* lse_BHS, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                   int64_t S, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
                   int64_t window, cudaStream_t st) {
  check_shapes(B, S, Sk, q_start, Hq, Hkv, d);
  if (B == 0 || S == 0) return;
  switch (d) {
    case 32: launch_fwd<32>(o, lse_BHS, q, k, v, B, S, Sk, q_start, Hq, Hkv, window, st); break;
    case 64: launch_fwd<64>(o, lse_BHS, q, k, v, B, S, Sk, q_start, Hq, Hkv, window, st); break;
    default: launch_fwd<128>(o, lse_BHS, q, k, v, B, S, Sk, q_start, Hq, Hkv, window, st); break;
  }
}

size_t attention_bwd_workspace_bytes(int64_t B, int64_t S, int64_t Hq, int64_t /*Hkv*/,
                                     int64_t /*d*/) {
  // D = rowsum(dO ⊙ O), fp32 [B,Hq,S], plus the arena's 256-byte alignment slack.
  return size_t(B * Hq * S) * sizeof(float) + 256;
}

void attention_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* o,
                   const float* lse_BHS, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                   int64_t S, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
                   int64_t window, Workspace& ws, cudaStream_t st) {
  check_shapes(B, S, Sk, q_start, Hq, Hkv, d);
  // check_shapes bounds the query-tile grids; the dK/dV grid runs over the Sk keys.
  if ((Sk + 16 * kBwdKvNW - 1) / (16 * kBwdKvNW) * B * Hkv > INT32_MAX)
    bad_args("keys or batch·kv heads too large for the dK/dV grid");
  if (B == 0 || Sk == 0) return;
  if (S == 0) {  // no queries (the kernels' grids would be empty): every key's gradient is 0
    const size_t bytes = size_t(B * Sk * Hkv * d) * sizeof(bf16);
    ZAYA_CUDA_CHECK(cudaMemsetAsync(dk, 0, bytes, st));
    ZAYA_CUDA_CHECK(cudaMemsetAsync(dv, 0, bytes, st));
    return;
  }
  float* Dv = ws.take_n<float>(size_t(B * Hq * S));
  switch (d) {
    case 32:
      launch_bwd<32>(dq, dk, dv, dout, o, lse_BHS, q, k, v, Dv, B, S, Sk, q_start, Hq, Hkv, window,
                     st);
      break;
    case 64:
      launch_bwd<64>(dq, dk, dv, dout, o, lse_BHS, q, k, v, Dv, B, S, Sk, q_start, Hq, Hkv, window,
                     st);
      break;
    default:
      launch_bwd<128>(dq, dk, dv, dout, o, lse_BHS, q, k, v, Dv, B, S, Sk, q_start, Hq, Hkv, window,
                      st);
      break;
  }
}

// The self-attention form: S queries at 0 over their own S keys.
void attention_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* o,
                   const float* lse_BHS, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                   int64_t S, int64_t Hq, int64_t Hkv, int64_t d, int64_t window, Workspace& ws,
                   cudaStream_t st) {
  attention_bwd(dq, dk, dv, dout, o, lse_BHS, q, k, v, B, S, S, 0, Hq, Hkv, d, window, ws, st);
}

}  // namespace zaya::cuda
