// CCA (compressed convolutional attention, ZAYA1.md §3.1) on the GPU: the two causal convolutions
// over the packed [q0 | k0] channels (depthwise kernel t0, then grouped kernel t1 with one d×d
// group per head) and the step after them (mean skip, QK-norm with temperature on k, partial NeoX
// RoPE, delayed values), forward and backward. The specification is the CPU reference
// (cpu::cca_mean_skip, cca_conv, qk_norm, rope and their backward passes) composed as
// ZayaModel::attention_forward and Trainer::attention_bwd compose them.
//
// Design (fp32 math throughout; no tensor cores: the tests hold conv and mid to 1e-5·max|ref|,
// which TF32/bf16 products would not meet):
// - The grouped conv, forward and data gradient, is a banded GEMM per head group:
//     out[m, n] = bias[n] + Σ_{k<d, j<t1} in[m + j, k] · W_j[k, n]
//   One block computes a 128-row × (16·RN)-column output tile (256 threads, 8 rows × RN columns
//   each, RN = 8 at d % 128 = 0) and streams K in chunks of 8 channels through a two-stage
//   cp.async pipeline: the input slice [128 + t1 − 1 rows × 8 channels] stored transposed (so a
//   thread's 8 consecutive rows are two float4 loads), and the 8·t1 weight rows of the chunk. Each
//   thread loads its 8 + t1 − 1 input values per channel once and reuses them for all t1 taps
//   (the band shifts the window by one row per tap): 64 FMAs per 2 float4 weight loads.
// - Forward input: the depthwise output u. In training (mid given) a pointwise kernel writes u to
//   mid first and the GEMM reads it with cp.async; without mid (inference prefill) the GEMM's
//   loader computes u from the bf16 rows itself. Decoding (B·S ≤ 16) takes a direct kernel: one
//   block per (token, group), u in shared memory, one warp per output channel over the
//   contiguous weight row; no large shared memory, no per-call attribute setting.
// - Backward: the data gradient du is the same GEMM with dy as input and the kernel flipped in
//   time and transposed per group; a per-channel pass forms the depthwise data gradient (added into
//   dqkv) and per-chunk partials of dwdw, dbdw, dbg; the grouped weight gradient is, per group and
//   tap, a 128×128 GEMM reducing over a fixed number of token chunks (about two waves of blocks),
//   each writing its own partial. Partials are summed in a fixed order by a second pass: no
//   float atomics, so results are bit-reproducible.
// - Finish: one warp per (token, head): mean skip, norm (warp reduction), RoPE from a per-warp
//   shared row. RoPE's inverse frequencies are computed on the host with the CPU reference's fp32
//   formula and passed by value, so only sin/cos (accurate, not the fast intrinsics) can differ.
// Not here: the projections (GEMMs), attention itself, and KV-cache writes (the caller copies k,
// v).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/ops.h"
#include "core/cuda_check.h"

namespace zaya::cuda {
namespace {

constexpr int kThreads = 256;  // 16 × 16 threads for the GEMM-shaped kernels
constexpr int kTM = 128;       // output rows per block of the banded GEMM (16 thread rows × 8)
constexpr int kKC = 8;         // K channels per pipeline stage of the banded GEMM
constexpr int kMaxT = 8;       // largest kernel size t0, t1 (register arrays)
constexpr int kRS =
    kTM + kMaxT;         // row stride of a transposed input stage (≥ kTM + t1 − 1, ≡ 0 mod 4)
constexpr int kWT = 16;  // tokens per pipeline stage of the weight-gradient GEMM
constexpr int kWgBlocks = 512;   // target block count of the weight gradient (~2 waves at 2/SM)
constexpr int kRB = 64;          // rows per block of the depthwise backward (one partial each)
constexpr int kDirectRows = 16;  // B·S up to this takes the direct (decode) forward kernel
constexpr int kMaxD = 256;       // largest head dim of the finish kernels (8 values per lane)
constexpr int kMaxHalfR = 64;    // largest r/2 (the inverse-frequency table passed by value)
constexpr size_t kDefaultSmem = 48 * 1024;  // dynamic shared memory without an opt-in

[[noreturn]] void fail(const char* fn, const std::string& what) {
  detail::platform_fail("CCA", fn, __FILE__, __LINE__, what);
}

void check_launch(const char* fn) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail(fn, std::string("kernel launch: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

size_t aligned(size_t bytes) {
  return (bytes + 255) / 256 * 256 + 256;
}  // + Workspace::take pad

__device__ __forceinline__ float bf(const bf16 x) {
  return __bfloat162float(x);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Asynchronous global → shared copies (sm_80+). A false `valid` copies nothing and zero-fills the
// destination (src-size 0); the source address is still a valid one (callers clamp it).
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most one committed group (the one just issued) is still in flight.
__device__ __forceinline__ void cp_async_wait_prev() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// Output-channel tile of the conv GEMMs: 16 threads × RN columns.
int conv_rn(int64_t d) {
  return d % 128 == 0 ? 8 : d % 64 == 0 ? 4 : d % 32 == 0 ? 2 : d % 16 == 0 ? 1 : 0;
}

// Column (or row) q of thread coordinate x in a 16·RN tile: RN = 8 splits into two float4 halves
// 64 apart (so 16 lanes read 256 contiguous bytes per load), else RN consecutive columns.
template <int RN>
__device__ __forceinline__ int tile_col(int x, int q) {
  return RN == 8 ? x * 4 + (q & 3) + (q >> 2) * 64 : x * RN + q;
}
// v[q] = row[tile_col<RN>(x, q)] from shared memory (row 16-byte aligned).
template <int RN>
__device__ __forceinline__ void load_tile_row(const float* row, int x, float (&v)[RN]) {
  if constexpr (RN == 8) {
    const float4 a = *reinterpret_cast<const float4*>(row + x * 4);
    const float4 b = *reinterpret_cast<const float4*>(row + 64 + x * 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else if constexpr (RN == 4) {
    const float4 a = *reinterpret_cast<const float4*>(row + x * 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else if constexpr (RN == 2) {
    const float2 a = *reinterpret_cast<const float2*>(row + x * 2);
    v[0] = a.x, v[1] = a.y;
  } else {
    v[0] = row[x];
  }
}

void check_conv_shape(const char* fn, int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1) {
  if (d <= 0 || C <= 0 || C % d != 0)
    fail(fn, "conv channels C=" + std::to_string(C) +
                 " must be a positive multiple of d=" + std::to_string(d));
  if (conv_rn(d) == 0) fail(fn, "head dim d=" + std::to_string(d) + " must be a multiple of 16");
  if (t0 < 1 || t1 < 1 || t0 > kMaxT || t1 > kMaxT)
    fail(fn, "conv kernel sizes t0=" + std::to_string(t0) + ", t1=" + std::to_string(t1) +
                 " must lie in [1, " + std::to_string(kMaxT) + "]");
  if (S > INT32_MAX / 2) fail(fn, "sequence too long: " + std::to_string(S));
}

// Depthwise output u[b, i, c] = bdw[c] + Σ_j wdw[c,j] · p[b, i+j, c] over the left-padded input
// p = [history or zeros (P columns) | x (S)], exactly as cpu::cca_conv forms it. i + j − P < S for
// every i < M = S + t1 − 1, so x is never read past the sequence.
__device__ __forceinline__ float depthwise_at(const bf16* qkv, int64_t ld, const float* hist,
                                              const float* wdw, const float* bdw, int b, int i,
                                              int c, int S, int C, int t0, int P) {
  float s = bdw[c];
  for (int j = 0; j < t0; j++) {
    const int pi = i + j;
    float xv;
    if (pi >= P)
      xv = bf(qkv[(int64_t(b) * S + pi - P) * ld + c]);
    else
      xv = hist ? hist[(int64_t(b) * P + pi) * C + c] : 0.0f;
    s += wdw[c * t0 + j] * xv;
  }
  return s;
}

// mid[b, i, c] = u[b, i, c] for all i < M (training: written once, read by the conv GEMM and by
// the weight gradient in backward).
__global__ void depthwise_fwd_kernel(float* __restrict__ mid, const bf16* __restrict__ qkv,
                                     int64_t ld, const float* __restrict__ hist,
                                     const float* __restrict__ wdw, const float* __restrict__ bdw,
                                     int S, int C, int t0, int t1, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int M = S + t1 - 1, P = (t0 - 1) + (t1 - 1);
  const int c = int(idx % C);
  const int64_t row = idx / C;
  const int b = int(row / M), i = int(row % M);
  mid[idx] = depthwise_at(qkv, ld, hist, wdw, bdw, b, i, c, S, C, t0, P);
}

// ---- banded grouped GEMM (forward conv and its data gradient) ----------------------------------
//
// For one head group (channels c0..c0+d), one sequence b and the block's 128 output rows from T0:
//   forward (kMid / kDepthwise): in[r] = u at index T0 + r (zero at r ≥ M), W_j[ci, co] =
//     wg[co, ci, j], bias bg, out = y at token b·S + T0 + m;
//   data gradient (kGrad): in[r] = dy at time T0 − (t1−1) + r (zero outside [0,S)),
//     W_j'[co, ci] = wg[co, ci, t1−1−j'] (flipped in time), no bias, out = du at index T0 + m.
// Shared memory per stage: a_s [kKC][kRS] (input transposed: channel-major, rows contiguous) and
// w_s [kKC·t1][TN+4] (row k = kc·t1 + j; +4 keeps rows 16-byte aligned and spreads the
// transposing 4-byte copies over banks).
enum BandMode { kMid = 0, kDepthwise = 1, kGrad = 2 };

size_t band_smem_bytes(int rn, int64_t t1) {
  const int64_t TN = 16 * rn;
  return size_t(2 * (kKC * kRS + kKC * t1 * (TN + 4))) * sizeof(float);
}

template <int RN, int kMode>
__global__ void __launch_bounds__(kThreads, 2)
    conv_band_kernel(float* __restrict__ out, const float* __restrict__ src,
                     const bf16* __restrict__ qkv, int64_t ld, const float* __restrict__ hist,
                     const float* __restrict__ wdw, const float* __restrict__ bdw,
                     const float* __restrict__ wg, const float* __restrict__ bg, int S, int C,
                     int d, int t0, int t1) {
  constexpr int TN = 16 * RN, WS = TN + 4;
  constexpr bool kForward = kMode != kGrad;
  extern __shared__ float4 smem_f4[];  // float4: 16-byte aligned base
  float* smem = reinterpret_cast<float*>(smem_f4);
  const int KW = kKC * t1;  // weight rows per stage
  // Stage st: a_s at smem + st·kKC·kRS, w_s at smem + 2·kKC·kRS + st·KW·WS (offsets, not a pointer
  // array: a dynamically indexed local array would live in local memory).
  float* const w_base = smem + 2 * kKC * kRS;

  const int ntile = d / TN;
  const int g = blockIdx.y / ntile, n0 = (blockIdx.y % ntile) * TN, c0 = g * d;
  const int b = blockIdx.z;
  const int P = (t0 - 1) + (t1 - 1), M = S + t1 - 1;
  const int T0 = blockIdx.x * kTM;
  const int R = kTM + t1 - 1;  // input rows of the band
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int K = d * t1;  // length of one wg row (co): (ci, j) with j fastest

  // Stage `st` ← K chunk [kc0, kc0 + kKC).
  auto load_stage = [&](int st, int kc0) {
    float* a_s = smem + st * (kKC * kRS);
    float* w_s = w_base + st * (KW * WS);
    for (int e = tid; e < R * kKC; e += kThreads) {
      const int r = e / kKC, kc = e % kKC, c = c0 + kc0 + kc;
      float* dst = a_s + kc * kRS + r;
      if constexpr (kMode == kMid) {
        const int i = T0 + r;
        const bool ok = i < M;
        cp_async4(dst, src + (int64_t(b) * M + (ok ? i : 0)) * C + c, ok);
      } else if constexpr (kMode == kGrad) {
        const int t = T0 - (t1 - 1) + r;
        const bool ok = t >= 0 && t < S;
        cp_async4(dst, src + (int64_t(b) * S + (ok ? t : 0)) * C + c, ok);
      } else {
        const int i = T0 + r;
        *dst = i < M ? depthwise_at(qkv, ld, hist, wdw, bdw, b, i, c, S, C, t0, P) : 0.0f;
      }
    }
    for (int e = tid; e < KW * TN; e += kThreads) {
      if constexpr (kForward) {
        // Row co = n0 + n of wg holds this chunk's (ci, j) pairs contiguously: k fastest.
        const int n = e / KW, k = e % KW;
        cp_async4(w_s + k * WS + n, wg + int64_t(c0 + n0 + n) * K + kc0 * t1 + k, true);
      } else {
        // Row co = kc0 + kc of wg, columns (ci = n0 + n, j) contiguous: (n, j) fastest.
        const int kc = e / (TN * t1), rem = e % (TN * t1), n = rem / t1, jw = rem % t1;
        cp_async4(w_s + (kc * t1 + (t1 - 1 - jw)) * WS + n,
                  wg + int64_t(c0 + kc0 + kc) * K + int64_t(n0 + n) * t1 + jw, true);
      }
    }
  };

  float acc[8][RN];
#pragma unroll
  for (int q = 0; q < RN; q++) {
    const float bias = kForward ? bg[c0 + n0 + tile_col<RN>(tx, q)] : 0.0f;
#pragma unroll
    for (int p = 0; p < 8; p++) acc[p][q] = bias;
  }

  const int nk = d / kKC;
  load_stage(0, 0);
  cp_async_commit();
  for (int s = 0; s < nk; s++) {
    if (s + 1 < nk) load_stage((s + 1) & 1, (s + 1) * kKC);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = stage s
    cp_async_wait_prev();
    __syncthreads();  // stage s landed for every thread
    const float* a_s = smem + (s & 1) * (kKC * kRS);
    const float* w_s = w_base + (s & 1) * (KW * WS);
#pragma unroll 1
    for (int kc = 0; kc < kKC; kc++) {
      // Rows ty·8 .. ty·8 + 7 + (t1−1) of channel kc: the window every tap slides over.
      const float* ar = a_s + kc * kRS + ty * 8;
      float a[8 + kMaxT - 1];
      const float4 lo = *reinterpret_cast<const float4*>(ar);
      const float4 hi = *reinterpret_cast<const float4*>(ar + 4);
      a[0] = lo.x, a[1] = lo.y, a[2] = lo.z, a[3] = lo.w;
      a[4] = hi.x, a[5] = hi.y, a[6] = hi.z, a[7] = hi.w;
#pragma unroll
      for (int e = 8; e < 8 + kMaxT - 1; e++) a[e] = e - 8 < t1 - 1 ? ar[e] : 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxT; j++) {
        if (j < t1) {
          float w[RN];
          load_tile_row<RN>(w_s + (kc * t1 + j) * WS, tx, w);
#pragma unroll
          for (int p = 0; p < 8; p++)
#pragma unroll
            for (int q = 0; q < RN; q++) acc[p][q] = fmaf(a[p + j], w[q], acc[p][q]);
        }
      }
    }
    __syncthreads();  // stage s consumed before iteration s+1 refills it with chunk s+2
  }

  const int rows_total = kForward ? S : M;
#pragma unroll
  for (int p = 0; p < 8; p++) {
    const int m = T0 + ty * 8 + p;
    if (m >= rows_total) continue;
    // Forward rows are tokens b·S + m of y [N,C]; backward rows are du [B, M, C].
    float* orow = out + (kForward ? int64_t(b) * S + m : int64_t(b) * M + m) * C + c0 + n0;
#pragma unroll
    for (int q = 0; q < RN; q++) orow[tile_col<RN>(tx, q)] = acc[p][q];
  }
}

template <int RN, int kMode>
void launch_band(float* out, const float* src, const bf16* qkv, int64_t ld, const float* hist,
                 const float* wdw, const float* bdw, const float* wg, const float* bg, int64_t B,
                 int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1, cudaStream_t st,
                 const char* fn) {
  constexpr int TN = 16 * RN;
  const size_t smem = band_smem_bytes(RN, t1);
  auto kern = conv_band_kernel<RN, kMode>;
  if (smem > kDefaultSmem) {
    // Only for t1 ≥ 5 at TN = 128: the opt-in is per function and cheap; 25 KB at t1 = 2 needs
    // none.
    int dev = 0, optin = 0;
    ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
    ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > size_t(optin))
      fail(fn, "the grouped conv needs " + std::to_string(smem) +
                   " bytes of shared memory per block, more than the device's " +
                   std::to_string(optin) + " (t1=" + std::to_string(t1) + ")");
    ZAYA_CUDA_CHECK(
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  const int64_t rows = kMode == kGrad ? S + t1 - 1 : S;
  const dim3 grid(unsigned((rows + kTM - 1) / kTM), unsigned((C / d) * (d / TN)), unsigned(B));
  kern<<<grid, kThreads, smem, st>>>(out, src, qkv, ld, hist, wdw, bdw, wg, bg, int(S), int(C),
                                     int(d), int(t0), int(t1));
  check_launch(fn);
}

template <int kMode>
void band(float* out, const float* src, const bf16* qkv, int64_t ld, const float* hist,
          const float* wdw, const float* bdw, const float* wg, const float* bg, int64_t B,
          int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1, cudaStream_t st,
          const char* fn) {
  switch (conv_rn(d)) {
    case 8:
      launch_band<8, kMode>(out, src, qkv, ld, hist, wdw, bdw, wg, bg, B, S, C, d, t0, t1, st, fn);
      break;
    case 4:
      launch_band<4, kMode>(out, src, qkv, ld, hist, wdw, bdw, wg, bg, B, S, C, d, t0, t1, st, fn);
      break;
    case 2:
      launch_band<2, kMode>(out, src, qkv, ld, hist, wdw, bdw, wg, bg, B, S, C, d, t0, t1, st, fn);
      break;
    default:
      launch_band<1, kMode>(out, src, qkv, ld, hist, wdw, bdw, wg, bg, B, S, C, d, t0, t1, st, fn);
  }
}

// Decoding (a few tokens): block per (token n = b·S + t, group). u rows t .. t+t1−1 of the group
// go to shared memory in wg's (ci, j) order; then one warp per output channel dots the contiguous
// wg row with them (coalesced weight reads; fixed shuffle tree, so deterministic). Writes mid too
// when given: row t, and the t1−1 trailing rows from the sequence's last token.
__global__ void conv_direct_kernel(float* __restrict__ y, float* __restrict__ mid,
                                   const bf16* __restrict__ qkv, int64_t ld,
                                   const float* __restrict__ hist, const float* __restrict__ wdw,
                                   const float* __restrict__ bdw, const float* __restrict__ wg,
                                   const float* __restrict__ bg, int S, int C, int d, int t0,
                                   int t1) {
  extern __shared__ float u_s[];  // [d·t1]
  const int n = blockIdx.x, c0 = blockIdx.y * d;
  const int b = n / S, t = n % S;
  const int P = (t0 - 1) + (t1 - 1), M = S + t1 - 1, K = d * t1;
  for (int e = threadIdx.x; e < K; e += blockDim.x) {
    const int j = e / d, ci = e % d, i = t + j, c = c0 + ci;
    const float u = depthwise_at(qkv, ld, hist, wdw, bdw, b, i, c, S, C, t0, P);
    u_s[ci * t1 + j] = u;
    if (mid && (j == 0 || t == S - 1)) mid[(int64_t(b) * M + i) * C + c] = u;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int co = warp; co < d; co += nw) {
    const float* wr = wg + int64_t(c0 + co) * K;
    float s = 0.0f;
    for (int k = lane; k < K; k += 32) s = fmaf(wr[k], u_s[k], s);
    s = warp_sum(s);
    if (lane == 0) y[int64_t(n) * C + c0 + co] = bg[c0 + co] + s;
  }
}

// Decoding: hist ← the last P columns of [hist | x], per (sequence, channel). One thread walks p
// upwards, reading index S+p before any write reaches it (writes go to p' <= p < S+p), so the
// update is in place even when S < P.
__global__ void conv_hist_update_kernel(float* hist, const bf16* qkv, int64_t ld, int B, int S,
                                        int C, int P) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(B) * C) return;
  const int b = int(idx / C), c = int(idx % C);
  for (int p = 0; p < P; p++) {
    const int i = S + p;
    const float v =
        i >= P ? bf(qkv[int64_t(b * S + i - P) * ld + c]) : hist[(int64_t(b) * P + i) * C + c];
    hist[(int64_t(b) * P + p) * C + c] = v;
  }
}

// ---- conv backward: depthwise part -------------------------------------------------------------
// Thread per channel c, block row chunk [tb, te) of sequence b:
//   dx[t,c] = Σ_j du[t+P-j, c]·wdw[c,j]  added into dqkv (bf16 read-add-write, fp32 math);
//   partials of dwdw[c,j] = Σ_i du[i,c]·x[i+j-P, c] (i+j >= P), dbdw[c] = Σ_i du[i,c] over du rows
//   [tb, te) (the last chunk also takes the t1-1 trailing rows [S, M)), and dbg[c] = Σ_t dy[t,c].
// Partial layout per (b, chunk): [C·t0 dwdw | C dbdw | C dbg].
__global__ void conv_dw_bwd_kernel(bf16* __restrict__ dqkv, int64_t ld, float* __restrict__ part,
                                   const float* __restrict__ du, const float* __restrict__ dy,
                                   const bf16* __restrict__ qkv, const float* __restrict__ wdw,
                                   int S, int C, int t0, int t1) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int chunk = blockIdx.y, nchunk = gridDim.y, b = blockIdx.z;
  const int P = (t0 - 1) + (t1 - 1), M = S + t1 - 1;
  const int tb = chunk * kRB, te = min(S, tb + kRB);
  float wd[kMaxT];
#pragma unroll
  for (int j = 0; j < kMaxT; j++) wd[j] = j < t0 ? wdw[c * t0 + j] : 0.0f;
  const float* du_b = du + int64_t(b) * M * C + c;
  float gb = 0.0f;
  for (int t = tb; t < te; t++) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxT; j++) {
      const int i = t + P - j;
      if (j < t0 && i < M) s = fmaf(du_b[int64_t(i) * C], wd[j], s);
    }
    bf16* dst = dqkv + (int64_t(b) * S + t) * ld + c;
    *dst = __float2bfloat16(bf(*dst) + s);
    gb += dy[(int64_t(b) * S + t) * C + c];
  }
  float gw[kMaxT];
#pragma unroll
  for (int j = 0; j < kMaxT; j++) gw[j] = 0.0f;
  float gbd = 0.0f;
  const int ie = te == S ? M : te;
  for (int i = tb; i < ie; i++) {
    const float gu = du_b[int64_t(i) * C];
    gbd += gu;
#pragma unroll
    for (int j = 0; j < kMaxT; j++) {
      const int pi = i + j;  // zero padding below P: no input, no weight gradient
      if (j < t0 && pi >= P) gw[j] = fmaf(gu, bf(qkv[(int64_t(b) * S + pi - P) * ld + c]), gw[j]);
    }
  }
  float* pp = part + (int64_t(b) * nchunk + chunk) * (int64_t(C) * (t0 + 2));
  for (int j = 0; j < t0; j++) pp[c * t0 + j] = gw[j];
  pp[int64_t(C) * t0 + c] = gbd;
  pp[int64_t(C) * (t0 + 1) + c] = gb;
}

// ---- conv backward: grouped weight gradient ----------------------------------------------------
// dwg[c0+co, ci, j] = Σ_n dy[n, c0+co] · mid[b(n), t(n)+j, c0+ci]: per group and tap a TN×TN GEMM
// reducing over tokens. Block = (co tile, ci tile, j; group; token chunk [tb, te) of the flattened
// N = B·S tokens), thread tile RN co × RN ci; tokens stream through a two-stage cp.async pipeline
// of kWT rows of dy and of mid (both row-major, so the copies are straight 16-byte ones when the
// buffers are 16-byte aligned). Each block's sum goes to its own partial slot [chunk][C·d·t1].

// Token chunks of the weight gradient: a fixed function of the shape (so workspace sizing and the
// launch agree, and results do not depend on the device), about kWgBlocks blocks in all.
struct WgChunks {
  int64_t n, per;
};
WgChunks wg_chunks(int64_t N, int64_t C, int64_t d, int64_t t1) {
  const int64_t ntile = d / (16 * conv_rn(d)), tiles = (C / d) * ntile * ntile * t1;
  const int64_t max_n = (N + kWT - 1) / kWT;
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(max_n, kWgBlocks / tiles));
  int64_t per = (N + want - 1) / want;
  per = (per + kWT - 1) / kWT * kWT;
  return {(N + per - 1) / per, per};
}

template <int RN>
__global__ void __launch_bounds__(kThreads, 2)
    conv_wg_bwd_kernel(float* __restrict__ part, const float* __restrict__ dy,
                       const float* __restrict__ mid, int N, int S, int C, int d, int t1, int per,
                       bool vec) {
  constexpr int TN = 16 * RN, V = TN / 4;          // V float4 per tile row
  __shared__ __align__(16) float a_s[2][kWT][TN];  // dy, columns co
  __shared__ __align__(16) float b_s[2][kWT][TN];  // mid, columns ci
  const int ntile = d / TN;
  // blockIdx.x = (co tile · ntile + ci tile) · t1 + j
  const int j = blockIdx.x % t1, ci0 = ((blockIdx.x / t1) % ntile) * TN,
            co0 = (blockIdx.x / (t1 * ntile)) * TN;
  const int c0 = blockIdx.y * d;
  const int chunk = blockIdx.z, tb = chunk * per, te = min(N, tb + per);
  const int M = S + t1 - 1;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

  auto load_stage = [&](int st, int ts) {
    if (vec) {
#pragma unroll 1
      for (int e = tid; e < kWT * V; e += kThreads) {
        const int r = e / V, q = (e % V) * 4;
        const int n = ts + r;
        const bool ok = n < te;
        const int nn = ok ? n : tb, bb = nn / S, t = nn - bb * S;
        cp_async16(&a_s[st][r][q], dy + int64_t(nn) * C + c0 + co0 + q, ok);
        cp_async16(&b_s[st][r][q], mid + (int64_t(bb) * M + t + j) * C + c0 + ci0 + q, ok);
      }
    } else {
#pragma unroll 1
      for (int e = tid; e < kWT * TN; e += kThreads) {
        const int r = e / TN, q = e % TN;
        const int n = ts + r;
        const bool ok = n < te;
        const int nn = ok ? n : tb, bb = nn / S, t = nn - bb * S;
        cp_async4(&a_s[st][r][q], dy + int64_t(nn) * C + c0 + co0 + q, ok);
        cp_async4(&b_s[st][r][q], mid + (int64_t(bb) * M + t + j) * C + c0 + ci0 + q, ok);
      }
    }
  };

  float acc[RN][RN];
#pragma unroll
  for (int p = 0; p < RN; p++)
#pragma unroll
    for (int q = 0; q < RN; q++) acc[p][q] = 0.0f;

  const int nsteps = (te - tb + kWT - 1) / kWT;
  load_stage(0, tb);
  cp_async_commit();
  for (int s = 0; s < nsteps; s++) {
    if (s + 1 < nsteps) load_stage((s + 1) & 1, tb + (s + 1) * kWT);
    cp_async_commit();
    cp_async_wait_prev();
    __syncthreads();
    const int st = s & 1;
#pragma unroll 4
    for (int r = 0; r < kWT; r++) {
      float a[RN], w[RN];
      load_tile_row<RN>(a_s[st][r], ty, a);
      load_tile_row<RN>(b_s[st][r], tx, w);
#pragma unroll
      for (int p = 0; p < RN; p++)
#pragma unroll
        for (int q = 0; q < RN; q++) acc[p][q] = fmaf(a[p], w[q], acc[p][q]);
    }
    __syncthreads();
  }
  float* pp = part + int64_t(chunk) * C * d * t1;
#pragma unroll
  for (int p = 0; p < RN; p++) {
    const int64_t c = c0 + co0 + tile_col<RN>(ty, p);
#pragma unroll
    for (int q = 0; q < RN; q++) pp[(c * d + ci0 + tile_col<RN>(tx, q)) * t1 + j] = acc[p][q];
  }
}

// out[e] += Σ_p part[p·L + off + e] in a fixed order: slice s = threadIdx.x / 32 sums
// p = s, s+8, s+16, ... ascending, then slices 0..7 are added in order. Columns e are the 32
// lanes of a warp, so each partial row is read coalesced.
__global__ void add_partials_kernel(float* __restrict__ out, const float* __restrict__ part,
                                    int64_t nparts, int64_t L, int64_t off, int64_t n) {
  __shared__ float red[8][32];
  const int lane = threadIdx.x % 32, slice = threadIdx.x / 32;
  const int64_t e = int64_t(blockIdx.x) * 32 + lane;
  float s = 0.0f;
  if (e < n) {
#pragma unroll 4
    for (int64_t p = slice; p < nparts; p += 8) s += part[p * L + off + e];
  }
  red[slice][lane] = s;
  __syncthreads();
  if (slice == 0 && e < n) {
    float t = red[0][lane];
#pragma unroll
    for (int k = 1; k < 8; k++) t += red[k][lane];
    out[e] += t;
  }
}

void add_partials(float* out, const float* part, int64_t nparts, int64_t L, int64_t off, int64_t n,
                  cudaStream_t st, const char* fn) {
  if (n <= 0) return;
  add_partials_kernel<<<unsigned((n + 31) / 32), 256, 0, st>>>(out, part, nparts, L, off, n);
  check_launch(fn);
}

// ---- finish: mean skip, QK-norm, RoPE, delayed values ------------------------------------------
struct InvFreq {
  float v[kMaxHalfR];
};

// The CPU reference's table (cpu::rope): 1 / θ^(2j/r), in fp32.
InvFreq inv_freq(double theta, int64_t r) {
  InvFreq f{};
  for (int64_t j = 0; j < r / 2; j++)
    f.v[j] = 1.0f / std::pow(float(theta), float(2 * j) / float(r));
  return f;
}

void check_finish_shape(const char* fn, int64_t Hq, int64_t Hkv, int64_t d, int64_t r) {
  if (Hkv <= 0 || Hq % Hkv != 0)
    fail(fn, "Hq=" + std::to_string(Hq) + " must be a multiple of Hkv=" + std::to_string(Hkv));
  if (d % 32 != 0 || d > kMaxD || (Hkv * d) % 2 != 0)
    fail(fn, "head dim d=" + std::to_string(d) + " must be a multiple of 32, at most " +
                 std::to_string(kMaxD));
  if (r < 0 || r % 2 != 0 || r > d || r / 2 > kMaxHalfR)
    fail(fn, "rotary dim r=" + std::to_string(r) + " must be even, at most d and at most " +
                 std::to_string(2 * kMaxHalfR));
}

// Pre-norm value of element i of head h (q heads first, then k heads) of token row `row`: conv
// output plus the mean skip, exactly as cpu::cca_mean_skip forms it.
__device__ __forceinline__ float pre_norm(const float* conv_row, const bf16* row, int h, int i,
                                          int Hq, int G, int d) {
  const int QD = Hq * d;
  float skip;
  if (h < Hq) {
    skip = (bf(row[h * d + i]) + bf(row[QD + (h / G) * d + i])) * 0.5f;
  } else {
    const int g = h - Hq;
    const float kv = bf(row[QD + g * d + i]);
    float s = 0.0f;
    for (int jj = 0; jj < G; jj++) s += (bf(row[(g * G + jj) * d + i]) + kv) * 0.5f;
    skip = s / float(G);
  }
  return conv_row[h * d + i] + skip;  // k head g's conv channels start at QD + g·d = h·d
}

constexpr int kWarps = 8;  // warps per block of the finish kernels, one (token, head) each

__global__ void __launch_bounds__(kWarps * 32)
    finish_qk_fwd_kernel(bf16* q, bf16* k, float* norms, const float* conv, const bf16* qkv,
                         int64_t ld, const float* temp, InvFreq inv, int64_t pos0, int r, int S,
                         int Hq, int Hkv, int d, int64_t items) {
  __shared__ float buf[kWarps][kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * kWarps + warp;
  if (item >= items) return;  // whole warps leave together; only __syncwarp below
  const int H = Hq + Hkv, G = Hq / Hkv, h = int(item % H);
  const int64_t n = item / H;
  const int t = int(n % S);
  const float* conv_row = conv + n * int64_t(H) * d;
  const bf16* row = qkv + n * ld;
  float* y = buf[warp];
  float ss = 0.0f;
  for (int i = lane; i < d; i += 32) {
    const float x = pre_norm(conv_row, row, h, i, Hq, G, d);
    y[i] = x;
    ss += x * x;
  }
  ss = warp_sum(ss);
  const float nrm = fmaxf(sqrtf(ss), FLT_EPSILON);
  if (norms && lane == 0) norms[n * H + h] = nrm;
  const float a = sqrtf(float(d)) * (h < Hq ? 1.0f : temp[h - Hq]) / nrm;
  __syncwarp();
  const float pos = float(pos0 + t);
  const int h2 = r / 2;
  bf16* out = h < Hq ? q + (n * Hq + h) * d : k + (n * Hkv + (h - Hq)) * d;
  for (int i = lane; i < d; i += 32) {
    float v = y[i] * a;
    if (i < r) {
      const int j = i < h2 ? i : i - h2;
      float sn, cs;
      sincosf(pos * inv.v[j], &sn, &cs);
      if (i < h2)
        v = v * cs - (y[i + h2] * a) * sn;
      else
        v = v * cs + (y[j] * a) * sn;
    }
    out[i] = __float2bfloat16(v);
  }
}

// v[n] = [vc[n] | vd[n-1]] (vd[-1] from vd_last or zero). The thread that reads vd_last[b, i] (at
// t = 0) is the only reader of that element, so it may overwrite it afterwards.
__global__ void finish_v_fwd_kernel(bf16* v, const bf16* qkv, int64_t ld, float* vd_last,
                                    bool update, int S, int C, int KD, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int VH = KD / 2;
  const int64_t n = idx / KD;
  const int e = int(idx % KD), t = int(n % S);
  const int64_t b = n / S;
  bf16 val;
  if (e < VH) {
    val = qkv[n * ld + C + e];
  } else {
    const int i = e - VH;
    if (t > 0) {
      val = qkv[(n - 1) * ld + C + VH + i];
    } else {
      val = __float2bfloat16(vd_last ? vd_last[b * VH + i] : 0.0f);
      if (vd_last && update) vd_last[b * VH + i] = bf(qkv[(b * S + S - 1) * ld + C + VH + i]);
    }
  }
  v[n * KD + e] = val;
}

// Backward through RoPE (inverse rotation) and the norm, per (token, head): dconv (=) and, for k
// heads, the per-token temperature gradient sd·<x,g>/‖x‖ into dtemp_part [N, Hkv].
__global__ void __launch_bounds__(kWarps * 32)
    finish_qk_bwd_kernel(float* dconv, float* dtemp_part, const bf16* dq, const bf16* dk,
                         const float* conv, const bf16* qkv, int64_t ld, const float* norms,
                         const float* temp, InvFreq inv, int r, int S, int Hq, int Hkv, int d,
                         int64_t items) {
  constexpr int E = kMaxD / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * kWarps + warp;
  if (item >= items) return;
  const int H = Hq + Hkv, G = Hq / Hkv, h = int(item % H);
  const int64_t n = item / H;
  const int t = int(n % S);
  const float* conv_row = conv + n * int64_t(H) * d;
  const bf16* row = qkv + n * ld;
  const bf16* gsrc = h < Hq ? dq + (n * Hq + h) * d : dk + (n * Hkv + (h - Hq)) * d;
  const float pos = float(t);  // training: positions from 0 within each sequence
  const int h2 = r / 2;
  float xr[E], gr[E];
  float xg = 0.0f;
#pragma unroll
  for (int e = 0; e < E; e++) {
    const int i = lane + 32 * e;
    xr[e] = gr[e] = 0.0f;
    if (i >= d) continue;
    float gv = bf(gsrc[i]);
    if (i < r) {  // cpu::rope_backward: the transposed rotation
      const int j = i < h2 ? i : i - h2;
      float sn, cs;
      sincosf(pos * inv.v[j], &sn, &cs);
      if (i < h2)
        gv = gv * cs + bf(gsrc[i + h2]) * sn;
      else
        gv = gv * cs - bf(gsrc[j]) * sn;
    }
    gr[e] = gv;
    xr[e] = pre_norm(conv_row, row, h, i, Hq, G, d);
    xg += xr[e] * gv;
  }
  xg = warp_sum(xg);
  const float nrm = norms[n * H + h];
  const float sd = sqrtf(float(d)), tv = h < Hq ? 1.0f : temp[h - Hq];
  const bool clamped = nrm <= FLT_EPSILON;
  float* drow = dconv + n * int64_t(H) * d + int64_t(h) * d;
#pragma unroll
  for (int e = 0; e < E; e++) {
    const int i = lane + 32 * e;
    if (i < d)
      drow[i] = sd * tv * (gr[e] / nrm - (clamped ? 0.0f : xr[e] * xg / (nrm * nrm * nrm)));
  }
  if (h >= Hq && lane == 0) dtemp_part[n * Hkv + (h - Hq)] = sd * xg / nrm;
}

// The projections' gradients that the finish step owns (=): q0/k0 channels get the mean-skip path
// (mq[h] receives dqpre[h] + dkpre[g]/G, split in halves onto q0[h] and k0[g]); vc channels get
// dv's first half; vd channels of token t get dv's second half of token t+1 (0 for the last).
__global__ void finish_skip_v_bwd_kernel(bf16* dqkv, int64_t ld, const float* dconv, const bf16* dv,
                                         int S, int Hq, int Hkv, int d, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int G = Hq / Hkv, QD = Hq * d, C = (Hq + Hkv) * d, KD = Hkv * d, VH = KD / 2;
  const int W = C + KD;
  const int64_t n = idx / W;
  const int e = int(idx % W);
  const float* dc = dconv + n * C;
  float val;
  if (e < QD) {
    const int h = e / d, i = e % d;
    val = 0.5f * (dc[e] + dc[QD + (h / G) * d + i] / float(G));
  } else if (e < C) {
    const int g = (e - QD) / d, i = (e - QD) % d;
    const float dkg = dc[e] / float(G);
    float s = 0.0f;
    for (int jj = 0; jj < G; jj++) s += 0.5f * (dc[(g * G + jj) * d + i] + dkg);
    val = s;
  } else if (e < C + VH) {
    dqkv[n * ld + e] = dv[n * KD + (e - C)];
    return;
  } else {
    const int i = e - C - VH;
    dqkv[n * ld + e] = (n % S) + 1 < S ? dv[(n + 1) * KD + VH + i] : __float2bfloat16(0.0f);
    return;
  }
  dqkv[n * ld + e] = __float2bfloat16(val);
}

// dtemp[g] += Σ_n part[n, g]: each thread sums a fixed stride of tokens, then a fixed tree.
__global__ void dtemp_reduce_kernel(float* dtemp, const float* part, int64_t N, int Hkv) {
  __shared__ float red[256];
  const int g = blockIdx.x;
  float s = 0.0f;
  for (int64_t n = threadIdx.x; n < N; n += 256) s += part[n * Hkv + g];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) dtemp[g] += red[0];
}

}  // namespace

// ---- public entry points ------------------------------------------------------------------------

void cca_conv_fwd(float* y_NC, float* mid, const bf16* qkv, int64_t ld, float* hist_BPC,
                  bool update_hist, const float* wdw_Ct0, const float* bdw_C, const float* wg_Cdt1,
                  const float* bg_C, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, cudaStream_t st) {
  const char* fn = "cca_conv_fwd";
  check_conv_shape(fn, S, C, d, t0, t1);
  if (B <= 0 || S <= 0) return;
  const int64_t M = S + t1 - 1;
  const size_t direct_smem = size_t(d * t1) * sizeof(float);
  if (B * S <= kDirectRows && direct_smem <= kDefaultSmem) {
    conv_direct_kernel<<<dim3(unsigned(B * S), unsigned(C / d)), kThreads, direct_smem, st>>>(
        y_NC, mid, qkv, ld, hist_BPC, wdw_Ct0, bdw_C, wg_Cdt1, bg_C, int(S), int(C), int(d),
        int(t0), int(t1));
    check_launch(fn);
  } else if (mid) {
    // Training: u goes to mid anyway (backward needs it), so the GEMM streams it from there.
    const int64_t total = B * M * C;
    depthwise_fwd_kernel<<<unsigned((total + 255) / 256), 256, 0, st>>>(
        mid, qkv, ld, hist_BPC, wdw_Ct0, bdw_C, int(S), int(C), int(t0), int(t1), total);
    check_launch(fn);
    band<kMid>(y_NC, mid, nullptr, 0, nullptr, nullptr, nullptr, wg_Cdt1, bg_C, B, S, C, d, t0, t1,
               st, fn);
  } else {
    band<kDepthwise>(y_NC, nullptr, qkv, ld, hist_BPC, wdw_Ct0, bdw_C, wg_Cdt1, bg_C, B, S, C, d,
                     t0, t1, st, fn);
  }
  const int64_t P = (t0 - 1) + (t1 - 1);
  if (hist_BPC && update_hist && P > 0) {
    conv_hist_update_kernel<<<unsigned((B * C + 255) / 256), 256, 0, st>>>(
        hist_BPC, qkv, ld, int(B), int(S), int(C), int(P));
    check_launch(fn);
  }
}

size_t cca_conv_bwd_workspace_bytes(int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                                    int64_t t1) {
  const int64_t M = S + t1 - 1;
  const int64_t nrc = (S + kRB - 1) / kRB;
  const int64_t nkc = conv_rn(d) ? wg_chunks(B * S, C, d, t1).n : 1;
  return aligned(size_t(B * M * C) * sizeof(float)) +
         aligned(size_t(B * nrc * C * (t0 + 2)) * sizeof(float)) +
         aligned(size_t(nkc * C * d * t1) * sizeof(float));
}

void cca_conv_bwd(bf16* dqkv, int64_t ld, float* dwdw, float* dbdw, float* dwg, float* dbg,
                  const float* dy_NC, const bf16* qkv, const float* mid, const float* wdw_Ct0,
                  const float* wg_Cdt1, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, Workspace& ws, cudaStream_t st) {
  const char* fn = "cca_conv_bwd";
  check_conv_shape(fn, S, C, d, t0, t1);
  if (B <= 0 || S <= 0) return;
  const int64_t M = S + t1 - 1, N = B * S;
  if (N > INT32_MAX / 2) fail(fn, "too many tokens: " + std::to_string(N));
  const int64_t nrc = (S + kRB - 1) / kRB;
  const WgChunks wc = wg_chunks(N, C, d, t1);
  float* du = ws.take_n<float>(size_t(B * M * C));
  float* part_dw = ws.take_n<float>(size_t(B * nrc * C * (t0 + 2)));
  float* part_wg = ws.take_n<float>(size_t(wc.n * C * d * t1));

  // du: the grouped conv's data gradient (banded GEMM, flipped kernel).
  band<kGrad>(du, dy_NC, nullptr, 0, nullptr, nullptr, nullptr, wg_Cdt1, nullptr, B, S, C, d, t0,
              t1, st, fn);
  // dx (+= into dqkv), and partials of dwdw, dbdw, dbg.
  conv_dw_bwd_kernel<<<dim3(unsigned((C + 127) / 128), unsigned(nrc), unsigned(B)), 128, 0, st>>>(
      dqkv, ld, part_dw, du, dy_NC, qkv, wdw_Ct0, int(S), int(C), int(t0), int(t1));
  check_launch(fn);
  // dwg partials per token chunk.
  {
    const int rn = conv_rn(d);
    const int64_t ntile = d / (16 * rn);
    const dim3 grid(unsigned(ntile * ntile * t1), unsigned(C / d), unsigned(wc.n));
    const bool vec =
        (reinterpret_cast<uintptr_t>(dy_NC) | reinterpret_cast<uintptr_t>(mid)) % 16 == 0;
    if (rn == 8)
      conv_wg_bwd_kernel<8><<<grid, kThreads, 0, st>>>(part_wg, dy_NC, mid, int(N), int(S), int(C),
                                                       int(d), int(t1), int(wc.per), vec);
    else if (rn == 4)
      conv_wg_bwd_kernel<4><<<grid, kThreads, 0, st>>>(part_wg, dy_NC, mid, int(N), int(S), int(C),
                                                       int(d), int(t1), int(wc.per), vec);
    else if (rn == 2)
      conv_wg_bwd_kernel<2><<<grid, kThreads, 0, st>>>(part_wg, dy_NC, mid, int(N), int(S), int(C),
                                                       int(d), int(t1), int(wc.per), vec);
    else
      conv_wg_bwd_kernel<1><<<grid, kThreads, 0, st>>>(part_wg, dy_NC, mid, int(N), int(S), int(C),
                                                       int(d), int(t1), int(wc.per), vec);
    check_launch(fn);
  }
  // Fixed-order sums of the partials.
  const int64_t Ldw = C * (t0 + 2);
  add_partials(dwdw, part_dw, B * nrc, Ldw, 0, C * t0, st, fn);
  add_partials(dbdw, part_dw, B * nrc, Ldw, C * t0, C, st, fn);
  add_partials(dbg, part_dw, B * nrc, Ldw, C * (t0 + 1), C, st, fn);
  add_partials(dwg, part_wg, wc.n, C * d * t1, 0, C * d * t1, st, fn);
}

void cca_qkv_finish_fwd(bf16* q_NHd, bf16* k_NGd, bf16* v_NGd, float* norms_NH,
                        const float* conv_NC, const bf16* qkv, int64_t ld, const float* temp_G,
                        float* vd_last_B, bool update_vd_last, int64_t pos0, double theta,
                        int64_t r, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d,
                        cudaStream_t st) {
  const char* fn = "cca_qkv_finish_fwd";
  check_finish_shape(fn, Hq, Hkv, d, r);
  const int64_t N = B * S;
  if (N <= 0) return;
  const int64_t items = N * (Hq + Hkv);
  finish_qk_fwd_kernel<<<unsigned((items + kWarps - 1) / kWarps), kWarps * 32, 0, st>>>(
      q_NHd, k_NGd, norms_NH, conv_NC, qkv, ld, temp_G, inv_freq(theta, r), pos0, int(r), int(S),
      int(Hq), int(Hkv), int(d), items);
  check_launch(fn);
  const int64_t KD = Hkv * d, total = N * KD;
  finish_v_fwd_kernel<<<unsigned((total + 255) / 256), 256, 0, st>>>(
      v_NGd, qkv, ld, vd_last_B, update_vd_last, int(S), int((Hq + Hkv) * d), int(KD), total);
  check_launch(fn);
}

size_t cca_qkv_finish_bwd_workspace_bytes(int64_t N, int64_t /*Hq*/, int64_t Hkv) {
  return aligned(size_t(N * Hkv) * sizeof(float));
}

void cca_qkv_finish_bwd(float* dconv_NC, bf16* dqkv, int64_t ld, float* dtemp_G, const bf16* dq,
                        const bf16* dk, const bf16* dv, const float* conv_NC, const bf16* qkv,
                        const float* norms_NH, const float* temp_G, double theta, int64_t r,
                        int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d, Workspace& ws,
                        cudaStream_t st) {
  const char* fn = "cca_qkv_finish_bwd";
  check_finish_shape(fn, Hq, Hkv, d, r);
  const int64_t N = B * S;
  if (N <= 0) return;
  float* dtemp_part = ws.take_n<float>(size_t(N * Hkv));
  const int64_t items = N * (Hq + Hkv);
  finish_qk_bwd_kernel<<<unsigned((items + kWarps - 1) / kWarps), kWarps * 32, 0, st>>>(
      dconv_NC, dtemp_part, dq, dk, conv_NC, qkv, ld, norms_NH, temp_G, inv_freq(theta, r), int(r),
      int(S), int(Hq), int(Hkv), int(d), items);
  check_launch(fn);
  const int64_t total = N * ((Hq + Hkv) * d + Hkv * d);
  finish_skip_v_bwd_kernel<<<unsigned((total + 255) / 256), 256, 0, st>>>(
      dqkv, ld, dconv_NC, dv, int(S), int(Hq), int(Hkv), int(d), total);
  check_launch(fn);
  dtemp_reduce_kernel<<<unsigned(Hkv), 256, 0, st>>>(dtemp_G, dtemp_part, N, int(Hkv));
  check_launch(fn);
}

}  // namespace zaya::cuda
