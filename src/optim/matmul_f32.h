// fp32 matrix products for the optimizers' host code (Muon's Newton–Schulz iteration), thin
// wrappers of cpu::gemm (backend/cpu/gemm.h). Row-major, contiguous, no aliasing between output and
// inputs. Each output element is accumulated by one thread in a fixed order (k ascending), so the
// result is bit-identical for any thread count.
#pragma once
#include <cstdint>

namespace zaya {

// C[m,n] = alpha * A[m,k] · B[k,n] + beta * C[m,n]. With beta == 0, C is not read (may hold NaN).
void matmul_f32(float* C, const float* A, const float* B, int64_t m, int64_t k, int64_t n,
                float alpha = 1.0f, float beta = 0.0f);

// G[m,m] = A[m,k] · A[m,k]^T (the Gram matrix of A's rows). G[i][j] and G[j][i] sum the same
// products in the same order, so G is exactly symmetric.
void gram_f32(float* G, const float* A, int64_t m, int64_t k);

}  // namespace zaya
