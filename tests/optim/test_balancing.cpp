// The aux-loss-free balancing-bias update against an AdamW reference written here.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/balancing.h"
#include "optim_test_util.h"

using namespace zaya;
using namespace zaya::testing;

TEST(OptimBalancing, MovesBiasesTowardUnderUsedExperts) {
  Tensor b0 = Tensor::zeros({5}), b1 = Tensor::zeros({5});
  init_balancing_biases(b0);
  init_balancing_biases(b1);
  EXPECT_EQ(b0.f32()[4], -1.0f);
  EXPECT_EQ(b0.f32()[0], 0.0f);
  std::vector<ParamRef> params = {
      {"model.layers.0.mlp.gate.balancing_biases", b0, Tensor()},
      {"model.layers.0.self_attn.o_proj.weight", Tensor::zeros({2, 2}), Tensor::zeros({2, 2})},
      {"model.layers.1.mlp.gate.balancing_biases", b1, Tensor()}};
  BalancingBiasUpdater up = BalancingBiasUpdater::from_params(params);
  ASSERT_EQ(up.layers(), 2u);
  // Layer 0: expert 0 overloaded, expert 3 starved. Layer 1: perfectly balanced, no skips.
  const std::vector<std::vector<int64_t>> counts = {{70, 20, 10, 0, 20}, {25, 25, 25, 25, 0}};
  // Independent AdamW reference (lr 1e-3, β 0.9/0.999, ε 1e-8) on err = count/total − 1/E.
  std::vector<double> ref(4, 0.0), m(4, 0.0), v(4, 0.0);
  for (int t = 1; t <= 3; t++) {
    up.update(counts);
    for (int e = 0; e < 4; e++) {
      double err = counts[0][e] / 120.0 - 0.25;
      m[e] = 0.9 * m[e] + 0.1 * err;
      v[e] = 0.999 * v[e] + 0.001 * err * err;
      ref[e] -= 1e-3 * (m[e] / (1 - std::pow(0.9, t))) /
                (std::sqrt(v[e] / (1 - std::pow(0.999, t))) + 1e-8);
    }
  }
  for (int e = 0; e < 4; e++) EXPECT_NEAR(b0.f32()[e], ref[e], 1e-7) << e;
  EXPECT_LT(b0.f32()[0], 0.0f);                              // overloaded → lower bias
  EXPECT_GT(b0.f32()[3], 0.0f);                              // starved → higher bias
  EXPECT_EQ(b0.f32()[4], -1.0f);                             // skip bias never changes
  for (int e = 0; e < 4; e++) EXPECT_EQ(b1.f32()[e], 0.0f);  // balanced layer: err = 0
  EXPECT_EQ(up.steps(), 3);
}

TEST(OptimBalancing, StateRoundTripAndBadCounts) {
  Tensor a = Tensor::zeros({4}), b = Tensor::zeros({4});
  init_balancing_biases(a);
  init_balancing_biases(b);
  BalancingBiasUpdater ua({{"l0", a}}), ub({{"l0", b}});
  ua.update({{5, 1, 0, 2}});
  ua.update({{3, 3, 1, 1}});
  std::vector<std::pair<std::string, Tensor>> saved;
  for (auto& [n, t] : ua.state_tensors()) saved.emplace_back(n, t.clone());
  b.copy_from(a);
  ub.load_state(saved, ua.steps());
  ua.update({{1, 2, 7, 0}});
  ub.update({{1, 2, 7, 0}});
  EXPECT_TRUE(bitwise_equal(a, b));
  EXPECT_THROW(ua.update({{1, 2, 3}}), Error);     // wrong class count
  EXPECT_THROW(ua.update({{0, 0, 0, 0}}), Error);  // no tokens
  EXPECT_THROW(ua.update({{1, -1, 3, 0}}), Error);
  EXPECT_THROW(ua.update({}), Error);  // wrong layer count
  EXPECT_THROW(ub.load_state({}, 1), Error);
  EXPECT_THROW(BalancingBiasUpdater({{"x", Tensor::zeros({2, 2})}}), Error);
}
