// The packed, register-tiled fp32 matrix product of the CPU reference (see gemm.h for the
// numerics contract).
//
// A is packed into panels of kMR rows (k × kMR, row index fastest) and B into strips of kNR
// columns (k × kNR), zero-padded at the edges, so the micro-kernel reads both with unit stride
// whatever the views' strides were. The micro-kernel keeps a kMR × kNR block of C in vector
// registers (6 accumulators of 16 lanes: 6 zmm with AVX-512, 12 ymm with AVX2) and walks the whole
// of k, so each output element is one sequential sum. GCC vector extensions instead of intrinsics:
// the same source compiles for every clone, and lane-wise `acc += a * b` is exactly the scalar
// loop's arithmetic (contraction is switched off below, so no clone fuses them).
#include "backend/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"

// AVX-512F carries fused multiply-add instructions, and GCC contracts `acc += a * b` into them
// under its default -ffp-contract=fast; the contract of gemm.h is separate rounding of product and
// sum on every clone, so contraction is off for this file.
#pragma GCC optimize("fp-contract=off")

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

void pack_a(float* dst, MatView A, int64_t m, int64_t k, int64_t panel) {
  float* d = dst + panel * k * kMR;
  const int64_t i0 = panel * kMR, rows = std::min(kMR, m - i0);
  if (A.cs == 1) {  // rows of A are contiguous: read them in order
    for (int64_t r = 0; r < rows; r++) {
      const float* src = A.p + (i0 + r) * A.rs;
      for (int64_t p = 0; p < k; p++) d[p * kMR + r] = src[p];
    }
  } else {
    for (int64_t p = 0; p < k; p++)
      for (int64_t r = 0; r < rows; r++) d[p * kMR + r] = A.p[(i0 + r) * A.rs + p * A.cs];
  }
  for (int64_t r = rows; r < kMR; r++)
    for (int64_t p = 0; p < k; p++) d[p * kMR + r] = 0.0f;
}

void pack_b(float* dst, MatView B, int64_t k, int64_t n, int64_t strip) {
  float* d = dst + strip * k * kNR;
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
  const float* Ap;
  const float* Bp;
  float* C;
  int64_t ldc, m, k, n, strips;
  float alpha, beta;
  const float* bias;
};

// The kMR × kNR block of A-panel · B-strip products into out (row-major kMR × kNR).
[[gnu::always_inline]] inline void micro_kernel(const float* a, const float* b, int64_t k,
                                                float* out) {
  v16 c0 = {}, c1 = {}, c2 = {}, c3 = {}, c4 = {}, c5 = {};
  for (int64_t p = 0; p < k; p++) {
    v16 bv;
    std::memcpy(&bv, b + p * kNR, sizeof(bv));
    const float* ap = a + p * kMR;
    c0 += ap[0] * bv;
    c1 += ap[1] * bv;
    c2 += ap[2] * bv;
    c3 += ap[3] * bv;
    c4 += ap[4] * bv;
    c5 += ap[5] * bv;
  }
  std::memcpy(out + 0 * kNR, &c0, sizeof(c0));
  std::memcpy(out + 1 * kNR, &c1, sizeof(c1));
  std::memcpy(out + 2 * kNR, &c2, sizeof(c2));
  std::memcpy(out + 3 * kNR, &c3, sizeof(c3));
  std::memcpy(out + 4 * kNR, &c4, sizeof(c4));
  std::memcpy(out + 5 * kNR, &c5, sizeof(c5));
}

// Tiles [t_begin, t_end) in panel-major order (t = panel · strips + strip).
__attribute__((target_clones("avx512f", "avx2", "default"))) void run_tiles(const TileJob& J,
                                                                            int64_t t_begin,
                                                                            int64_t t_end) {
  alignas(64) float out[kMR * kNR];
  for (int64_t t = t_begin; t < t_end; t++) {
    const int64_t panel = t / J.strips, strip = t % J.strips;
    micro_kernel(J.Ap + panel * J.k * kMR, J.Bp + strip * J.k * kNR, J.k, out);
    const int64_t i0 = panel * kMR, j0 = strip * kNR;
    const int64_t rows = std::min(kMR, J.m - i0), cols = std::min(kNR, J.n - j0);
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
  thread_local std::vector<float> abuf, bbuf;
  float* Ap = scratch(abuf, panels * k * kMR);
  float* Bp = scratch(bbuf, strips * k * kNR);
  // Packing moves k·(m + n) floats against k·m·n multiply-adds: split it only when it is large.
  const int64_t pack_chunk_a = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, k * kMR));
  const int64_t pack_chunk_b = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, k * kNR));
  parallel_for(
      panels,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) pack_a(Ap, A, m, k, i);
      },
      pack_chunk_a);
  parallel_for(
      strips,
      [&](int64_t b, int64_t e) {
        for (int64_t s = b; s < e; s++) pack_b(Bp, B, k, n, s);
      },
      pack_chunk_b);
  const TileJob job{Ap, Bp, C, ldc, m, k, n, strips, alpha, beta, bias};
  // About 64K multiply-adds per chunk before a second thread is worth waking.
  const int64_t tile_chunk = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, k * kMR * kNR));
  parallel_for(
      panels * strips, [&](int64_t b, int64_t e) { run_tiles(job, b, e); }, tile_chunk);
}

}  // namespace zaya::cpu
