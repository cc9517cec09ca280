// A wider cuBLASLt algorithm search than the heuristic's ranked list, shared by the CUDA backend's
// opt-in GEMM autotune (gemm_cuda.cpp, ZAYA_GEMM_SEARCH_ALGOS) and `zaya bench gemm
// --search-algos`. CUDA builds only.
//
// cublasLtMatmulAlgoGetHeuristic in its default mode returns a few configurations of the algorithm
// ids it ranks first; on some shapes none of them is the fastest (on the H200, 7168² × 4096 bf16:
// 731 TFLOP/s for the best of the heuristic's 32 against 800 for a configuration of another id,
// docs/bench/h200-2026-12-03e). Asking the heuristic once per algorithm id
// (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID) for that id's best configurations (tile, stages, split-K,
// cluster, under the preference's constraints) gives candidates from every id; timing picks.
#pragma once
#include <cublasLt.h>

#include <cstddef>
#include <vector>

namespace zaya::cuda {

// Appends to `cands`, for every algorithm id cuBLASLt has for A/B of type `ab` and C/D of type `cd`
// with fp32 compute and scale (cublasLtMatmulAlgoGetIds), the heuristic's best `per_id`
// configurations of that id under `pref` (its workspace, reduction-scheme and alignment limits),
// keeping those that succeed, need at most `ws_bytes` of workspace and are not already in `cands`.
// `pref`'s search mode is set for these queries and set back to CUBLASLT_SEARCH_BEST_FIT after.
// Returns how many were added; ids the library refuses are skipped.
int add_per_algo_id_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t c, cublasLtMatmulPreference_t pref,
                               cudaDataType_t ab, cudaDataType_t cd, int per_id, size_t ws_bytes,
                               std::vector<cublasLtMatmulHeuristicResult_t>& cands);

}  // namespace zaya::cuda
