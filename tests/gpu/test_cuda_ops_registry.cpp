// The CUDA side of the op-test registry (tests/backend/op_registry.h, cases in
// tests/backend/op_cases.cpp, compiled into this binary with ZAYA_OP_TESTS_CUDA): every CUDA
// variant of every case, its outputs against the case's double reference and its gradients against
// the CPU op's backward, by the registry's rules (fp32 bound, the bf16 rule, exact equality for
// routing decisions), and, where the variant says so, a bit-identical repeated backward. One
// GoogleTest case per (case, variant); label gpu, skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../backend/op_registry.h"
#include "gpu_test_util.h"

namespace zaya::op_test {
namespace {

// (case index, variant index) of every CUDA variant in the table.
const std::vector<std::pair<size_t, size_t>>& variants() {
  static const std::vector<std::pair<size_t, size_t>> v = [] {
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t c = 0; c < registry().size(); c++)
      for (size_t k = 0; k < registry()[c].cuda.size(); k++) out.emplace_back(c, k);
    return out;
  }();
  return v;
}

class CudaOpsRegistry : public ::testing::TestWithParam<std::pair<size_t, size_t>> {};

TEST_P(CudaOpsRegistry, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const OpCase& c = registry()[GetParam().first];
  for (const std::string& f : check_cuda(c, c.cuda[GetParam().second])) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(CudaOps, CudaOpsRegistry, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<std::pair<size_t, size_t>>& i) {
                           const OpCase& c = registry()[i.param.first];
                           const std::string& v = c.cuda[i.param.second].name;
                           return v.empty() ? c.name : c.name + "_" + v;
                         });

// Every case of an op with a CUDA counterpart carries a variant (attention: the head dims the
// kernel supports), so a new shape cannot silently run on the CPU only.
TEST(CudaOpsRegistryMeta, CasesOfCudaOpsCarryTheirVariant) {
  for (const OpCase& c : registry()) {
    const bool swiglu = c.name.rfind("swiglu_", 0) == 0;
    const bool attention =
        c.name.rfind("attention_", 0) == 0 &&
        (c.name.find("_d32_") != std::string::npos || c.name.find("_d64_") != std::string::npos ||
         c.name.find("_d128_") != std::string::npos);
    if (swiglu || attention) EXPECT_FALSE(c.cuda.empty()) << c.name;
  }
  EXPECT_GE(variants().size(), size_t(60));
}

}  // namespace
}  // namespace zaya::op_test
