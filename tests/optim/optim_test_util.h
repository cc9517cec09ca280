// Shared helpers for the optimizer tests: random fp32 parameters and double-precision references
// written independently of src/optim (plain triple loops, no blocking, no threads).
#pragma once
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "optim/param.h"

namespace zaya::testing {

inline Tensor random_tensor(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  Tensor t = Tensor::zeros(shape);
  for (int64_t i = 0; i < t.numel(); i++) t.f32()[i] = r.normal() * scale;
  return t;
}

inline ParamRef random_param(const std::string& name, const Shape& shape, uint64_t seed) {
  return ParamRef{name, random_tensor(shape, seed), random_tensor(shape, seed + 1000, 0.1f)};
}

inline std::vector<double> to_double(const Tensor& t) {
  return std::vector<double>(t.f32(), t.f32() + t.numel());
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.f32(), b.f32(), a.nbytes()) == 0;
}

// Row-major double matmul C[m,n] = A[m,k] B[k,n].
inline std::vector<double> matmul_ref(const std::vector<double>& A, const std::vector<double>& B,
                                      int m, int k, int n) {
  std::vector<double> C(size_t(m) * n, 0.0);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int p = 0; p < k; p++) s += A[size_t(i) * k + p] * B[size_t(p) * n + j];
      C[size_t(i) * n + j] = s;
    }
  return C;
}

inline std::vector<double> transpose_ref(const std::vector<double>& A, int m, int n) {
  std::vector<double> T(A.size());
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) T[size_t(j) * m + i] = A[size_t(i) * n + j];
  return T;
}

// Muon's quintic Newton–Schulz in double, written from the formula.
inline std::vector<double> newton_schulz_ref(std::vector<double> X, int rows, int cols,
                                             int steps = 5) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  bool tall = rows > cols;
  int m = rows, n = cols;
  if (tall) X = transpose_ref(X, rows, cols), m = cols, n = rows;
  double nrm = 0;
  for (double v : X) nrm += v * v;
  nrm = std::sqrt(nrm) + 1e-7;
  for (double& v : X) v /= nrm;
  for (int s = 0; s < steps; s++) {
    auto A = matmul_ref(X, transpose_ref(X, m, n), m, n, m);
    auto AA = matmul_ref(A, A, m, m, m);
    std::vector<double> B(A.size());
    for (size_t i = 0; i < B.size(); i++) B[i] = b * A[i] + c * AA[i];
    auto BX = matmul_ref(B, X, m, m, n);
    for (size_t i = 0; i < X.size(); i++) X[i] = a * X[i] + BX[i];
  }
  if (tall) X = transpose_ref(X, m, n);
  return X;
}

// Eigenvalues of a symmetric matrix by cyclic Jacobi rotations (double).
inline std::vector<double> sym_eigenvalues(std::vector<double> A, int n) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0;
    for (int i = 0; i < n; i++)
      for (int j = i + 1; j < n; j++) off += A[size_t(i) * n + j] * A[size_t(i) * n + j];
    if (off < 1e-22) break;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) {
        double apq = A[size_t(p) * n + q];
        if (std::fabs(apq) < 1e-300) continue;
        double app = A[size_t(p) * n + p], aqq = A[size_t(q) * n + q];
        double theta = (aqq - app) / (2 * apq);
        double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        double cs = 1 / std::sqrt(t * t + 1), sn = t * cs;
        for (int k = 0; k < n; k++) {
          double akp = A[size_t(k) * n + p], akq = A[size_t(k) * n + q];
          A[size_t(k) * n + p] = cs * akp - sn * akq;
          A[size_t(k) * n + q] = sn * akp + cs * akq;
        }
        for (int k = 0; k < n; k++) {
          double apk = A[size_t(p) * n + k], aqk = A[size_t(q) * n + k];
          A[size_t(p) * n + k] = cs * apk - sn * aqk;
          A[size_t(q) * n + k] = sn * apk + cs * aqk;
        }
      }
  }
  std::vector<double> ev(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) ev[size_t(i)] = A[size_t(i) * n + i];
  return ev;
}

// Singular values of a row-major [m, n] matrix (via the smaller Gram matrix).
inline std::vector<double> singular_values(const std::vector<double>& X, int m, int n) {
  std::vector<double> G;
  int k;
  if (m <= n) {
    G = matmul_ref(X, transpose_ref(X, m, n), m, n, m);
    k = m;
  } else {
    G = matmul_ref(transpose_ref(X, m, n), X, n, m, n);
    k = n;
  }
  auto ev = sym_eigenvalues(G, k);
  for (double& e : ev) e = std::sqrt(std::max(0.0, e));
  return ev;
}

}  // namespace zaya::testing
