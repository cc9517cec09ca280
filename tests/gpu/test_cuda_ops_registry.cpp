// The CUDA side of the op-test registry (tests/backend/op_registry.h, cases in
// tests/backend/op_cases.cpp, compiled into this binary with ZAYA_OP_TESTS_CUDA): every CUDA
// variant of every case, its outputs against the case's double reference and its gradients against
// the CPU op's backward, by the registry's rules (fp32 bound, the bf16 rule, exact equality for
// routing decisions), and, where the variant says so, a bit-identical repeated backward. One
// GoogleTest case per (case, variant); label gpu, skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
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

// Every case of an op family with a CUDA kernel carries its variant, so that a new shape cannot
// silently run on the CPU only. The families and which of their cases the kernels cover; a case
// whose name starts with none of these prefixes belongs to an op without a standalone CUDA kernel
// (linear: the GEMM library, tests/gpu/test_cuda_gemm.cpp; cca_mean_skip, qk_norm, rope: fused into
// cca_qkv_finish, tested with the CCA pipeline in tests/gpu/test_cuda_cca.cpp).
struct CudaFamily {
  const char* prefix;
  std::function<bool(const std::string&)> covered;  // null: every case of the family
};
const std::vector<CudaFamily>& cuda_families() {
  static const std::vector<CudaFamily> f = {
      {"embedding_bf16_", nullptr},  // the CUDA table is bf16
      {"rmsnorm_", nullptr},
      {"residual_scale_", nullptr},
      {"affine_", nullptr},
      {"gelu_", nullptr},
      {"bias_gelu_", nullptr},
      {"swiglu_", nullptr},
      {"cross_entropy_", nullptr},
      {"router_select_", nullptr},
      {"cca_conv_",
       [](const std::string& n) {  // head dims that are multiples of 32
         const size_t p = n.find("_d");
         return p != std::string::npos && std::stoi(n.substr(p + 2)) % 32 == 0;
       }},
      {"attention_",
       [](const std::string& n) {  // the head dims attention_fwd/bwd support
         return n.find("_d32_") != std::string::npos || n.find("_d64_") != std::string::npos ||
                n.find("_d128_") != std::string::npos;
       }},
  };
  return f;
}

TEST(CudaOpsRegistryMeta, CasesOfCudaOpsCarryTheirVariant) {
  std::vector<size_t> per_family(cuda_families().size(), 0);
  for (const OpCase& c : registry())
    for (size_t k = 0; k < cuda_families().size(); k++) {
      const CudaFamily& f = cuda_families()[k];
      if (c.name.rfind(f.prefix, 0) != 0 || (f.covered && !f.covered(c.name))) continue;
      EXPECT_FALSE(c.cuda.empty()) << c.name << " has no CUDA variant";
      per_family[k] += c.cuda.size();
    }
  for (size_t k = 0; k < cuda_families().size(); k++)
    EXPECT_GT(per_family[k], size_t(0)) << cuda_families()[k].prefix << ": no case runs on CUDA";
  EXPECT_GE(variants().size(), size_t(100));
}

}  // namespace
}  // namespace zaya::op_test
