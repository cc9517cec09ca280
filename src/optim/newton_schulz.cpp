// Quintic Newton–Schulz for Muon; see newton_schulz.h.
#include "optim/newton_schulz.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/matmul_f32.h"

namespace zaya {

void newton_schulz_orthogonalize(float* X, int64_t rows, int64_t cols, int steps,
                                 NewtonSchulzCoefficients k) {
  ZAYA_ASSERT(rows > 0 && cols > 0);
  const bool transposed = rows > cols;
  const int64_t m = transposed ? cols : rows, n = transposed ? rows : cols;  // m <= n
  std::vector<float> x(size_t(m * n));
  if (transposed) {
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) x[size_t(j * rows + i)] = X[i * cols + j];
  } else {
    std::copy(X, X + m * n, x.begin());
  }
  // Frobenius norm in double: one serial sum, so it does not depend on the thread count.
  double ss = 0.0;
  for (float v : x) ss += double(v) * double(v);
  const float inv = float(1.0 / (std::sqrt(ss) + double(kNewtonSchulzEps)));
  for (float& v : x) v *= inv;

  std::vector<float> A(size_t(m * m)), B(size_t(m * m)), y(size_t(m * n));
  for (int s = 0; s < steps; s++) {
    gram_f32(A.data(), x.data(), m, n);        // A = X Xᵀ
    std::copy(A.begin(), A.end(), B.begin());  // B = b·A + c·A·A
    matmul_f32(B.data(), A.data(), A.data(), m, m, m, k.c, k.b);
    std::copy(x.begin(), x.end(), y.begin());  // X = a·X + B·X
    matmul_f32(y.data(), B.data(), x.data(), m, m, n, 1.0f, k.a);
    x.swap(y);
  }
  if (transposed) {
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) X[i * cols + j] = x[size_t(j * rows + i)];
  } else {
    std::copy(x.begin(), x.end(), X);
  }
}

}  // namespace zaya
