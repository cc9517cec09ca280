// The register-tiled fp32 matrix product of the CPU reference (see gemm.h for the numerics
// contract).
//
// The micro-kernel keeps a kMR × kNR block of C in vector registers (6 accumulators of 16 lanes:
// 6 zmm with AVX-512, 12 ymm with AVX2) and walks the whole of k, so each output element is one
// sequential sum. It broadcasts A's elements straight from the caller's strided view (six row
// pointers; rows past m repeat the last row and their results are dropped), and reads B as 16
// contiguous floats per k: in place when B's rows are contiguous, else from a copy packed into
// strips of 16 columns (k × 16, zero-padded), which is also how the last, partial strip is read.
// Packing A as well would cost as much as the products when n is small (n = 16 or 32 is common
// here: head dims, router widths), and reading it in place is as fast for the sizes we have.
// GCC vector extensions instead of intrinsics: the same source compiles for every clone.
#include "backend/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"

// AVX-512F carries fused multiply-add instructions, and GCC contracts `acc += a * b` into them
// under its default -ffp-contract=fast (clang under its default "on"); the contract of gemm.h is
// separate rounding of product and sum on every clone, so contraction is off for this file.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace zaya::cpu {

namespace {

constexpr int64_t kMR = 6;   // rows of a C tile (broadcast from the A panel)
constexpr int64_t kNR = 16;  // columns of a C tile (one 16-lane vector)

typedef float v16 __attribute__((vector_size(64)));

// 64-byte aligned scratch that grows and is kept by the calling thread between calls.
float* scratch(std::vector<float>& buf, int64_t n) {
  if (int64_t(buf.size()) < n + 16) buf.resize(size_t(n + 16));
  const uintptr_t a = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((a + 63) & ~uintptr_t(63));
}

// Strip `strip` of B (columns strip·16 .. +15, zero-padded past n) into d as k rows of 16.
void pack_b(float* d, MatView B, int64_t k, int64_t n, int64_t strip) {
  const int64_t j0 = strip * kNR, cols = std::min(kNR, n - j0);
  if (B.cs == 1) {  // rows of B are contiguous
    for (int64_t p = 0; p < k; p++) {
      const float* src = B.p + p * B.rs + j0;
      for (int64_t j = 0; j < cols; j++) d[p * kNR + j] = src[j];
      for (int64_t j = cols; j < kNR; j++) d[p * kNR + j] = 0.0f;
    }
  } else {  // columns of B are contiguous (B is a transposed row-major matrix)
    for (int64_t j = 0; j < cols; j++) {
      const float* src = B.p + (j0 + j) * B.cs;
      for (int64_t p = 0; p < k; p++) d[p * kNR + j] = src[p * B.rs];
    }
    for (int64_t p = 0; p < k; p++)
      for (int64_t j = cols; j < kNR; j++) d[p * kNR + j] = 0.0f;
  }
}

struct TileJob {
  MatView A;
  MatView B;
  float* Bp;  // this thread's packed strip (k × kNR), or null when B is read in place
  float* C;
  int64_t ldc, m, k, n, strips;
  float alpha, beta;
  const float* bias;
};

// The kMR × kNR block Σ_p a_r[p·acs] · b[p·bs + 0..15] into out (row-major kMR × kNR).
[[gnu::always_inline]] inline void micro_kernel(const float* const* a, int64_t acs, const float* b,
                                                int64_t bs, int64_t k, float* out) {
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  v16 c0 = {}, c1 = {}, c2 = {}, c3 = {}, c4 = {}, c5 = {};
  for (int64_t p = 0; p < k; p++) {
    v16 bv;
    std::memcpy(&bv, b + p * bs, sizeof(bv));
    const int64_t o = p * acs;
    c0 += a0[o] * bv;
    c1 += a1[o] * bv;
    c2 += a2[o] * bv;
    c3 += a3[o] * bv;
    c4 += a4[o] * bv;
    c5 += a5[o] * bv;
  }
  std::memcpy(out + 0 * kNR, &c0, sizeof(c0));
  std::memcpy(out + 1 * kNR, &c1, sizeof(c1));
  std::memcpy(out + 2 * kNR, &c2, sizeof(c2));
  std::memcpy(out + 3 * kNR, &c3, sizeof(c3));
  std::memcpy(out + 4 * kNR, &c4, sizeof(c4));
  std::memcpy(out + 5 * kNR, &c5, sizeof(c5));
}

// Tiles [t_begin, t_end). Read in place, B is walked panel-major (t = panel · strips + strip), so
// consecutive tiles share their six rows of A; packed, it is walked strip-major (t = strip · panels
// + panel), so each thread packs each strip it needs once, into J.Bp, and no copy of the whole of
// B is ever held (for a vocabulary-sized weight that copy would be as large as the weight).
__attribute__((target_clones("avx512f", "avx2", "default"))) void run_tiles(const TileJob& J,
                                                                            int64_t t_begin,
                                                                            int64_t t_end) {
  alignas(64) float out[kMR * kNR];
  const float* arows[kMR];
  const int64_t panels = (J.m + kMR - 1) / kMR;
  int64_t packed = -1;  // the strip now in J.Bp
  for (int64_t t = t_begin; t < t_end; t++) {
    const int64_t panel = J.Bp ? t % panels : t / J.strips;
    const int64_t strip = J.Bp ? t / panels : t % J.strips;
    const int64_t i0 = panel * kMR, j0 = strip * kNR;
    const int64_t rows = std::min(kMR, J.m - i0), cols = std::min(kNR, J.n - j0);
    for (int64_t r = 0; r < kMR; r++) arows[r] = J.A.p + std::min(i0 + r, J.m - 1) * J.A.rs;
    if (J.Bp) {
      if (strip != packed) pack_b(J.Bp, J.B, J.k, J.n, strip);
      packed = strip;
      micro_kernel(arows, J.A.cs, J.Bp, kNR, J.k, out);
    } else {
      micro_kernel(arows, J.A.cs, J.B.p + j0, J.B.rs, J.k, out);
    }
    for (int64_t r = 0; r < rows; r++) {
      float* c = J.C + (i0 + r) * J.ldc + j0;
      const float* o = out + r * kNR;
      for (int64_t j = 0; j < cols; j++) {
        float v = J.alpha * o[j];
        if (J.bias) v += J.bias[j0 + j];
        if (J.beta != 0.0f) v += J.beta * c[j];
        c[j] = v;
      }
    }
  }
}

}  // namespace

void gemm(float* C, int64_t ldc, MatView A, MatView B, int64_t m, int64_t k, int64_t n, float alpha,
          float beta, const float* bias) {
  if (m <= 0 || n <= 0) return;
  k = std::max<int64_t>(k, 0);
  const int64_t panels = (m + kMR - 1) / kMR, strips = (n + kNR - 1) / kNR;
  // B is read in place when each of its rows holds 16 contiguous floats per strip; a partial
  // last strip would read past the row, so then (and for transposed B) strips are packed.
  const bool in_place = B.cs == 1 && n % kNR == 0;
  // About 64K multiply-adds per chunk before a second thread is worth waking.
  const int64_t tile_chunk = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, k * kMR * kNR));
  parallel_for(
      panels * strips,
      [&](int64_t b, int64_t e) {
        thread_local std::vector<float> strip_buf;
        TileJob job{A, B, nullptr, C, ldc, m, k, n, strips, alpha, beta, bias};
        if (!in_place) job.Bp = scratch(strip_buf, k * kNR);
        run_tiles(job, b, e);
      },
      tile_chunk);
}

}  // namespace zaya::cpu
