// fp32 matmuls for optimizer host code, on the CPU backend's packed, register-tiled product
// (backend/cpu/gemm.h). See matmul_f32.h for the determinism contract: cpu::gemm sums each output
// element's k products in ascending order on one thread, starting from zero, then applies alpha
// and beta exactly as this file's earlier row-blocked loops did, so results are unchanged.
#include "optim/matmul_f32.h"

#include "backend/cpu/gemm.h"

namespace zaya {

void matmul_f32(float* C, const float* A, const float* B, int64_t m, int64_t k, int64_t n,
                float alpha, float beta) {
  cpu::gemm(C, n, cpu::rows_of(A, k), cpu::rows_of(B, n), m, k, n, alpha, beta);
}

void gram_f32(float* G, const float* A, int64_t m, int64_t k) {
  // G = A·Aᵀ: G[i][j] and G[j][i] sum the same products in the same order (exactly symmetric).
  cpu::gemm(G, m, cpu::rows_of(A, k), cpu::transpose_of(A, k), m, k, m);
}

}  // namespace zaya
