// The CPU side of the op-test registry (op_registry.h, cases in op_cases.cpp): every case's fp32
// CPU op against its double-precision reference, and its backward against finite differences of
// the reference (relative L2 errors; routing choices exactly). The GPU test binary runs the CUDA
// variants of the same cases (tests/gpu/test_cuda_ops_registry.cpp). Targeted checks that do not
// fit the table (dtype widening, error messages, decoding, conv history) are in
// test_cpu_ops_special.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "op_registry.h"

namespace zaya::op_test {
namespace {

class CpuOpsRegistry : public ::testing::TestWithParam<size_t> {};

TEST_P(CpuOpsRegistry, MatchesReference) {
  const OpCase& c = registry()[GetParam()];
  for (const std::string& f : check_case(c)) ADD_FAILURE() << c.name << ": " << f;
}

INSTANTIATE_TEST_SUITE_P(CpuOps, CpuOpsRegistry, ::testing::Range<size_t>(0, registry().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return registry()[i.param].name;
                         });

// Every op of ops.h has an entry, and every backward in the header is exercised by some case.
TEST(CpuOpsRegistryMeta, CoversEveryOp) {
  const std::vector<std::pair<std::string, bool>> ops = {
      {"linear_", true},         {"embedding_", true},     {"rmsnorm_", true},
      {"residual_scale_", true}, {"affine_", false},       {"gelu_", true},
      {"swiglu_", true},         {"cross_entropy_", true}, {"cca_mean_skip_", false},
      {"cca_conv_", true},       {"qk_norm_", true},       {"rope_", true},
      {"attention_", true},      {"router_select_", false}};
  for (const auto& [prefix, has_backward] : ops) {
    bool fwd = false, bwd = false;
    for (const OpCase& c : registry())
      if (c.name.rfind(prefix, 0) == 0) fwd = true, bwd = bwd || bool(c.backward);
    EXPECT_TRUE(fwd) << prefix;
    EXPECT_EQ(bwd, has_backward) << prefix;
  }
}

// The driver must catch what it is meant to catch: a slightly wrong forward, a backward that
// accumulates where it should overwrite, and one that overwrites where it should accumulate.
TEST(CpuOpsRegistryMeta, DriverCatchesBrokenOps) {
  const Cases& cs = registry();
  auto find = [&](const std::string& prefix) {
    for (const OpCase& c : cs)
      if (c.name.rfind(prefix, 0) == 0) return c;
    ADD_FAILURE() << prefix;
    return OpCase{};
  };
  OpCase gelu = find("gelu_");
  EXPECT_TRUE(check_case(gelu).empty());
  OpCase wrong_fwd = gelu;  // tanh approximation instead of the exact erf GELU
  wrong_fwd.op = [n = gelu.in[0].data.size()](const Bufs& in) {
    Buf y(n);
    for (size_t i = 0; i < n; i++) {
      const float x = in[0][i];
      y[i] = 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
    return Bufs{y};
  };
  EXPECT_FALSE(check_case(wrong_fwd).empty());
  OpCase acc_instead = gelu;  // claims (=) but adds to the buffer
  acc_instead.backward = [bw = gelu.backward](const Bufs& in, const Bufs& dy, Bufs& g) {
    Buf prior = g[0];
    bw(in, dy, g);
    for (size_t i = 0; i < prior.size(); i++) g[0][i] += prior[i];
  };
  EXPECT_FALSE(check_case(acc_instead).empty());
  OpCase rms = find("rmsnorm_");
  EXPECT_TRUE(check_case(rms).empty());
  rms.in[1].grad = Grad::Overwrite;  // dw is (+=) in the header: reading it as (=) must fail
  EXPECT_FALSE(check_case(rms).empty());
}

// The bf16 rule accepts what one bf16 rounding of the exact result does and rejects an error of a
// few bf16 steps, a non-finite value and a size mismatch; exact comparison rejects any difference.
TEST(OpRegistryRules, Bf16RuleAndExactComparison) {
  Rng r(7);
  const Buf x = randn(r, 500, 3.0f);
  const DBuf ref(x.begin(), x.end());
  const DBuf naive = rounded_bf16(x);
  Buf got(x.size());
  for (size_t i = 0; i < x.size(); i++) got[i] = round_bf16(x[i]);
  EXPECT_FALSE(bf16_failure("one rounding", got, ref, naive));
  Buf off = got;
  for (size_t i = 0; i < off.size(); i++) off[i] = x[i] * (1.0f + 1.0f / 32);  // ~4 bf16 steps
  EXPECT_TRUE(bf16_failure("four steps", off, ref, naive));
  Buf nan = got;
  nan[3] = std::nanf("");
  EXPECT_TRUE(bf16_failure("nan", nan, ref, naive));
  EXPECT_TRUE(bf16_failure("size", Buf(got.begin(), got.end() - 1), ref, naive));
  EXPECT_FALSE(exact_failure("same", got, naive));
  Buf moved = got;
  moved[10] = std::nextafter(moved[10], 1e9f);
  EXPECT_TRUE(exact_failure("one ulp", moved, naive));
}

}  // namespace
}  // namespace zaya::op_test
