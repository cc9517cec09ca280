// See lt_search.h.
#include <algorithm>
#include <cstring>

#include "backend/cuda/gemm/lt_search.h"

namespace zaya::cuda {

int add_per_algo_id_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t c, cublasLtMatmulPreference_t pref,
                               cudaDataType_t ab, cudaDataType_t cd, int per_id, size_t ws_bytes,
                               std::vector<cublasLtMatmulHeuristicResult_t>& cands) {
  if (per_id <= 0) return 0;
  std::vector<int> ids(256);
  int nids = 0;
  if (cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, cd, cd, int(ids.size()),
                               ids.data(), &nids) != CUBLAS_STATUS_SUCCESS)
    return 0;
  const uint32_t limited = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID, best_fit = CUBLASLT_SEARCH_BEST_FIT;
  if (cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &limited,
                                           sizeof(limited)) != CUBLAS_STATUS_SUCCESS)
    return 0;
  int added = 0;
  for (int i = 0; i < nids; ++i) {
    std::vector<cublasLtMatmulHeuristicResult_t> r(static_cast<size_t>(per_id));
    bool init = true;
    for (auto& x : r)
      init = init && cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, cd, cd,
                                            ids[size_t(i)], &x.algo) == CUBLAS_STATUS_SUCCESS;
    int got = 0;
    if (!init || cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, per_id, r.data(),
                                                &got) != CUBLAS_STATUS_SUCCESS)
      continue;
    for (int j = 0; j < got; ++j) {
      const auto& x = r[size_t(j)];
      if (x.state != CUBLAS_STATUS_SUCCESS || x.workspaceSize > ws_bytes) continue;
      const bool dup = std::any_of(cands.begin(), cands.end(), [&](const auto& e) {
        return std::memcmp(&e.algo, &x.algo, sizeof(x.algo)) == 0;
      });
      if (!dup) cands.push_back(x), ++added;
    }
  }
  (void)cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &best_fit,
                                             sizeof(best_fit));
  return added;
}

}  // namespace zaya::cuda
