// Dense GEMMs on cuBLASLt for the CUDA backend, in row-major terms.
//
//   C[M,N] = alpha · op(A) · op(B) + beta · C
//   op(A) = A [M,K] (lda >= K)  or, with trans_a, A^T where A is stored [K,M] (lda >= M)
//   op(B) = B [K,N] (ldb >= N)  or, with trans_b, B^T where B is stored [N,K] (ldb >= K)
//
// so nn.Linear forward is gemm(x[N,K], W[O,K], trans_b), dgrad is gemm(dy[N,O], W[O,K]) and wgrad
// is gemm(dy[N,O]^T via trans_a, x[N,K]) with beta = 1 to accumulate. A and B are bf16 (or fp32 for
// the router's fp32 GEMMs, both the same type); C is bf16 or fp32; accumulation is fp32 (for fp32
// operands: full fp32, no TF32, so the router matches the reference). An optional fp32 bias[N] is
// added by the epilogue (beta must be 0 then).
//
// Lifecycle (DESIGN.md §5): a GemmContext owns the cuBLASLt handle and one workspace; algorithms
// are chosen once per (shape, types, transposes) key from cuBLASLt's heuristic and cached, so
// steady-state calls do no host work beyond the descriptor lookup. The grouped (expert) GEMMs,
// whose row counts change every step, are cached per *size bucket* of the varying dimension
// (size_bucket), not per exact size, so the cache stays small and a step creates no plans once
// the buckets are warm. Deterministic: the algorithm is a function of (bucket or exact shape,
// types, transposes, alignments, device, library) only (no split-K with atomics: reduction
// schemes that are not deterministic are excluded from the heuristic's candidates).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace zaya::cuda {

enum class GemmType { BF16, F32 };

class GemmContext {
 public:
  // workspace_bytes: cuBLASLt workspace (32 MiB is what Hopper kernels want).
  explicit GemmContext(size_t workspace_bytes = size_t(32) << 20);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
            GemmType ab_type, GemmType c_type, const float* bias, cudaStream_t st);

  // Grouped GEMM for the experts (tokens sorted by expert): for g in 0..G-1 with rows_host[g] > 0,
  //   C[off_g : off_g+rows_g, :] = alpha · op(A[off_g : ...]) · op(B_g) + beta · C[...]
  // where off_g = Σ_{h<g} rows_host[h], A/C rows are contiguous per group (lda, ldc as above) and
  // B_g = B + g · b_stride (elements). All bf16 operands. Used for the expert forward
  // (trans_b, W_e [O,K]) and dgrad.
  void grouped_gemm(bool trans_b, const int32_t* rows_host, int64_t G, int64_t N, int64_t K,
                    float alpha, const void* A, int64_t lda, const void* B, int64_t ldb,
                    int64_t b_stride, float beta, void* C, int64_t ldc, GemmType c_type,
                    cudaStream_t st);
  // Grouped weight gradient: dW_g[M_out, K] (+)= alpha · dY_g^T · X_g over each group's rows:
  // dY rows [rows_g, M_out] (ld_dy), X rows [rows_g, K] (ld_x), dW_g = dW + g · w_stride (fp32 or
  // bf16 by c_type). Groups with no rows leave dW_g untouched when beta = 1 (zeroed when beta = 0).
  void grouped_wgrad(const int32_t* rows_host, int64_t G, int64_t M_out, int64_t K, float alpha,
                     const void* dY, int64_t ld_dy, const void* X, int64_t ld_x, float beta,
                     void* dW, int64_t w_stride, GemmType c_type, cudaStream_t st);

  // Number of cached plans (exact-shape and bucket plans); for tests of the cache's bound.
  size_t plan_count() const;
  // The bucket (its upper bound) that a varying dimension v >= 1 is cached under: multiples of 128
  // up to 1024, then eight steps per power of two (1152, 1280, ..., 2048, 2304, ...).
  static int64_t size_bucket(int64_t v);

 private:
  // One GEMM of a grouped call; vary: 1 = M, 2 = K is the dimension cached by bucket.
  void grouped_one(int vary, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta,
                   void* C, int64_t ldc, GemmType c_type, cudaStream_t st);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zaya::cuda
