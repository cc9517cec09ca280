// Quintic Newton–Schulz orthogonalisation as used by Muon: X ← X/(‖X‖_F + eps), then
//   A = X·Xᵀ,  B = b·A + c·A·A,  X ← a·X + B·X
// five times with (a, b, c) = (3.4445, −4.7750, 2.0315). The coefficients trade exactness for
// speed: singular values end near 1 (roughly 0.7–1.2) rather than exactly at 1, which Muon
// tolerates. A tall matrix (rows > cols) is transposed so the Gram matrix is the smaller one. fp32
// on the host, deterministic (see matmul_f32.h). Not the fused GPU kernel, which belongs to
// backend/cuda.
#pragma once
#include <cstdint>

namespace zaya {

struct NewtonSchulzCoefficients {
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;
};

constexpr int kNewtonSchulzSteps = 5;
constexpr float kNewtonSchulzEps = 1e-7f;

// Replaces the row-major [rows, cols] matrix X by its approximate orthogonalisation (same shape).
void newton_schulz_orthogonalize(float* X, int64_t rows, int64_t cols,
                                 int steps = kNewtonSchulzSteps, NewtonSchulzCoefficients k = {});

}  // namespace zaya
