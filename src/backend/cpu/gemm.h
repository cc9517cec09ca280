// The CPU reference's one matrix product: C = alpha·A·B (+ bias) (+ beta·C) in fp32 over strided
// views, computed by a register-tiled micro-kernel (6 rows × 16 columns; B packed into 16-column
// strips when its rows are not contiguous).
// Every linear layer, the CCA convolution, attention's score/gradient products and the
// optimizers' Newton–Schulz products go through it.
//
// Numerics (the contract the callers and their tests rely on): each element of C is accumulated by
// exactly one thread, starting from 0 and adding the rounded products A(i,p)·B(p,j) for p = 0,1,..
// in order (no fused multiply-add, no split of k), and only then scaled, biased and added to
// beta·C. So the result is bit-identical for any thread count and for every instruction set the
// kernel is compiled for (it is cloned for AVX-512F, AVX2 and baseline x86-64 and picked at run
// time; the clones do the same lane-wise multiplies and adds).
//
// Deliberately not a BLAS: no k-blocking (that would change the summation order), no complex or
// double types, inputs are fp32 only (callers widen bf16 weights first).
#pragma once
#include <cstdint>

namespace zaya::cpu {

// A read-only strided matrix: element (r, c) is p[r * rs + c * cs].
struct MatView {
  const float* p;
  int64_t rs, cs;
};
// The row-major matrix X with leading dimension ld.
inline MatView rows_of(const float* x, int64_t ld) {
  return {x, ld, 1};
}
// The transpose of the row-major matrix X with leading dimension ld: element (r, c) = X[c][r].
inline MatView transpose_of(const float* x, int64_t ld) {
  return {x, 1, ld};
}

// C[i, j] = alpha · Σ_{p<k} A(i, p)·B(p, j)  + bias[j] (when non-null)  + beta · C[i, j] (when
// beta != 0; with beta == 0, C is not read and may hold NaN), for i < m, j < n. C is row-major with
// leading dimension ldc and must not alias A, B or bias. Work is split over 6×16 output tiles with
// parallel_for (run inline when called from inside a parallel_for task).
void gemm(float* C, int64_t ldc, MatView A, MatView B, int64_t m, int64_t k, int64_t n,
          float alpha = 1.0f, float beta = 0.0f, const float* bias = nullptr);

}  // namespace zaya::cpu
