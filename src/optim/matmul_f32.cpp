// Blocked fp32 matmul for optimizer host code; see matmul_f32.h for the determinism contract.
#include "optim/matmul_f32.h"

#include <algorithm>
#include <vector>

#include "core/parallel.h"

namespace zaya {

namespace {
// Four output rows share each streamed row of B (register reuse); k is walked in blocks so the
// touched rows of B stay in L1/L2 while the four accumulator rows are updated. Every output element
// still sees k in ascending order, so blocking does not change the rounding.
constexpr int64_t kRowTile = 4;
constexpr int64_t kKBlock = 64;
constexpr int64_t kNBlock = 512;
}  // namespace

void matmul_f32(float* C, const float* A, const float* B, int64_t m, int64_t k, int64_t n,
                float alpha, float beta) {
  const int64_t tiles = (m + kRowTile - 1) / kRowTile;
  // Aim for roughly 64K multiply-adds per chunk before splitting over threads.
  const int64_t min_chunk = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, k * n));
  parallel_for(
      tiles,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> acc(size_t(kRowTile * kNBlock));
        for (int64_t t = t0; t < t1; t++) {
          const int64_t i0 = t * kRowTile, rows = std::min(kRowTile, m - i0);
          for (int64_t j0 = 0; j0 < n; j0 += kNBlock) {
            const int64_t cols = std::min(kNBlock, n - j0);
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t p0 = 0; p0 < k; p0 += kKBlock) {
              const int64_t p1 = std::min(k, p0 + kKBlock);
              for (int64_t r = 0; r < rows; r++) {
                const float* a = A + (i0 + r) * k;
                float* c = acc.data() + r * kNBlock;
                for (int64_t p = p0; p < p1; p++) {
                  const float av = a[p];
                  const float* b = B + p * n + j0;
                  for (int64_t j = 0; j < cols; j++) c[j] += av * b[j];
                }
              }
            }
            for (int64_t r = 0; r < rows; r++) {
              float* out = C + (i0 + r) * n + j0;
              const float* c = acc.data() + r * kNBlock;
              if (beta == 0.0f) {
                for (int64_t j = 0; j < cols; j++) out[j] = alpha * c[j];
              } else {
                for (int64_t j = 0; j < cols; j++) out[j] = alpha * c[j] + beta * out[j];
              }
            }
          }
        }
      },
      min_chunk);
}

void gram_f32(float* G, const float* A, int64_t m, int64_t k) {
  std::vector<float> At(size_t(k * m));
  for (int64_t i = 0; i < m; i++)
    for (int64_t p = 0; p < k; p++) At[size_t(p * m + i)] = A[i * k + p];
  matmul_f32(G, A, At.data(), m, k, m);
}

}  // namespace zaya
