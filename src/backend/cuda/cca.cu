// CCA (compressed convolutional attention, ZAYA1.md §3.1) on the GPU: the two causal convolutions
// over the packed [q0 | k0] channels (depthwise kernel t0, then grouped kernel t1 with one d×d
// group per head) and the step after them (mean skip, QK-norm with temperature on k, partial NeoX
// RoPE, delayed values), forward and backward. The specification is the CPU reference
// (cpu::cca_mean_skip, cca_conv, qk_norm, rope and their backward passes) composed as
// ZayaModel::attention_forward and Trainer::attention_bwd compose them.
//
// Design:
// - Forward conv: one block per (time chunk, head group, output-channel tile, sequence). It loads
//   its slice of the group's grouped-conv weights into shared memory once, then for each tile of
//   64 time steps computes the depthwise output straight from the bf16 projections (t0 FMAs per
//   element, recomputed per block rather than stored and reloaded) into shared memory and runs the
//   banded d·t1-deep matmul from shared memory with a 4×RN register tile per thread. fp32 math.
// - Backward conv: the data gradient of the grouped conv is the same banded matmul with the kernel
//   flipped in time and transposed per group (same kernel, other loader), written to a workspace
//   du; an elementwise pass then forms the depthwise data gradient (added into dqkv) and per-chunk
//   partial sums of dwdw, dbdw, dbg; the grouped weight gradient is a token-reduction GEMM per
//   group into per-chunk partials. All parameter gradients are partials over a fixed grid summed in
//   a fixed order by a second pass: no float atomics, so results are bit-reproducible.
// - Finish: one warp per (token, head): mean skip, norm (warp reduction), RoPE from a per-warp
//   shared row. RoPE's inverse frequencies are computed on the host with the CPU reference's fp32
//   formula and passed by value, so only sin/cos (accurate, not the fast intrinsics) can differ.
// Not here: the projections (GEMMs), attention itself, and KV-cache writes (the caller copies k,
// v).
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/ops.h"
#include "core/cuda_check.h"

namespace zaya::cuda {
namespace {

constexpr int kThreads = 256;  // 16 × 16 threads for the matmul-shaped kernels
constexpr int kTM = 64;        // time rows per tile of the banded conv matmul (16 threads × 4)
constexpr int kChunk = 512;  // time rows per conv block: the weight slice is loaded once per block
constexpr int kRB = 64;      // rows per block of the depthwise backward (one partial per chunk)
constexpr int kKT = 2048;    // tokens per block of the grouped weight gradient (one partial each)
constexpr int kKStep = 32;   // tokens staged in shared memory per step of that reduction
constexpr int kMaxT = 8;     // largest kernel size t0, t1 (register arrays)
constexpr int kMaxD = 256;   // largest head dim of the finish kernels (8 values per lane)
constexpr int kMaxHalfR = 64;  // largest r/2 (the inverse-frequency table passed by value)

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

// Output-channel (and input-channel) tile of the conv matmuls: 16 threads × RN columns.
int conv_rn(int64_t d) {
  return d % 64 == 0 ? 4 : d % 32 == 0 ? 2 : d % 16 == 0 ? 1 : 0;
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

// ---- banded grouped matmul (forward conv and its data gradient) --------------------------------
//
// For one head group (channels c0..c0+d) and one sequence b, both directions are
//   out[m, n] = bias[n] + Σ_{kc<d, j<t1} in[m + j, kc] · W[kc·t1 + j, n]
// with, in the forward: in[r] = depthwise output u at index T0 + r (the left-padded time axis),
// W[(ci,j), co] = wg[co, ci, j]; in the data gradient: in[r] = dy at time T0 - (t1-1) + r (zero
// outside [0,S)), W[(co,j'), ci] = wg[co, ci, t1-1-j'] (flipped in time), out = du at index T0 + m.
// Shared memory: w_s [d·t1][TN+1] (+1 so the transposing stores do not collide on a bank) and
// in_s [kTM+t1-1][d+1] (+1 so the two rows a warp reads sit on different banks).
template <int RN, bool kForward>
__global__ void __launch_bounds__(kThreads)
    conv_band_kernel(float* out, float* mid, const bf16* qkv, int64_t ld, const float* hist,
                     const float* dy, const float* wdw, const float* bdw, const float* wg,
                     const float* bg, int S, int C, int d, int t0, int t1) {
  constexpr int TN = 16 * RN;
  extern __shared__ float smem[];
  const int K = d * t1, WS = TN + 1, US = d + 1;
  float* w_s = smem;
  float* in_s = smem + K * WS;
  const int ntile = d / TN;
  const int g = blockIdx.y / ntile, n0 = (blockIdx.y % ntile) * TN, c0 = g * d;
  const int b = blockIdx.z;
  const int P = (t0 - 1) + (t1 - 1), M = S + t1 - 1;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

  // The block's weight slice, once. Forward: columns are output channels co = n0 + n and a row of
  // wg is contiguous in (ci, j), so k runs fastest for coalesced loads. Backward: columns are
  // input channels ci = n0 + n; n runs fastest (stride t1 in wg).
  for (int e = tid; e < TN * K; e += kThreads) {
    if (kForward) {
      const int n = e / K, k = e % K;
      w_s[k * WS + n] = wg[int64_t(c0 + n0 + n) * K + k];
    } else {
      const int k = e / TN, n = e % TN, co = k / t1, jf = k % t1;
      w_s[k * WS + n] = wg[int64_t(c0 + co) * K + int64_t(n0 + n) * t1 + (t1 - 1 - jf)];
    }
  }

  const int rows_total = kForward ? S : M;  // output rows: y times, or du indices
  const int rbeg = blockIdx.x * kChunk, rend = min(rows_total, rbeg + kChunk);
  const int R = kTM + t1 - 1;
  for (int T0 = rbeg; T0 < rend; T0 += kTM) {
    __syncthreads();  // w_s complete (first tile); in_s free again (later tiles)
    for (int e = tid; e < R * d; e += kThreads) {
      const int r = e / d, ci = e % d, c = c0 + ci;
      float s = 0.0f;
      if (kForward) {
        const int i = T0 + r;  // depthwise output index; y[t] reads u[t .. t+t1-1]
        if (i < M) {
          s = bdw[c];
          for (int j = 0; j < t0; j++) {
            const int pi = i + j;  // index into [history or zeros (P) | x (S)]; pi - P < S
            float xv;
            if (pi >= P)
              xv = bf(qkv[int64_t(b * S + pi - P) * ld + c]);
            else
              xv = hist ? hist[(int64_t(b) * P + pi) * C + c] : 0.0f;
            s += wdw[c * t0 + j] * xv;
          }
          // Each u row is stored once: by the tile whose own rows hold it, and the sequence's
          // last tile also stores the t1-1 trailing rows no later tile starts at.
          if (mid && n0 == 0 && (i < T0 + kTM || T0 + kTM >= S))
            mid[(int64_t(b) * M + i) * C + c] = s;
        }
      } else {
        const int t = T0 - (t1 - 1) + r;
        if (t >= 0 && t < S) s = dy[int64_t(b * S + t) * C + c];
      }
      in_s[r * US + ci] = s;
    }
    __syncthreads();

    float acc[4][RN];
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
      for (int q = 0; q < RN; q++) acc[p][q] = kForward ? bg[c0 + n0 + tx + 16 * q] : 0.0f;
    for (int kc = 0; kc < d; kc++)
      for (int j = 0; j < t1; j++) {
        const float* wr = w_s + (kc * t1 + j) * WS + tx;
        float a[4], w[RN];
#pragma unroll
        for (int p = 0; p < 4; p++) a[p] = in_s[(ty + 16 * p + j) * US + kc];
#pragma unroll
        for (int q = 0; q < RN; q++) w[q] = wr[16 * q];
#pragma unroll
        for (int p = 0; p < 4; p++)
#pragma unroll
          for (int q = 0; q < RN; q++) acc[p][q] = fmaf(a[p], w[q], acc[p][q]);
      }

#pragma unroll
    for (int p = 0; p < 4; p++) {
      const int m = T0 + ty + 16 * p;
      if (m >= rend) continue;
      // Forward rows are tokens b·S + t of y [N,C]; backward rows are du [B, M, C].
      float* orow = out + (kForward ? int64_t(b * S + m) : int64_t(b) * M + m) * C + c0 + n0 + tx;
#pragma unroll
      for (int q = 0; q < RN; q++) orow[16 * q] = acc[p][q];
    }
  }
}

template <int RN, bool kForward>
void launch_band(float* out, float* mid, const bf16* qkv, int64_t ld, const float* hist,
                 const float* dy, const float* wdw, const float* bdw, const float* wg,
                 const float* bg, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                 int64_t t1, cudaStream_t st, const char* fn) {
  constexpr int TN = 16 * RN;
  const size_t smem = size_t(d * t1 * (TN + 1) + (kTM + t1 - 1) * (d + 1)) * sizeof(float);
  int dev = 0, optin = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > size_t(optin))
    fail(fn, "the grouped conv's weight slice needs " + std::to_string(smem) +
                 " bytes of shared memory per block, more than the device's " +
                 std::to_string(optin) + " (d=" + std::to_string(d) + ", t1=" + std::to_string(t1) +
                 ")");
  auto kern = conv_band_kernel<RN, kForward>;
  ZAYA_CUDA_CHECK(
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t rows = kForward ? S : S + t1 - 1;
  const dim3 grid(unsigned((rows + kChunk - 1) / kChunk), unsigned((C / d) * (d / TN)),
                  unsigned(B));
  kern<<<grid, kThreads, smem, st>>>(out, mid, qkv, ld, hist, dy, wdw, bdw, wg, bg, int(S), int(C),
                                     int(d), int(t0), int(t1));
  check_launch(fn);
}

template <bool kForward>
void band(float* out, float* mid, const bf16* qkv, int64_t ld, const float* hist, const float* dy,
          const float* wdw, const float* bdw, const float* wg, const float* bg, int64_t B,
          int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1, cudaStream_t st,
          const char* fn) {
  switch (conv_rn(d)) {
    case 4:
      launch_band<4, kForward>(out, mid, qkv, ld, hist, dy, wdw, bdw, wg, bg, B, S, C, d, t0, t1,
                               st, fn);
      break;
    case 2:
      launch_band<2, kForward>(out, mid, qkv, ld, hist, dy, wdw, bdw, wg, bg, B, S, C, d, t0, t1,
                               st, fn);
      break;
    default:
      launch_band<1, kForward>(out, mid, qkv, ld, hist, dy, wdw, bdw, wg, bg, B, S, C, d, t0, t1,
                               st, fn);
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
__global__ void conv_dw_bwd_kernel(bf16* dqkv, int64_t ld, float* part, const float* du,
                                   const float* dy, const bf16* qkv, const float* wdw, int S, int C,
                                   int t0, int t1) {
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
    bf16* dst = dqkv + int64_t(b * S + t) * ld + c;
    *dst = __float2bfloat16(bf(*dst) + s);
    gb += dy[int64_t(b * S + t) * C + c];
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
      if (j < t0 && pi >= P) gw[j] = fmaf(gu, bf(qkv[int64_t(b * S + pi - P) * ld + c]), gw[j]);
    }
  }
  float* pp = part + (int64_t(b) * nchunk + chunk) * (int64_t(C) * (t0 + 2));
  for (int j = 0; j < t0; j++) pp[c * t0 + j] = gw[j];
  pp[int64_t(C) * t0 + c] = gbd;
  pp[int64_t(C) * (t0 + 1) + c] = gb;
}

// ---- conv backward: grouped weight gradient ----------------------------------------------------
// dwg[c0+co, ci, j] = Σ_{b,t} dy[b,t,c0+co] · mid[b,t+j,c0+ci]: per group a GEMM reducing over
// tokens. Block = (co tile, ci tile, j; group; token chunk of kKT within one sequence), thread tile
// RN co × RN ci; each block's sum goes to its own partial slot [chunk][C·d·t1].
template <int RN>
__global__ void __launch_bounds__(kThreads)
    conv_wg_bwd_kernel(float* part, const float* dy, const float* mid, int S, int C, int d, int t1,
                       int nkc_seq) {
  constexpr int TN = 16 * RN;
  __shared__ float dy_s[kKStep][TN];
  __shared__ float mid_s[kKStep][TN];
  const int ntile = d / TN;
  // blockIdx.x = (co tile · ntile + ci tile) · t1 + j
  const int j = blockIdx.x % t1, ci0 = ((blockIdx.x / t1) % ntile) * TN,
            co0 = (blockIdx.x / (t1 * ntile)) * TN;
  const int c0 = blockIdx.y * d;
  const int kc = blockIdx.z, b = kc / nkc_seq, tb = (kc % nkc_seq) * kKT, te = min(S, tb + kKT);
  const int M = S + t1 - 1;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  float acc[RN][RN];
#pragma unroll
  for (int p = 0; p < RN; p++)
#pragma unroll
    for (int q = 0; q < RN; q++) acc[p][q] = 0.0f;
  for (int ts = tb; ts < te; ts += kKStep) {
    for (int e = tid; e < kKStep * TN; e += kThreads) {
      const int r = e / TN, n = e % TN, t = ts + r;
      const bool in = t < te;
      dy_s[r][n] = in ? dy[int64_t(b * S + t) * C + c0 + co0 + n] : 0.0f;
      mid_s[r][n] = in ? mid[(int64_t(b) * M + t + j) * C + c0 + ci0 + n] : 0.0f;
    }
    __syncthreads();
#pragma unroll 4
    for (int r = 0; r < kKStep; r++) {
      float a[RN], w[RN];
#pragma unroll
      for (int p = 0; p < RN; p++) a[p] = dy_s[r][ty + 16 * p];
#pragma unroll
      for (int q = 0; q < RN; q++) w[q] = mid_s[r][tx + 16 * q];
#pragma unroll
      for (int p = 0; p < RN; p++)
#pragma unroll
        for (int q = 0; q < RN; q++) acc[p][q] = fmaf(a[p], w[q], acc[p][q]);
    }
    __syncthreads();
  }
  float* pp = part + int64_t(kc) * C * d * t1;
#pragma unroll
  for (int p = 0; p < RN; p++) {
    const int c = c0 + co0 + ty + 16 * p;
#pragma unroll
    for (int q = 0; q < RN; q++) pp[(int64_t(c) * d + ci0 + tx + 16 * q) * t1 + j] = acc[p][q];
  }
}

// out[e] += Σ_p part[p·L + off + e], p ascending: the fixed-order second pass of every
// deterministic reduction here.
__global__ void add_partials_kernel(float* out, const float* part, int64_t nparts, int64_t L,
                                    int64_t off, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  float s = 0.0f;
  for (int64_t p = 0; p < nparts; p++) s += part[p * L + off + e];
  out[e] += s;
}

void add_partials(float* out, const float* part, int64_t nparts, int64_t L, int64_t off, int64_t n,
                  cudaStream_t st, const char* fn) {
  if (n <= 0) return;
  add_partials_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(out, part, nparts, L, off, n);
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

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
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
  check_conv_shape("cca_conv_fwd", S, C, d, t0, t1);
  if (B <= 0 || S <= 0) return;
  band<true>(y_NC, mid, qkv, ld, hist_BPC, nullptr, wdw_Ct0, bdw_C, wg_Cdt1, bg_C, B, S, C, d, t0,
             t1, st, "cca_conv_fwd");
  const int64_t P = (t0 - 1) + (t1 - 1);
  if (hist_BPC && update_hist && P > 0) {
    conv_hist_update_kernel<<<unsigned((B * C + 255) / 256), 256, 0, st>>>(
        hist_BPC, qkv, ld, int(B), int(S), int(C), int(P));
    check_launch("cca_conv_fwd");
  }
}

size_t cca_conv_bwd_workspace_bytes(int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                                    int64_t t1) {
  const int64_t M = S + t1 - 1;
  const int64_t nrc = (S + kRB - 1) / kRB, nkc = (S + kKT - 1) / kKT;
  return aligned(size_t(B * M * C) * sizeof(float)) +
         aligned(size_t(B * nrc * C * (t0 + 2)) * sizeof(float)) +
         aligned(size_t(B * nkc * C * d * t1) * sizeof(float));
}

void cca_conv_bwd(bf16* dqkv, int64_t ld, float* dwdw, float* dbdw, float* dwg, float* dbg,
                  const float* dy_NC, const bf16* qkv, const float* mid, const float* wdw_Ct0,
                  const float* wg_Cdt1, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, Workspace& ws, cudaStream_t st) {
  const char* fn = "cca_conv_bwd";
  check_conv_shape(fn, S, C, d, t0, t1);
  if (B <= 0 || S <= 0) return;
  const int64_t M = S + t1 - 1;
  const int64_t nrc = (S + kRB - 1) / kRB, nkc = (S + kKT - 1) / kKT;
  float* du = ws.take_n<float>(size_t(B * M * C));
  float* part_dw = ws.take_n<float>(size_t(B * nrc * C * (t0 + 2)));
  float* part_wg = ws.take_n<float>(size_t(B * nkc * C * d * t1));

  // du: the grouped conv's data gradient (banded matmul, flipped kernel).
  band<false>(du, nullptr, nullptr, 0, nullptr, dy_NC, nullptr, nullptr, wg_Cdt1, nullptr, B, S, C,
              d, t0, t1, st, fn);
  // dx (+= into dqkv), and partials of dwdw, dbdw, dbg.
  conv_dw_bwd_kernel<<<dim3(unsigned((C + 127) / 128), unsigned(nrc), unsigned(B)), 128, 0, st>>>(
      dqkv, ld, part_dw, du, dy_NC, qkv, wdw_Ct0, int(S), int(C), int(t0), int(t1));
  check_launch(fn);
  // dwg partials per token chunk.
  {
    const int rn = conv_rn(d);
    const int64_t ntile = d / (16 * rn);
    const dim3 grid(unsigned(ntile * ntile * t1), unsigned(C / d), unsigned(B * nkc));
    if (rn == 4)
      conv_wg_bwd_kernel<4><<<grid, kThreads, 0, st>>>(part_wg, dy_NC, mid, int(S), int(C), int(d),
                                                       int(t1), int(nkc));
    else if (rn == 2)
      conv_wg_bwd_kernel<2><<<grid, kThreads, 0, st>>>(part_wg, dy_NC, mid, int(S), int(C), int(d),
                                                       int(t1), int(nkc));
    else
      conv_wg_bwd_kernel<1><<<grid, kThreads, 0, st>>>(part_wg, dy_NC, mid, int(S), int(C), int(d),
                                                       int(t1), int(nkc));
    check_launch(fn);
  }
  // Fixed-order sums of the partials.
  const int64_t Ldw = C * (t0 + 2);
  add_partials(dwdw, part_dw, B * nrc, Ldw, 0, C * t0, st, fn);
  add_partials(dbdw, part_dw, B * nrc, Ldw, C * t0, C, st, fn);
  add_partials(dbg, part_dw, B * nrc, Ldw, C * (t0 + 1), C, st, fn);
  add_partials(dwg, part_wg, B * nkc, C * d * t1, 0, C * d * t1, st, fn);
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
