// CCA (compressed convolutional attention, ZAYA1.md §3.1) on the GPU: the two causal convolutions
// over the packed [q0 | k0] channels (depthwise kernel t0, then grouped kernel t1 with one d×d
// group per head) and the step after them (mean skip, QK-norm with temperature on k, partial NeoX
// RoPE, delayed values), forward and backward. The specification is the CPU reference
// (cpu::cca_mean_skip, cca_conv, qk_norm, rope and their backward passes) composed as
// ZayaModel::attention_forward and Trainer::attention_bwd compose them.
//
// Design. Numerics follow DESIGN.md §Numerics: the grouped conv (the only GEMM-shaped part) runs
// on tensor cores with bf16 operands and fp32 accumulation, like every other GEMM of the model;
// everything else (depthwise conv, mid, skip, norms, RoPE, partial sums) is fp32. Why bf16 and not
// TF32: the inputs u and dy are activations whose neighbours in the model are already bf16 (qkv,
// q/k/v, dq/dk/dv), the products are exact in fp32 and K = d·t1 (forward, data gradient) is short,
// so the error is one bf16 rounding per operand, 2–3e-3·max|ref| on random data, the same as the
// projection GEMMs around it; TF32 would cost 2× the shared memory and mma issue for precision the
// rest of the layer does not keep. The tests bound the conv outputs by twice the error of a naive
// bf16-operand computation (DESIGN.md's rule) and, for the forward, by 1e-5·max|ref| against the
// exact bf16-operand product.
// - The grouped conv, forward and data gradient, is a banded GEMM per head group:
//     out[m, n] = bias[n] + Σ_{j<t1} Σ_{k<d} in[m + j, k] · W_j[n, k]
//   One block of 8 warps computes a 128-row × TN-column tile (TN = 128, 64 or 32: the largest that
//   divides d; warps 4 × 2, 32 rows × TN/2 columns each) with mma.sync m16n8k16 fed by ldmatrix.
//   K (d channels) streams in chunks of 32 through two shared stages (one barrier per chunk). The
//   loader rounds fp32 → bf16 as it stores, so it uses plain loads, not cp.async. The band costs
//   nothing extra: tap j's A fragments are the stage's rows shifted down by j (ldmatrix takes one
//   row address per lane).
// - Forward input: the depthwise output u, computed in the GEMM's loader from the bf16 rows
// (16-byte
//   loads of 8 channels) and the history; in training the loader also writes fp32 u to mid (rows it
//   owns; one pass over qkv, no separate depthwise kernel and no reread of mid). Decoding
//   (B·S ≤ 16) takes a direct kernel: one block per (token, group), u in shared memory, one warp
//   per output channel over the contiguous weight row, operands rounded to bf16 as the GEMM rounds
//   them (so decode and prefill agree to fp32 summation order); no large shared memory, no
//   per-call attribute setting.
// - Backward: the data gradient du is the same GEMM with dy as input and the kernel flipped in
//   time and transposed per group; a per-channel pass forms the depthwise data gradient (added into
//   dqkv; with a history, also the history columns' gradient dhist) and per-chunk partials of dwdw,
//   dbdw, dbg; the grouped weight gradient is, per group and tap, a T×T tensor-core GEMM (A = dyᵀ
//   and B = mid, both from token-major bf16 tiles through ldmatrix.trans) reducing over a fixed
//   number of token chunks (about two waves of blocks), each writing its own partial. Partials are
//   summed in a fixed order by a second pass: no float atomics, so results are bit-reproducible.
// - Finish: a block stages a few tokens' rows (conv, q0|k0, and dq|dk backward) in shared memory
//   with 16-byte loads issued before any store, then one warp per (token, head) does mean skip,
//   norm (warp reduction) and RoPE (sin/cos once per token and frequency) in shared memory, and
//   the block writes q|k (forward) or dconv and the whole dqkv row (backward) with 16-byte stores.
//   RoPE's inverse frequencies are computed on the host with the CPU reference's fp32 formula and
//   passed by value, so only sin/cos (accurate, not the fast intrinsics) can differ.
// Not here: the projections (GEMMs), attention itself, and KV-cache writes (the caller copies k,
// v).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/arch/mma_utils.cuh"
#include "backend/cuda/ops.h"
#include "core/cuda_check.h"

namespace zaya::cuda {
namespace {

constexpr int kBM = 128;         // output rows per block of the banded GEMM (4 warps × 32 rows)
constexpr int kKC = 32;          // K channels per stage of the banded GEMM (two k16 steps)
constexpr int kKS = kKC + 8;     // bf16 row stride of a banded-GEMM stage: 80 bytes (see below)
constexpr int kMaxT = 8;         // largest kernel size t0, t1 (register arrays)
constexpr int kKT = 32;          // tokens per stage of the weight-gradient GEMM (two k16 steps)
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

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

__device__ __forceinline__ float bf(const bf16 x) {
  return __bfloat162float(x);
}

// x rounded to bf16 and back (round to nearest even): the value a tensor-core product sees.
__device__ __forceinline__ float round_bf(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- tensor-core primitives: backend/cuda/arch/mma_utils.cuh ----
using namespace mma;

// Eight floats → 16 bytes of bf16 (element 0 at the lowest address).
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  return make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                    pack_bf16(v[6], v[7]));
}
// v[0..8) = src[0..8) (fp32 global), two 16-byte loads when `vec`, else eight scalar ones.
__device__ __forceinline__ void load8(float (&v)[8], const float* src, bool vec) {
  if (vec) {
    const float4 a = *reinterpret_cast<const float4*>(src);
    const float4 b = *reinterpret_cast<const float4*>(src + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = src[e];
  }
}
__device__ __forceinline__ void store8(float* dst, const float (&v)[8], bool vec) {
  if (vec) {
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) dst[e] = v[e];
  }
}

// Column tile of the conv GEMMs: the largest of 128, 64, 32 that divides d.
int conv_tn(int64_t d) {
  return d % 128 == 0 ? 128 : d % 64 == 0 ? 64 : d % 32 == 0 ? 32 : 0;
}

void check_conv_shape(const char* fn, int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1) {
  if (d <= 0 || C <= 0 || C % d != 0)
    fail(fn, "conv channels C=" + std::to_string(C) +
                 " must be a positive multiple of d=" + std::to_string(d));
  if (conv_tn(d) == 0) fail(fn, "head dim d=" + std::to_string(d) + " must be a multiple of 32");
  if (t0 < 1 || t1 < 1 || t0 > kMaxT || t1 > kMaxT)
    fail(fn, "conv kernel sizes t0=" + std::to_string(t0) + ", t1=" + std::to_string(t1) +
                 " must lie in [1, " + std::to_string(kMaxT) + "]");
  if (S > INT32_MAX / 2) fail(fn, "sequence too long: " + std::to_string(S));
}

// Depthwise output u[b, i, c] = bdw[c] + Σ_j wdw[c,j] · p[b, i+j, c] over the left-padded input
// p = [history or zeros (P columns) | x (S)], exactly as cpu::cca_conv forms it. i + j − P < S for
// every i < M = S + t1 − 1, so x is never read past the sequence. The explicit fmaf order is the
// one depthwise8 below uses, so the direct (decode) and GEMM paths see the same bits of u.
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
    s = fmaf(wdw[c * t0 + j], xv, s);
  }
  return s;
}

// depthwise_at for channels c .. c+7 (c % 8 = 0): one 16-byte load of each input row when
// `vec` (qkv 16-byte aligned, ld % 8 = 0), else scalar loads.
__device__ __forceinline__ void depthwise8(float (&u)[8], const bf16* qkv, int64_t ld,
                                           const float* hist, const float* wdw, const float* bdw,
                                           int b, int i, int c, int S, int C, int t0, int P,
                                           bool vec) {
#pragma unroll
  for (int e = 0; e < 8; e++) u[e] = bdw[c + e];
  for (int j = 0; j < t0; j++) {
    const int pi = i + j;
    float x[8];
    if (pi >= P) {
      const bf16* src = qkv + (int64_t(b) * S + pi - P) * ld + c;
      if (vec) {
        const uint4 raw = *reinterpret_cast<const uint4*>(src);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
          x[2 * e] = __uint_as_float(w[e] << 16);  // bf16 → fp32 is a 16-bit shift
          x[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = bf(src[e]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) x[e] = hist ? hist[(int64_t(b) * P + pi) * C + c + e] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 8; e++) u[e] = fmaf(wdw[(c + e) * t0 + j], x[e], u[e]);
  }
}

// ---- banded grouped GEMM on tensor cores (forward conv and its data gradient) -------------------
//
// For one head group (channels c0..c0+d), one sequence b, the block's 128 output rows from T0 and
// output columns n0..n0+TN of the group:
//   out[m, n] = Σ_{j<t1} Σ_{k<d} A[m + j, k] · W_j[n, k]
//   forward (kFwd): A[r] = u at index T0 + r (zero at r ≥ M), computed in the loader from the bf16
//     rows (and history), W_j[n, k] = wg[c0+n0+n, k, j]; out = y at token b·S + T0 + m, + bg.
//     With mid, the loader also writes fp32 u to mid (rows T0 .. T0+127, and the t1−1 trailing
//     rows in the last row tile; only column tile 0 writes).
//   data gradient (kGrad): A[r] = dy at time T0 − (t1−1) + r (zero outside [0,S)),
//     W_j[n, k] = wg[c0+k, n0+n, t1−1−j] (flipped in time, transposed per group), no bias,
//     out = du at index T0 + m.
// Operands are rounded to bf16 on their way into shared memory (fp32 → bf16 in the loader, no
// cp.async) and multiplied by mma.sync m16n8k16 with fp32 accumulation. K (the d input channels)
// streams in chunks of kKC = 32 through two shared stages with one barrier per chunk: the stage
// filled at step s+1 was last read at step s−1, which every thread finished before it reached the
// barrier of step s.
// Stage layout (bf16, row stride kKS = 40 elements = 80 bytes, so the 8 row addresses of an
// ldmatrix phase fall in 8 distinct 16-byte bank groups): A [R = 128 + t1 − 1 rows][kKS], then
// W [t1·TN rows (j, n)][kKS]. Tap j's A fragments are the same rows shifted down by j.
// Warps: 4 along M (32 rows each) × 2 along N (TN/2 columns each).
enum BandMode { kFwd = 0, kGrad = 1 };

size_t band_stage_elems(int tn, int64_t t1) {
  return size_t(kBM + t1 - 1 + t1 * tn) * kKS;
}
size_t band_smem_bytes(int tn, int64_t t1) {
  return 2 * band_stage_elems(tn, t1) * sizeof(bf16);
}

struct BandArgs {
  float* out;       // y [N, C] (kFwd) or du [B, M, C] (kGrad)
  float* mid;       // kFwd: fp32 u [B, M, C] or null
  const float* dy;  // kGrad: [N, C]
  const bf16* qkv;  // kFwd
  int64_t ld;
  const float* hist;  // kFwd: [B, P, C] or null
  const float *wdw, *bdw, *wg, *bg;
  int S, C, d, t0, t1;
  bool vec_in;   // kFwd: qkv 16-byte aligned and ld % 8 = 0; kGrad: dy 16-byte aligned
  bool vec_mid;  // mid 16-byte aligned
  bool vec_w;    // wg 16-byte aligned
  bool vec_out;  // out 8-byte aligned
};

template <int TN, int kMode>
__global__ void __launch_bounds__(256, 2) conv_band_mma_kernel(const BandArgs a) {
  constexpr int WN = TN / 2;          // columns per warp
  constexpr int NB = WN / 16;         // 16-column B loads per warp and k step
  extern __shared__ uint4 smem_u4[];  // uint4: 16-byte aligned base
  bf16* const smem = reinterpret_cast<bf16*>(smem_u4);
  const int S = a.S, C = a.C, d = a.d, t0 = a.t0, t1 = a.t1;
  const int ntile = d / TN;
  const int g = blockIdx.y / ntile, n0 = (blockIdx.y % ntile) * TN, c0 = g * d;
  const int b = blockIdx.z;
  const int P = (t0 - 1) + (t1 - 1), M = S + t1 - 1;
  const int T0 = blockIdx.x * kBM;
  const int R = kBM + t1 - 1;  // A rows of the band
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm0 = (warp & 3) * 32, wn0 = (warp >> 2) * WN;
  const int K = d * t1;  // length of one wg row (co): (ci, j) with j fastest
  const int stage_elems = (R + t1 * TN) * kKS;
  const bool write_mid = kMode == kFwd && a.mid && n0 == 0;
  const bool last_tile = T0 + kBM >= S;

  // Stage st ← K chunk [kc0, kc0 + kKC).
  auto fill = [&](int st, int kc0) {
    bf16* As = smem + st * stage_elems;
    bf16* Ws = As + R * kKS;
    for (int e = tid; e < R * (kKC / 8); e += 256) {
      const int r = e / (kKC / 8), k8 = (e % (kKC / 8)) * 8, c = c0 + kc0 + k8;
      float v[8];
      if constexpr (kMode == kFwd) {
        const int i = T0 + r;
        if (i < M) {
          depthwise8(v, a.qkv, a.ld, a.hist, a.wdw, a.bdw, b, i, c, S, C, t0, P, a.vec_in);
          if (write_mid && (r < kBM || last_tile))
            store8(a.mid + (int64_t(b) * M + i) * C + c, v, a.vec_mid);
        } else {
#pragma unroll
          for (int q = 0; q < 8; q++) v[q] = 0.0f;
        }
      } else {
        const int t = T0 - (t1 - 1) + r;
        if (t >= 0 && t < S) {
          load8(v, a.dy + (int64_t(b) * S + t) * C + c, a.vec_in);
        } else {
#pragma unroll
          for (int q = 0; q < 8; q++) v[q] = 0.0f;
        }
      }
      *reinterpret_cast<uint4*>(As + r * kKS + k8) = pack8(v);
    }
    // Weights: a [rows × RL] block of the row-major wg [C, d·t1], read as float4 along the row.
    //   kFwd:  rows co = c0+n0+n (n < TN), columns (kc0 + k)·t1 + j: RL = kKC·t1, (x, j) = (k, j).
    //   kGrad: rows co = c0+kc0+k (k < kKC), columns (n0 + n)·t1 + j: RL = TN·t1, (x, j) = (n, j).
    constexpr int kRows = kMode == kFwd ? TN : kKC;
    const int RL = (kMode == kFwd ? kKC : TN) * t1, RL4 = RL / 4;
    const int64_t row0 = kMode == kFwd ? c0 + n0 : c0 + kc0;
    const int col0 = (kMode == kFwd ? kc0 : n0) * t1;
    for (int e = tid; e < kRows * RL4; e += 256) {
      const int row = e / RL4, f = (e % RL4) * 4;
      const float* src = a.wg + (row0 + row) * K + col0 + f;
      float w[4];
      if (a.vec_w) {
        const float4 q = *reinterpret_cast<const float4*>(src);
        w[0] = q.x, w[1] = q.y, w[2] = q.z, w[3] = q.w;
      } else {
#pragma unroll
        for (int q = 0; q < 4; q++) w[q] = src[q];
      }
      int x = f / t1, j = f - x * t1;
#pragma unroll
      for (int q = 0; q < 4; q++) {
        // kFwd: W_j[n = row][k = x]; kGrad: W_{t1−1−j}[n = x][k = row].
        bf16* dst = kMode == kFwd ? Ws + (j * TN + row) * kKS + x
                                  : Ws + ((t1 - 1 - j) * TN + x) * kKS + row;
        *dst = __float2bfloat16(w[q]);
        if (++j == t1) j = 0, x++;
      }
    }
  };

  float acc[2][WN / 8][4];
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < WN / 8; ni++)
      acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

  const int nk = d / kKC;
  for (int s = 0; s < nk; s++) {
    fill(s & 1, s * kKC);
    __syncthreads();  // stage s written by every thread (and stage s−1 consumed: see above)
    const bf16* As = smem + (s & 1) * stage_elems;
    const bf16* Ws = As + R * kKS;
#pragma unroll 1
    for (int j = 0; j < t1; j++) {
      const bf16* Wj = Ws + j * TN * kKS;
#pragma unroll
      for (int kk = 0; kk < kKC / 16; kk++) {
        uint32_t af[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
          ldmatrix_x4(af[mi],
                      As + (wm0 + mi * 16 + j + (lane & 15)) * kKS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
          uint32_t bfr[4];
          ldmatrix_x4(bfr, Wj + (wn0 + nb * 16 + (lane & 7) + (lane >> 4) * 8) * kKS + kk * 16 +
                               ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int mi = 0; mi < 2; mi++) {
            mma16816(acc[mi][2 * nb], af[mi], bfr[0], bfr[1]);
            mma16816(acc[mi][2 * nb + 1], af[mi], bfr[2], bfr[3]);
          }
        }
      }
    }
  }

  // C fragment: rows lane/4 (+8), columns 2·(lane%4) + {0, 1}.
  const int rows_total = kMode == kFwd ? S : M;
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int m = T0 + wm0 + mi * 16 + (lane >> 2) + h * 8;
      if (m >= rows_total) continue;
      // Forward rows are tokens b·S + m of y [N,C]; backward rows are du [B, M, C].
      float* orow = a.out + (kMode == kFwd ? int64_t(b) * S + m : int64_t(b) * M + m) * C + c0 + n0;
#pragma unroll
      for (int ni = 0; ni < WN / 8; ni++) {
        const int n = wn0 + ni * 8 + (lane & 3) * 2;
        float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if constexpr (kMode == kFwd) {
          v0 += a.bg[c0 + n0 + n];
          v1 += a.bg[c0 + n0 + n + 1];
        }
        if (a.vec_out) {
          *reinterpret_cast<float2*>(orow + n) = make_float2(v0, v1);
        } else {
          orow[n] = v0;
          orow[n + 1] = v1;
        }
      }
    }
}

template <int TN, int kMode>
void launch_band(const BandArgs& args, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t1,
                 cudaStream_t st, const char* fn) {
  const size_t smem = band_smem_bytes(TN, t1);
  auto kern = conv_band_mma_kernel<TN, kMode>;
  if (smem > kDefaultSmem) {
    // 62 KB at TN = 128, t1 = 2. The opt-in is per function and cheap (no stream work, so it is
    // also allowed while a stream is being captured).
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
  const dim3 grid(unsigned((rows + kBM - 1) / kBM), unsigned((C / d) * (d / TN)), unsigned(B));
  kern<<<grid, 256, smem, st>>>(args);
  check_launch(fn);
}

template <int kMode>
void band(const BandArgs& args, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t1,
          cudaStream_t st, const char* fn) {
  switch (conv_tn(d)) {
    case 128: launch_band<128, kMode>(args, B, S, C, d, t1, st, fn); break;
    case 64: launch_band<64, kMode>(args, B, S, C, d, t1, st, fn); break;
    default: launch_band<32, kMode>(args, B, S, C, d, t1, st, fn);
  }
}

// Decoding (a few tokens): block per (token n = b·S + t, group). u rows t .. t+t1−1 of the group
// go to shared memory in wg's (ci, j) order; then one warp per output channel dots the contiguous
// wg row with them (coalesced weight reads; fixed shuffle tree, so deterministic). Both operands
// are rounded to bf16 first, as the tensor-core GEMM rounds them, so a decode step and a prefill
// of the same tokens differ only in the fp32 summation order. Writes mid (fp32, unrounded) too
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
    u_s[ci * t1 + j] = round_bf(u);
    if (mid && (j == 0 || t == S - 1)) mid[(int64_t(b) * M + i) * C + c] = u;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int co = warp; co < d; co += nw) {
    const float* wr = wg + int64_t(c0 + co) * K;
    float s = 0.0f;
    for (int k = lane; k < K; k += 32) s = fmaf(round_bf(wr[k]), u_s[k], s);
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
//   partials of dwdw[c,j] = Σ_i du[i,c]·p[i+j, c] over the padded input p (x at i+j >= P; below P
//   the history when kHist, else zero padding: no term), dbdw[c] = Σ_i du[i,c] over du rows
//   [tb, te) (the last chunk also takes the t1-1 trailing rows [S, M)), and dbg[c] = Σ_t dy[t,c].
// Partial layout per (b, chunk): [C·t0 dwdw | C dbdw | C dbg].
// kHist (hist [B,P,C] non-null, P > 0): the history columns, padded indices 0..P-1, give dwdw
// their terms (in the chunk that owns du row i, as every other term), and the blocks of chunk 0
// also write dhist[b,p,c] = Σ_j du[p-j, c]·wdw[c,j] (0 <= p-j < M; =) when dhist is non-null: the
// data gradient at padded index p, as dx is at padded index t+P. No atomics: one thread writes
// each dhist element. kHist = false is the kernel without history, unchanged.
template <bool kHist>
__global__ void conv_dw_bwd_kernel(bf16* __restrict__ dqkv, int64_t ld, float* __restrict__ part,
                                   const float* __restrict__ du, const float* __restrict__ dy,
                                   const bf16* __restrict__ qkv, const float* __restrict__ wdw,
                                   const float* hist, float* dhist, int S, int C, int t0, int t1) {
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
      const int pi = i + j;  // below P: the history when kHist, else zero padding (no term)
      if (j < t0 && pi >= P) gw[j] = fmaf(gu, bf(qkv[(int64_t(b) * S + pi - P) * ld + c]), gw[j]);
      if constexpr (kHist) {
        if (j < t0 && pi < P) gw[j] = fmaf(gu, hist[(int64_t(b) * P + pi) * C + c], gw[j]);
      }
    }
  }
  float* pp = part + (int64_t(b) * nchunk + chunk) * (int64_t(C) * (t0 + 2));
  for (int j = 0; j < t0; j++) pp[c * t0 + j] = gw[j];
  pp[int64_t(C) * t0 + c] = gbd;
  pp[int64_t(C) * (t0 + 1) + c] = gb;
  if constexpr (kHist) {
    if (dhist && chunk == 0) {
      for (int p = 0; p < P; p++) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxT; j++) {
          const int i = p - j;
          if (j < t0 && i >= 0 && i < M) s = fmaf(du_b[int64_t(i) * C], wd[j], s);
        }
        dhist[(int64_t(b) * P + p) * C + c] = s;
      }
    }
  }
}

// ---- conv backward: grouped weight gradient ----------------------------------------------------
// dwg[c0+co, ci, j] = Σ_n dy[n, c0+co] · mid[b(n), t(n)+j, c0+ci]: per group and tap a T×T GEMM
// (M = co, N = ci) reducing over tokens (K). Block = (co tile, ci tile, j; group; token chunk
// [tb, te) of the flattened N = B·S tokens). Tokens stream in stages of kKT = 32: the loader reads
// fp32 dy and mid rows (16-byte loads when both are 16-byte aligned), rounds them to bf16 and
// stores them token-major (row stride T + 8 elements: 272 bytes at T = 128, so an ldmatrix phase
// hits 8 distinct 16-byte bank groups); A (dy, [k][m] in shared memory) and B (mid, [k][n]) both
// come out of ldmatrix.trans. Two stages, one barrier per stage (as the banded GEMM). Each block's
// sum goes to its own partial slot [chunk][C·d·t1]; a second pass adds them in a fixed order.

// Token chunks of the weight gradient: a fixed function of the shape (so workspace sizing and the
// launch agree, and results do not depend on the device), about kWgBlocks blocks in all.
struct WgChunks {
  int64_t n, per;
};
WgChunks wg_chunks(int64_t N, int64_t C, int64_t d, int64_t t1) {
  const int64_t ntile = d / conv_tn(d), tiles = (C / d) * ntile * ntile * t1;
  const int64_t max_n = (N + kKT - 1) / kKT;
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(max_n, kWgBlocks / tiles));
  int64_t per = (N + want - 1) / want;
  per = (per + kKT - 1) / kKT * kKT;
  return {(N + per - 1) / per, per};
}

// Warp grid of the weight-gradient tile T×T: WGM warps along co × WGN along ci, each warp
// (T/WGM) × (T/WGN) with both a multiple of 16.
template <int T>
struct WgWarps {
  static constexpr int M = T == 32 ? 2 : 4, N = 2, threads = 32 * M * N;
};

template <int T>
__global__ void __launch_bounds__(WgWarps<T>::threads)
    conv_wg_mma_kernel(float* __restrict__ part, const float* __restrict__ dy,
                       const float* __restrict__ mid, int N, int S, int C, int d, int t1, int per,
                       bool vec) {
  constexpr int NT = WgWarps<T>::threads, WM = T / WgWarps<T>::M, WN = T / WgWarps<T>::N;
  constexpr int MI = WM / 16, NB = WN / 16, LS = T + 8, V = T / 4;  // V float4 per tile row
  __shared__ __align__(16) bf16 a_s[2][kKT * LS];                   // dy: [token][co]
  __shared__ __align__(16) bf16 b_s[2][kKT * LS];                   // mid: [token][ci]
  const int ntile = d / T;
  // blockIdx.x = (co tile · ntile + ci tile) · t1 + j
  const int j = blockIdx.x % t1, ci0 = ((blockIdx.x / t1) % ntile) * T,
            co0 = (blockIdx.x / (t1 * ntile)) * T;
  const int c0 = blockIdx.y * d;
  const int chunk = blockIdx.z, tb = chunk * per, te = min(N, tb + per);
  const int M = S + t1 - 1;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm0 = (warp % WgWarps<T>::M) * WM, wn0 = (warp / WgWarps<T>::M) * WN;

  auto fill = [&](int st, int ts) {
#pragma unroll 2
    for (int e = tid; e < kKT * V; e += NT) {
      const int r = e / V, q = (e % V) * 4;
      const int n = ts + r;
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f}, y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (n < te) {
        const int bb = n / S, t = n - bb * S;
        const float* ps = dy + int64_t(n) * C + c0 + co0 + q;
        const float* pm = mid + (int64_t(bb) * M + t + j) * C + c0 + ci0 + q;
        if (vec) {
          const float4 u = *reinterpret_cast<const float4*>(ps);
          const float4 w = *reinterpret_cast<const float4*>(pm);
          x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w;
          y[0] = w.x, y[1] = w.y, y[2] = w.z, y[3] = w.w;
        } else {
#pragma unroll
          for (int k = 0; k < 4; k++) x[k] = ps[k], y[k] = pm[k];
        }
      }
      *reinterpret_cast<uint2*>(&a_s[st][r * LS + q]) =
          make_uint2(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]));
      *reinterpret_cast<uint2*>(&b_s[st][r * LS + q]) =
          make_uint2(pack_bf16(y[0], y[1]), pack_bf16(y[2], y[3]));
    }
  };

  float acc[MI][WN / 8][4];
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int ni = 0; ni < WN / 8; ni++)
      acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

  const int nsteps = (te - tb + kKT - 1) / kKT;
  for (int s = 0; s < nsteps; s++) {
    fill(s & 1, tb + s * kKT);
    __syncthreads();  // stage s written; the buffer refilled next was last read at step s−1
    const bf16* As = a_s[s & 1];
    const bf16* Bs = b_s[s & 1];
#pragma unroll
    for (int kk = 0; kk < kKT / 16; kk++) {
      // A = dyᵀ (m = co, k = token) from the token-major tile: ldmatrix.trans of the 8×8 blocks
      // (k 0-7 | 8-15) × (m 0-7 | 8-15) in the order a0 (m lo, k lo), a1 (m hi, k lo), a2 (m lo,
      // k hi), a3 (m hi, k hi).
      uint32_t af[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
        ldmatrix_x4_trans(af[mi], As + (kk * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * LS + wm0 +
                                      mi * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int nb = 0; nb < NB; nb++) {
        // B (k = token, n = ci) row-major: b0, b1 → n-tile nb·16 (k lo, k hi), b2, b3 → +8.
        uint32_t bfr[4];
        ldmatrix_x4_trans(bfr, Bs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LS + wn0 +
                                   nb * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
          mma16816(acc[mi][2 * nb], af[mi], bfr[0], bfr[1]);
          mma16816(acc[mi][2 * nb + 1], af[mi], bfr[2], bfr[3]);
        }
      }
    }
  }
  float* pp = part + int64_t(chunk) * C * d * t1;
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t co = c0 + co0 + wm0 + mi * 16 + (lane >> 2) + h * 8;
#pragma unroll
      for (int ni = 0; ni < WN / 8; ni++) {
        const int ci = ci0 + wn0 + ni * 8 + (lane & 3) * 2;
        pp[(co * d + ci) * t1 + j] = acc[mi][ni][2 * h];
        pp[(co * d + ci + 1) * t1 + j] = acc[mi][ni][2 * h + 1];
      }
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

// Finish kernels: a block of kFinThreads threads owns tb tokens (chosen on the host so
// that a block's tiles fill up to 44 KB of shared memory: 4 tokens, 41 KB, at C = 1280, r = 64). It
// stages the tokens' rows in shared memory with 16-byte loads, kFinLoads per thread issued before
// any is stored (the bytes in flight are what bounds these kernels), then one warp per (token,
// head) item does the arithmetic of the earlier warp-per-item kernels element for element (lane
// owns i ≡ lane mod 32, same expressions, same per-lane order, same warp_sum tree: bit-identical
// results), then the block writes its outputs with 16-byte stores. RoPE's sin/cos are computed once
// per (token, frequency) into a table shared by the token's heads. Shared memory per token: C fp32
// (conv; overwritten in place by x or dconv: only the item's own warp reads conv[h·d..], and the
// lane that reads element i is the one that writes it), C bf16 (q0|k0 of qkv), C bf16 (forward: q|k
// out; backward: dq|dk), r/2 float2 (sin, cos).
constexpr int kFinThreads = 256;
constexpr int kFinWarps = kFinThreads / 32;
constexpr int kFinLoads = 8;  // 16-byte loads a thread issues before storing them
constexpr size_t kFinSmemTarget = 44 * 1024;
constexpr int kFinMaxTok = 8;
// Blocks per SM the register budget must allow (forward 64, backward 80 registers; no spills):
// 4 resp. 3 × 41 KB of tiles in flight per SM at ZAYA1 sizes.
constexpr int kFinMinBlocksFwd = 4;
constexpr int kFinMinBlocksBwd = 3;

size_t finish_token_bytes(int64_t C, int64_t r) {
  return size_t(C) * (4 + 2 + 2) + size_t(r / 2) * sizeof(float2);
}
int finish_tokens_per_block(int64_t C, int64_t r) {
  return int(std::clamp<size_t>(kFinSmemTarget / finish_token_bytes(C, r), 1, kFinMaxTok));
}

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
  if (finish_token_bytes((Hq + Hkv) * d, r) > kDefaultSmem)
    fail(fn, "(Hq+Hkv)·d=" + std::to_string((Hq + Hkv) * d) +
                 " too large for one token's shared-memory tiles (at most ~6000 channels)");
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

// One row source of the staging loader: token n's row starts at g + n·gs (bytes) and goes to
// shared byte offset so + tt·ss (tt = n − n0); `units` 16-byte units per row; es = element size
// (2 or 4) for the scalar path taken when !vec (base or row stride not 16-byte aligned).
struct StageSrc {
  const char* g;
  int64_t gs;
  int so, ss, units, es;
  bool vec;
};
constexpr int kMaxSrc = 4;
struct StageSrcs {
  StageSrc s[kMaxSrc];
};

__device__ __forceinline__ uint4 load_unit(const char* p, int es, bool vec) {
  if (vec) return *reinterpret_cast<const uint4*>(p);
  uint32_t w[4];
  if (es == 4) {
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = reinterpret_cast<const uint32_t*>(p)[k];
  } else {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = uint32_t(h[2 * k]) | (uint32_t(h[2 * k + 1]) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void store_unit(char* p, const uint4 v, bool vec) {
  if (vec) {
    *reinterpret_cast<uint4*>(p) = v;
  } else {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    unsigned short* h = reinterpret_cast<unsigned short*>(p);
#pragma unroll
    for (int k = 0; k < 4; k++) {
      h[2 * k] = static_cast<unsigned short>(w[k] & 0xffffu);
      h[2 * k + 1] = static_cast<unsigned short>(w[k] >> 16);
    }
  }
}

// Shared memory ← rows of tokens n0 .. n0+tb−1 (zeros past N) from the sources.
__device__ __forceinline__ void stage_rows(char* sm, const StageSrcs& src, int64_t n0, int tb,
                                           int64_t N) {
  int per = 0;
#pragma unroll
  for (int s = 0; s < kMaxSrc; s++) per += src.s[s].units;
  const int total = tb * per;
  for (int base = 0; base < total; base += kFinLoads * kFinThreads) {
    uint4 v[kFinLoads];
    int dst[kFinLoads];
#pragma unroll
    for (int k = 0; k < kFinLoads; k++) {
      const int u = base + k * kFinThreads + int(threadIdx.x);
      dst[k] = -1;
      v[k] = make_uint4(0, 0, 0, 0);
      if (u >= total) continue;
      const int tt = u / per;
      int w = u - tt * per;
      const char* g = nullptr;
      int64_t gs = 0;
      int so = 0, ss = 0, es = 4;
      bool vec = false, found = false;
#pragma unroll
      for (int s = 0; s < kMaxSrc; s++) {
        if (found) continue;
        if (w < src.s[s].units) {
          g = src.s[s].g, gs = src.s[s].gs, so = src.s[s].so, ss = src.s[s].ss, es = src.s[s].es;
          vec = src.s[s].vec, found = true;
        } else {
          w -= src.s[s].units;
        }
      }
      dst[k] = so + tt * ss + w * 16;
      const int64_t n = n0 + tt;
      if (n < N) v[k] = load_unit(g + n * gs + int64_t(w) * 16, es, vec);
    }
#pragma unroll
    for (int k = 0; k < kFinLoads; k++)
      if (dst[k] >= 0) *reinterpret_cast<uint4*>(sm + dst[k]) = v[k];
  }
}

// (sin, cos) of (pos0 + t)·inv[j] for the block's tokens, j < r/2: the values the reference's
// per-element sincosf gives (same argument, same function).
__device__ __forceinline__ void rope_table(float2* sc, const InvFreq& inv, int64_t n0, int tb,
                                           int h2, int S, int64_t pos0) {
  for (int e = int(threadIdx.x); e < tb * h2; e += kFinThreads) {
    const int tt = e / h2, j = e - tt * h2;
    const int t = int((n0 + tt) % S);
    const float pos = float(pos0 + t);
    float sn, cs;
    sincosf(pos * inv.v[j], &sn, &cs);
    sc[e] = make_float2(sn, cs);
  }
}

__global__ void __launch_bounds__(kFinThreads, kFinMinBlocksFwd)
    finish_qk_fwd_kernel(bf16* q, bf16* k, float* norms, const StageSrcs src, const float* temp,
                         InvFreq inv, int64_t pos0, int r, int S, int Hq, int Hkv, int d, int64_t N,
                         int tb, bool vec_out) {
  extern __shared__ uint4 fin_smem_u4[];
  char* const sm = reinterpret_cast<char*>(fin_smem_u4);
  const int H = Hq + Hkv, C = H * d, G = Hq / Hkv, h2 = r / 2, QD = Hq * d;
  float* const xs = reinterpret_cast<float*>(sm);               // [tb][C] conv, then x
  const bf16* const rs = reinterpret_cast<bf16*>(xs + tb * C);  // [tb][C] q0 | k0
  bf16* const os = const_cast<bf16*>(rs) + tb * C;              // [tb][C] q | k out
  float2* const sc = reinterpret_cast<float2*>(os + tb * C);    // [tb][h2] (sin, cos)
  const int64_t n0 = int64_t(blockIdx.x) * tb;
  stage_rows(sm, src, n0, tb, N);
  rope_table(sc, inv, n0, tb, h2, S, pos0);
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int it = warp; it < tb * H; it += kFinWarps) {
    const int tt = it / H, h = it - tt * H;
    const int64_t n = n0 + tt;
    if (n >= N) break;  // items are token-major: the rest are past N too (whole warp)
    float* const xrow = xs + tt * C;
    float* const y = xrow + h * d;
    const bf16* const row = rs + tt * C;
    const float2* const sct = sc + tt * h2;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float x = pre_norm(xrow, row, h, i, Hq, G, d);
      y[i] = x;
      ss += x * x;
    }
    ss = warp_sum(ss);
    const float nrm = fmaxf(sqrtf(ss), FLT_EPSILON);
    if (norms && lane == 0) norms[n * H + h] = nrm;
    const float a = sqrtf(float(d)) * (h < Hq ? 1.0f : temp[h - Hq]) / nrm;
    __syncwarp();
    bf16* const out = os + tt * C + h * d;  // q heads, then k heads: [Hq·d | Hkv·d]
    for (int i = lane; i < d; i += 32) {
      float v = y[i] * a;
      if (i < r) {
        const int j = i < h2 ? i : i - h2;
        const float2 p = sct[j];
        const float sn = p.x, cs = p.y;
        if (i < h2)
          v = v * cs - (y[i + h2] * a) * sn;
        else
          v = v * cs + (y[j] * a) * sn;
      }
      out[i] = __float2bfloat16(v);
    }
  }
  __syncthreads();
  // q rows (Hq·d) and k rows (Hkv·d) of the block's tokens, 16-byte units.
  const int uq = QD / 8, per = C / 8;
  for (int u = int(threadIdx.x); u < tb * per; u += kFinThreads) {
    const int tt = u / per, w = u - tt * per;
    const int64_t n = n0 + tt;
    if (n >= N) continue;
    const uint4 val = *reinterpret_cast<const uint4*>(os + tt * C + w * 8);
    bf16* const dst =
        w < uq ? q + n * QD + int64_t(w) * 8 : k + n * int64_t(C - QD) + int64_t(w - uq) * 8;
    store_unit(reinterpret_cast<char*>(dst), val, vec_out);
  }
}

// v[n] = [vc[n] | vd[n-1]] (vd[-1] from vd_last or zero). The thread that reads vd_last[b, i] (at
// t = 0) is the only reader of that element, so it may overwrite it afterwards. Grid (token n,
// column block): no 64-bit division per element.
__global__ void finish_v_fwd_kernel(bf16* v, const bf16* qkv, int64_t ld, float* vd_last,
                                    bool update, int S, int C, int KD) {
  const int e = int(blockIdx.y) * blockDim.x + threadIdx.x;
  if (e >= KD) return;
  const int VH = KD / 2;
  const int n32 = int(blockIdx.x), t = n32 % S;
  const int64_t n = n32, b = n32 / S;
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

// Mean-skip gradient of q0/k0 channels e0 .. e0+3 (4 | e0, 4 | d: one head) from the token's
// dconv row dc (shared memory): q0[h] receives (dqpre[h] + dkpre[g]/G)/2, k0[g] the sum over its G
// q heads of (dqpre[h] + dkpre[g]/G)/2, each element with the expressions and order of the
// earlier per-element kernel. Returns the 4 values as bf16 (8 bytes).
__device__ __forceinline__ uint2 skip_grad4(const float* dc, int e0, int QD, int G, int d) {
  const float4 a4 = *reinterpret_cast<const float4*>(dc + e0);
  float a[4] = {a4.x, a4.y, a4.z, a4.w}, f[4];
  if (e0 < QD) {
    const int h = e0 / d, i0 = e0 % d;
    const float4 b4 = *reinterpret_cast<const float4*>(dc + QD + (h / G) * d + i0);
    const float b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int q = 0; q < 4; q++) f[q] = 0.5f * (a[q] + b[q] / float(G));
  } else {
    const int g = (e0 - QD) / d, i0 = (e0 - QD) % d;
#pragma unroll
    for (int q = 0; q < 4; q++) a[q] = a[q] / float(G), f[q] = 0.0f;  // a = dkpre[g]/G
    for (int jj = 0; jj < G; jj++) {
      const float4 b4 = *reinterpret_cast<const float4*>(dc + (g * G + jj) * d + i0);
      const float b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int q = 0; q < 4; q++) f[q] += 0.5f * (b[q] + a[q]);
    }
  }
  return make_uint2(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]));
}

// Backward through RoPE (inverse rotation) and the norm, per (token, head): dconv (=) and, for k
// heads, the per-token temperature gradient sd·<x,g>/‖x‖ into dtemp_part [N, Hkv]; then, per
// token, the projections' gradients the finish step owns (=): q0/k0 channels get the mean-skip
// path (from the dconv row still in shared memory), vc channels dv's first half, vd channels of
// token t dv's second half of token t+1 (0 for a sequence's last token). RoPE positions pos0 + t
// (t the index within the sequence), as the forward's.
__global__ void __launch_bounds__(kFinThreads, kFinMinBlocksBwd)
    finish_qk_bwd_kernel(float* dconv, float* dtemp_part, bf16* dqkv, int64_t ld, const bf16* dv,
                         const StageSrcs src, const float* norms, const float* temp, InvFreq inv,
                         int64_t pos0, int r, int S, int Hq, int Hkv, int d, int64_t N, int tb,
                         bool vec_dconv, bool vec_dqkv, bool vec_dv) {
  extern __shared__ uint4 fin_smem_u4[];
  char* const sm = reinterpret_cast<char*>(fin_smem_u4);
  const int H = Hq + Hkv, C = H * d, G = Hq / Hkv, h2 = r / 2, QD = Hq * d;
  const int KD = Hkv * d, VH = KD / 2;
  float* const xs = reinterpret_cast<float*>(sm);               // [tb][C] conv, then dconv
  const bf16* const rs = reinterpret_cast<bf16*>(xs + tb * C);  // [tb][C] q0 | k0
  const bf16* const gs = rs + tb * C;                           // [tb][C] dq | dk
  float2* const sc = reinterpret_cast<float2*>(const_cast<bf16*>(gs) + tb * C);  // [tb][h2]
  const int64_t n0 = int64_t(blockIdx.x) * tb;
  stage_rows(sm, src, n0, tb, N);
  rope_table(sc, inv, n0, tb, h2, S, pos0);
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const float sd = sqrtf(float(d));
  for (int it = warp; it < tb * H; it += kFinWarps) {
    const int tt = it / H, h = it - tt * H;
    const int64_t n = n0 + tt;
    if (n >= N) break;
    float* const xrow = xs + tt * C;
    const bf16* const row = rs + tt * C;
    const bf16* const gsrc = gs + tt * C + h * d;  // dq row head h, or dk row head h − Hq
    const float2* const sct = sc + tt * h2;
    float* const xh = xrow + h * d;  // x (pre-norm) in place of conv, then dconv
    // g after the transposed rotation (cpu::rope_backward), element i; evaluated twice per element
    // (same operands, same operations, same value) rather than held in registers.
    auto grad_at = [&](int i) {
      float gv = bf(gsrc[i]);
      if (i < r) {
        const int j = i < h2 ? i : i - h2;
        const float2 p = sct[j];
        const float sn = p.x, cs = p.y;
        if (i < h2)
          gv = gv * cs + bf(gsrc[i + h2]) * sn;
        else
          gv = gv * cs - bf(gsrc[j]) * sn;
      }
      return gv;
    };
    float xg = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float x = pre_norm(xrow, row, h, i, Hq, G, d);
      xh[i] = x;  // lane i alone reads conv[h·d + i] (just now) and later x and dconv there
      xg += x * grad_at(i);
    }
    xg = warp_sum(xg);
    const float nrm = norms[n * H + h];
    const float tv = h < Hq ? 1.0f : temp[h - Hq];
    const bool clamped = nrm <= FLT_EPSILON;
    for (int i = lane; i < d; i += 32)
      xh[i] = sd * tv * (grad_at(i) / nrm - (clamped ? 0.0f : xh[i] * xg / (nrm * nrm * nrm)));
    if (h >= Hq && lane == 0) dtemp_part[n * Hkv + (h - Hq)] = sd * xg / nrm;
  }
  __syncthreads();
  // dconv rows: C floats per token, 16-byte units.
  const int uc = C / 4;
  for (int u = int(threadIdx.x); u < tb * uc; u += kFinThreads) {
    const int tt = u / uc, w = u - tt * uc;
    const int64_t n = n0 + tt;
    if (n >= N) continue;
    store_unit(reinterpret_cast<char*>(dconv + n * C + int64_t(w) * 4),
               *reinterpret_cast<const uint4*>(xs + tt * C + w * 4), vec_dconv);
  }
  // dqkv rows, 8 channels (16 bytes) per unit; 8 | d, so a unit never straddles a head or the
  // q0|k0|vc|vd boundaries. q0|k0: the mean-skip gradient from the dconv rows in shared memory.
  const int us = C / 8;
  for (int u = int(threadIdx.x); u < tb * us; u += kFinThreads) {
    const int tt = u / us, e0 = (u - tt * us) * 8;
    const int64_t n = n0 + tt;
    if (n >= N) continue;
    const uint2 lo = skip_grad4(xs + tt * C, e0, QD, G, d);
    const uint2 hi = skip_grad4(xs + tt * C, e0 + 4, QD, G, d);
    store_unit(reinterpret_cast<char*>(dqkv + n * ld + e0), make_uint4(lo.x, lo.y, hi.x, hi.y),
               vec_dqkv);
  }
  // vc: dv's first half of token n; vd: dv's second half of token n+1 (0 for the last token).
  const int uv = KD / 8;
  for (int u = int(threadIdx.x); u < tb * uv; u += kFinThreads) {
    const int tt = u / uv, e0 = (u - tt * uv) * 8;
    const int64_t n = n0 + tt;
    if (n >= N) continue;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (e0 < VH)
      val = load_unit(reinterpret_cast<const char*>(dv + n * KD + e0), 2, vec_dv);
    else if (int(n % S) + 1 < S)
      val = load_unit(reinterpret_cast<const char*>(dv + (n + 1) * KD + e0), 2, vec_dv);
    store_unit(reinterpret_cast<char*>(dqkv + n * ld + C + e0), val, vec_dqkv);
  }
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
  const size_t direct_smem = size_t(d * t1) * sizeof(float);
  if (B * S <= kDirectRows && direct_smem <= kDefaultSmem) {
    conv_direct_kernel<<<dim3(unsigned(B * S), unsigned(C / d)), 256, direct_smem, st>>>(
        y_NC, mid, qkv, ld, hist_BPC, wdw_Ct0, bdw_C, wg_Cdt1, bg_C, int(S), int(C), int(d),
        int(t0), int(t1));
    check_launch(fn);
  } else {
    // Training (mid given) and prefill: the GEMM's loader forms u from the bf16 rows (and the
    // history) itself, and writes it to mid when given (backward needs it).
    BandArgs a{};
    a.out = y_NC;
    a.mid = mid;
    a.qkv = qkv;
    a.ld = ld;
    a.hist = hist_BPC;
    a.wdw = wdw_Ct0;
    a.bdw = bdw_C;
    a.wg = wg_Cdt1;
    a.bg = bg_C;
    a.S = int(S), a.C = int(C), a.d = int(d), a.t0 = int(t0), a.t1 = int(t1);
    a.vec_in = aligned16(qkv) && ld % 8 == 0;
    a.vec_mid = aligned16(mid);
    a.vec_w = aligned16(wg_Cdt1);
    a.vec_out = reinterpret_cast<uintptr_t>(y_NC) % 8 == 0;
    band<kFwd>(a, B, S, C, d, t1, st, fn);
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
  const int64_t nkc = conv_tn(d) ? wg_chunks(B * S, C, d, t1).n : 1;
  return aligned(size_t(B * M * C) * sizeof(float)) +
         aligned(size_t(B * nrc * C * (t0 + 2)) * sizeof(float)) +
         aligned(size_t(nkc * C * d * t1) * sizeof(float));
}

void cca_conv_bwd(bf16* dqkv, int64_t ld, float* dwdw, float* dbdw, float* dwg, float* dbg,
                  const float* dy_NC, const bf16* qkv, const float* mid, const float* wdw_Ct0,
                  const float* wg_Cdt1, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, Workspace& ws, cudaStream_t st) {
  cca_conv_bwd(dqkv, ld, dwdw, dbdw, dwg, dbg, dy_NC, qkv, mid, wdw_Ct0, wg_Cdt1, B, S, C, d, t0,
               t1, nullptr, nullptr, ws, st);
}

void cca_conv_bwd(bf16* dqkv, int64_t ld, float* dwdw, float* dbdw, float* dwg, float* dbg,
                  const float* dy_NC, const bf16* qkv, const float* mid, const float* wdw_Ct0,
                  const float* wg_Cdt1, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, const float* hist_BPC, float* dhist_BPC, Workspace& ws,
                  cudaStream_t st) {
  const char* fn = "cca_conv_bwd";
  check_conv_shape(fn, S, C, d, t0, t1);
  const int64_t P = (t0 - 1) + (t1 - 1);
  // The history path (dwdw's history terms, dhist) exists only with a history to differentiate
  // (cpu::cca_conv_backward's hist && dhist); without one the kernels are those of training.
  const bool with_hist = hist_BPC != nullptr && P > 0;
  if (B <= 0 || S <= 0) {
    // No tokens: du is zero, so is the history's gradient.
    if (B > 0 && S == 0 && with_hist && dhist_BPC)
      ZAYA_CUDA_CHECK(cudaMemsetAsync(dhist_BPC, 0, size_t(B * P * C) * sizeof(float), st));
    return;
  }
  const int64_t M = S + t1 - 1, N = B * S;
  if (N > INT32_MAX / 2) fail(fn, "too many tokens: " + std::to_string(N));
  const int64_t nrc = (S + kRB - 1) / kRB;
  const WgChunks wc = wg_chunks(N, C, d, t1);
  float* du = ws.take_n<float>(size_t(B * M * C));
  float* part_dw = ws.take_n<float>(size_t(B * nrc * C * (t0 + 2)));
  float* part_wg = ws.take_n<float>(size_t(wc.n * C * d * t1));

  // du: the grouped conv's data gradient (banded GEMM, flipped kernel).
  {
    BandArgs a{};
    a.out = du;
    a.dy = dy_NC;
    a.wg = wg_Cdt1;
    a.S = int(S), a.C = int(C), a.d = int(d), a.t0 = int(t0), a.t1 = int(t1);
    a.vec_in = aligned16(dy_NC);
    a.vec_w = aligned16(wg_Cdt1);
    a.vec_out = reinterpret_cast<uintptr_t>(du) % 8 == 0;
    band<kGrad>(a, B, S, C, d, t1, st, fn);
  }
  // dx (+= into dqkv), and partials of dwdw, dbdw, dbg.
  {
    const dim3 grid(unsigned((C + 127) / 128), unsigned(nrc), unsigned(B));
    if (with_hist)
      conv_dw_bwd_kernel<true><<<grid, 128, 0, st>>>(dqkv, ld, part_dw, du, dy_NC, qkv, wdw_Ct0,
                                                     hist_BPC, dhist_BPC, int(S), int(C), int(t0),
                                                     int(t1));
    else
      conv_dw_bwd_kernel<false><<<grid, 128, 0, st>>>(dqkv, ld, part_dw, du, dy_NC, qkv, wdw_Ct0,
                                                      nullptr, nullptr, int(S), int(C), int(t0),
                                                      int(t1));
    check_launch(fn);
  }
  // dwg partials per token chunk.
  {
    const int tn = conv_tn(d);
    const int64_t ntile = d / tn;
    const dim3 grid(unsigned(ntile * ntile * t1), unsigned(C / d), unsigned(wc.n));
    const bool vec = aligned16(dy_NC) && aligned16(mid);
    if (tn == 128)
      conv_wg_mma_kernel<128><<<grid, WgWarps<128>::threads, 0, st>>>(
          part_wg, dy_NC, mid, int(N), int(S), int(C), int(d), int(t1), int(wc.per), vec);
    else if (tn == 64)
      conv_wg_mma_kernel<64><<<grid, WgWarps<64>::threads, 0, st>>>(
          part_wg, dy_NC, mid, int(N), int(S), int(C), int(d), int(t1), int(wc.per), vec);
    else
      conv_wg_mma_kernel<32><<<grid, WgWarps<32>::threads, 0, st>>>(
          part_wg, dy_NC, mid, int(N), int(S), int(C), int(d), int(t1), int(wc.per), vec);
    check_launch(fn);
  }
  // Fixed-order sums of the partials.
  const int64_t Ldw = C * (t0 + 2);
  add_partials(dwdw, part_dw, B * nrc, Ldw, 0, C * t0, st, fn);
  add_partials(dbdw, part_dw, B * nrc, Ldw, C * t0, C, st, fn);
  add_partials(dbg, part_dw, B * nrc, Ldw, C * (t0 + 1), C, st, fn);
  add_partials(dwg, part_wg, wc.n, C * d * t1, 0, C * d * t1, st, fn);
}

namespace {
// The first two shared tiles of both finish kernels: conv rows [tb][C] fp32 at offset 0, then the
// q0|k0 columns of the qkv rows [tb][C] bf16.
StageSrcs conv_and_qk0_sources(const float* conv_NC, const bf16* qkv, int64_t ld, int64_t C,
                               int tb) {
  StageSrcs src{};
  src.s[0] = {reinterpret_cast<const char*>(conv_NC),
              C * 4,
              0,
              int(C * 4),
              int(C / 4),
              4,
              aligned16(conv_NC)};
  src.s[1] = {
      reinterpret_cast<const char*>(qkv), ld * 2, int(tb * C * 4), int(C * 2), int(C / 8), 2,
      aligned16(qkv) && ld % 8 == 0};
  return src;
}
}  // namespace

void cca_qkv_finish_fwd(bf16* q_NHd, bf16* k_NGd, bf16* v_NGd, float* norms_NH,
                        const float* conv_NC, const bf16* qkv, int64_t ld, const float* temp_G,
                        float* vd_last_B, bool update_vd_last, int64_t pos0, double theta,
                        int64_t r, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d,
                        cudaStream_t st) {
  const char* fn = "cca_qkv_finish_fwd";
  check_finish_shape(fn, Hq, Hkv, d, r);
  const int64_t N = B * S;
  if (N <= 0) return;
  const int64_t C = (Hq + Hkv) * d;
  const int tb = finish_tokens_per_block(C, r);
  StageSrcs src = conv_and_qk0_sources(conv_NC, qkv, ld, C, tb);
  finish_qk_fwd_kernel<<<unsigned((N + tb - 1) / tb), kFinThreads,
                         size_t(tb) * finish_token_bytes(C, r), st>>>(
      q_NHd, k_NGd, norms_NH, src, temp_G, inv_freq(theta, r), pos0, int(r), int(S), int(Hq),
      int(Hkv), int(d), N, tb, aligned16(q_NHd) && aligned16(k_NGd));
  check_launch(fn);
  const int64_t KD = Hkv * d;
  finish_v_fwd_kernel<<<dim3(unsigned(N), unsigned((KD + 255) / 256)), 256, 0, st>>>(
      v_NGd, qkv, ld, vd_last_B, update_vd_last, int(S), int(C), int(KD));
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
  cca_qkv_finish_bwd(dconv_NC, dqkv, ld, dtemp_G, dq, dk, dv, conv_NC, qkv, norms_NH, temp_G, 0,
                     theta, r, B, S, Hq, Hkv, d, ws, st);
}

void cca_qkv_finish_bwd(float* dconv_NC, bf16* dqkv, int64_t ld, float* dtemp_G, const bf16* dq,
                        const bf16* dk, const bf16* dv, const float* conv_NC, const bf16* qkv,
                        const float* norms_NH, const float* temp_G, int64_t pos0, double theta,
                        int64_t r, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d,
                        Workspace& ws, cudaStream_t st) {
  const char* fn = "cca_qkv_finish_bwd";
  check_finish_shape(fn, Hq, Hkv, d, r);
  const int64_t N = B * S;
  if (N <= 0) return;
  float* dtemp_part = ws.take_n<float>(size_t(N * Hkv));
  const int64_t C = (Hq + Hkv) * d, QD = Hq * d, KD = Hkv * d;
  const int tb = finish_tokens_per_block(C, r);
  // Shared tiles: conv [tb][C] fp32, q0|k0 [tb][C] bf16, dq|dk [tb][C] bf16 (dq row at column 0,
  // dk row at column QD).
  const int o_rs = int(tb * C * 4), o_gs = o_rs + int(tb * C * 2);
  StageSrcs src = conv_and_qk0_sources(conv_NC, qkv, ld, C, tb);
  src.s[2] = {
      reinterpret_cast<const char*>(dq), QD * 2, o_gs, int(C * 2), int(QD / 8), 2, aligned16(dq)};
  src.s[3] = {reinterpret_cast<const char*>(dk),
              KD * 2,
              o_gs + int(QD * 2),
              int(C * 2),
              int(KD / 8),
              2,
              aligned16(dk)};
  finish_qk_bwd_kernel<<<unsigned((N + tb - 1) / tb), kFinThreads,
                         size_t(tb) * finish_token_bytes(C, r), st>>>(
      dconv_NC, dtemp_part, dqkv, ld, dv, src, norms_NH, temp_G, inv_freq(theta, r), pos0, int(r),
      int(S), int(Hq), int(Hkv), int(d), N, tb, aligned16(dconv_NC), aligned16(dqkv) && ld % 8 == 0,
      aligned16(dv));
  check_launch(fn);
  dtemp_reduce_kernel<<<unsigned(Hkv), 256, 0, st>>>(dtemp_G, dtemp_part, N, int(Hkv));
  check_launch(fn);
}

}  // namespace zaya::cuda
