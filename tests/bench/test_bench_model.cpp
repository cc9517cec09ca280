// bench::random_model: the benchmark weights are deterministic in the seed, normal with the
// configured spread (the embedding and experts at 0.02, the experts' down projection at
// 0.02/sqrt(2L)), every layer its own storage, and the shapes of the full config.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/bench_model.h"

namespace zaya::bench {
namespace {

struct Moments {
  double mean = 0, sd = 0, kurt = 0;
};

Moments moments(const Tensor& t) {
  const float* p = t.f32();
  const int64_t n = t.numel();
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) s += p[i];
  Moments m;
  m.mean = s / double(n);
  double s4 = 0;
  for (int64_t i = 0; i < n; i++) {
    const double d = p[i] - m.mean;
    s2 += d * d, s4 += d * d * d * d;
  }
  m.sd = std::sqrt(s2 / double(n));
  m.kurt = s4 / double(n) / (m.sd * m.sd * m.sd * m.sd);
  return m;
}

TEST(BenchModel, RandomWeightsAreNormalDeterministicAndPerLayer) {
  ZayaConfig cfg = ZayaConfig::preset("tiny");
  cfg.num_hidden_layers = 3;
  if (!cfg.layer_types.empty()) cfg.layer_types.resize(3);
  const ZayaModel a = random_model(cfg, 11), b = random_model(cfg, 11), c = random_model(cfg, 12);
  ASSERT_EQ(a.embed.shape(), (std::vector<int64_t>{cfg.vocab_size, cfg.hidden_size}));
  ASSERT_EQ(a.layers.size(), 3u);
  const int64_t n = a.embed.numel();
  EXPECT_TRUE(std::equal(a.embed.f32(), a.embed.f32() + n, b.embed.f32())) << "same seed";
  EXPECT_FALSE(std::equal(a.embed.f32(), a.embed.f32() + n, c.embed.f32())) << "other seed";
  // Normal(0, 0.02): mean within 4 standard errors, spread within 1%, kurtosis near 3.
  const Moments e = moments(a.embed);
  EXPECT_LT(std::fabs(e.mean), 4 * 0.02 / std::sqrt(double(n)));
  EXPECT_NEAR(e.sd, 0.02, 0.0002);
  EXPECT_NEAR(e.kurt, 3.0, 0.1);
  const double down_sd = 0.02 / std::sqrt(2.0 * 3);
  for (size_t l = 0; l < 3; l++) {
    const auto& w = a.layers[l];
    ASSERT_EQ(
        w.experts_gate_up.shape(),
        (std::vector<int64_t>{cfg.num_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size}));
    EXPECT_NEAR(moments(w.experts_gate_up).sd, 0.02, 0.0004) << "layer " << l;
    EXPECT_NEAR(moments(w.experts_down).sd, down_sd, 0.02 * down_sd) << "layer " << l;
    if (l > 0)  // each layer draws its own experts
      EXPECT_FALSE(std::equal(w.experts_gate_up.f32(), w.experts_gate_up.f32() + 64,
                              a.layers[l - 1].experts_gate_up.f32()));
  }
}

}  // namespace
}  // namespace zaya::bench
