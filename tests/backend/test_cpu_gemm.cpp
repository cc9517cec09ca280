// cpu::gemm (src/backend/cpu/gemm.h) against its numerics contract: every output element equals,
// bit for bit, the scalar loop `acc = 0; for p: acc += A(i,p)·B(p,j)` followed by alpha, bias and
// beta, for row-major, transposed and sub-matrix views, edge sizes that leave partial 6×16 tiles,
// k = 0, and sizes large enough to be split over threads. Bit equality with one scalar loop is what
// makes results independent of the thread count and of the instruction-set clone picked at run
// time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/gemm.h"
#include "core/rng.h"

namespace zaya {
namespace {

std::vector<float> random_buf(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.uniform() * 2.0f - 1.0f;
  return v;
}

float at(const cpu::MatView& v, int64_t r, int64_t c) {
  return v.p[r * v.rs + c * v.cs];
}

// The contract, written as the plainest loop. The product goes through a volatile so that a build
// with FMA enabled cannot contract the reference into fused multiply-adds.
void reference(float* C, int64_t ldc, cpu::MatView A, cpu::MatView B, int64_t m, int64_t k,
               int64_t n, float alpha, float beta, const float* bias) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; p++) {
        volatile float prod = at(A, i, p) * at(B, p, j);
        acc += prod;
      }
      volatile float v = alpha * acc;
      float out = v;
      if (bias) out += bias[j];
      if (beta != 0.0f) {
        volatile float bc = beta * C[i * ldc + j];
        out += bc;
      }
      C[i * ldc + j] = out;
    }
}

struct Shape {
  int64_t m, k, n;
};

void check(const Shape& s, bool a_transposed, bool b_transposed, float alpha, float beta,
           bool with_bias, uint64_t seed) {
  // Operands live inside larger buffers (leading dimensions beyond the logical sizes).
  const int64_t lda = (a_transposed ? s.m : s.k) + 3, ldb = (b_transposed ? s.k : s.n) + 2;
  const int64_t ldc = s.n + 5;
  const auto a = random_buf(size_t((a_transposed ? s.k : s.m) * lda + 1), seed);
  const auto b = random_buf(size_t((b_transposed ? s.n : s.k) * ldb + 1), seed + 1);
  const auto bias = random_buf(size_t(s.n), seed + 2);
  const cpu::MatView A =
      a_transposed ? cpu::transpose_of(a.data(), lda) : cpu::rows_of(a.data(), lda);
  const cpu::MatView B =
      b_transposed ? cpu::transpose_of(b.data(), ldb) : cpu::rows_of(b.data(), ldb);
  std::vector<float> got = random_buf(size_t(s.m * ldc), seed + 3), want = got;
  if (beta == 0.0f)  // C must not be read: NaN there would show
    for (int64_t i = 0; i < s.m; i++)
      for (int64_t j = 0; j < s.n; j++)
        got[size_t(i * ldc + j)] = std::numeric_limits<float>::quiet_NaN();
  cpu::gemm(got.data(), ldc, A, B, s.m, s.k, s.n, alpha, beta, with_bias ? bias.data() : nullptr);
  reference(want.data(), ldc, A, B, s.m, s.k, s.n, alpha, beta, with_bias ? bias.data() : nullptr);
  for (int64_t i = 0; i < s.m; i++)
    for (int64_t j = 0; j < ldc; j++) {
      const size_t x = size_t(i * ldc + j);
      if (j >= s.n) {  // outside the logical matrix: untouched
        ASSERT_EQ(std::memcmp(&got[x], &want[x], sizeof(float)), 0)
            << "wrote past n at " << i << "," << j;
        continue;
      }
      ASSERT_EQ(std::memcmp(&got[x], &want[x], sizeof(float)), 0)
          << "m " << s.m << " k " << s.k << " n " << s.n << " At " << a_transposed << " Bt "
          << b_transposed << " alpha " << alpha << " beta " << beta << " bias " << with_bias
          << ": C[" << i << "][" << j << "] = " << got[x] << ", scalar loop " << want[x];
    }
}

TEST(CpuGemm, BitIdenticalToTheScalarLoop) {
  const Shape shapes[] = {{1, 1, 1},    {6, 16, 16},   {5, 3, 17},  {7, 9, 33},
                          {13, 33, 31}, {64, 128, 48}, {1, 200, 5}, {37, 2, 70}};
  uint64_t seed = 1;
  for (const Shape& s : shapes)
    for (int layout = 0; layout < 4; layout++)
      for (auto [alpha, beta, bias] :
           {std::tuple{1.0f, 0.0f, false}, std::tuple{0.75f, 1.0f, true},
            std::tuple{1.0f, -0.5f, false}, std::tuple{-2.0f, 0.0f, true}})
        check(s, layout & 1, layout & 2, alpha, beta, bias, seed++);
}

TEST(CpuGemm, ZeroDepthGivesBiasAndBeta) {
  check({5, 0, 19}, false, false, 1.0f, 1.0f, true, 99);
  check({4, 0, 3}, true, true, 1.0f, 0.0f, false, 98);
}

TEST(CpuGemm, LargeProductSplitOverThreadsStillMatches) {
  // Large enough for parallel_for to split packing and tiles over every worker.
  check({190, 257, 130}, false, true, 1.0f, 1.0f, true, 7);
  check({96, 1024, 40}, true, false, 1.0f, 0.0f, false, 8);
}

}  // namespace
}  // namespace zaya
