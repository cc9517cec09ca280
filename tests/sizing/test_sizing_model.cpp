// Parameter counts, FLOPs, activation/optimizer memory and KV-cache sizes of src/sizing/model_shape
// against figures worked out by hand from ZAYA1.md (the §2 tensor table, §1's 8.30B / 754M,
// §3.1's 40 KiB per token) and against ZayaConfig's own independent count.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/config.h"
#include "sizing/model_shape.h"

using namespace zaya;
using namespace zaya::sizing;

namespace {

// Per layer of ZAYA1-base, summed by hand from ZAYA1.md §2:
//   attention matrices q 1024·2048 + k 256·2048 + v_cur/v_del 2·128·2048 + o 2048·1024 = 5,242,880
//   convs 1280·2 + 1280 + 1280·128·2 + 1280 + temp 2 = 332,802
//   norms 2·2048 + residual scales 8·2048 = 20,480
//   router 256·2048 + 256 + 256 (states scale) + 256 (norm) + 2·(65,536 + 256) + 17·256 = 660,992
//   experts 16 · 3 · 2048 · 2048 = 201,326,592
constexpr int64_t kLayer = 5242880 + 332802 + 20480 + 660992 + 201326592;  // 207,583,746
constexpr int64_t kTotal =
    40 * kLayer + 3 * 2048 - 256;  // model vectors; layer 0 has no states scale
constexpr int64_t kActive = kTotal - 40LL * 15 * 3 * 2048 * 2048;
constexpr int64_t kEmbedding = 262272LL * 2048;

}  // namespace

TEST(SizingModel, Zaya1ParameterCountsMatchTheReport) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const ParamCounts p = count_params(c);
  EXPECT_EQ(p.total, kTotal);
  EXPECT_EQ(p.total, 8303355728LL);
  EXPECT_EQ(p.active, kActive);
  EXPECT_EQ(p.embedding, kEmbedding);
  // ZAYA1.md §1: 8.30B without the embedding, 8.84B with it, ≈754M active, ≈1.29B with the head.
  EXPECT_NEAR(double(p.total) / 1e9, 8.30, 0.005);
  EXPECT_NEAR(double(p.total_with_embedding()) / 1e9, 8.84, 0.005);
  EXPECT_NEAR(double(p.active) / 1e6, 754, 0.5);
  EXPECT_NEAR(double(p.active + p.embedding) / 1e9, 1.29, 0.005);
}

TEST(SizingModel, AgreesWithZayaConfigCount) {
  for (const char* name : {"tiny", "zaya1-base", "zaya1-8b"}) {
    const ZayaConfig c = ZayaConfig::preset(name);
    const ParamCounts p = count_params(c);
    EXPECT_EQ(p.total, c.params_total(false)) << name;
    EXPECT_EQ(p.total + p.embedding, c.params_total(true)) << name;
    EXPECT_EQ(p.active, c.params_active(false)) << name;
  }
}

TEST(SizingModel, MatmulParametersAndTrainingFlops) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const ParamCounts p = count_params(c);
  // Per layer: attention matrices 5,242,880, conv kernels 2,560 + 327,680, router matrices
  // 524,288 + 2·65,536 + 4,352, one expert 12,582,912; plus the tied LM head 262,272·2048.
  const int64_t per_layer = 5242880 + 2560 + 327680 + 524288 + 131072 + 4352 + 12582912;
  EXPECT_EQ(p.matmul_active_with_head, 40 * per_layer + kEmbedding);
  // DESIGN.md: 6N + 6·S·Hq·d per layer.
  const double want = 6.0 * double(40 * per_layer + kEmbedding) + 40.0 * 6 * 4096 * 8 * 128;
  EXPECT_DOUBLE_EQ(train_flops_per_token(c, 4096), want);
  EXPECT_NEAR(want, 8.745e9, 0.001e9);
}

TEST(SizingModel, ForwardOpsSumToTheModelFlops) {
  // Every weight multiplies once per token (2 FLOPs) and attention costs 4·keys·Hq·d forward:
  // the GEMM, attention and conv ops of a micro-batch must add up to a third of 6N + attention.
  ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const int64_t T = 2 * 4096;
  double f = 0;
  for (const Op& o : forward_ops(c, T, 4096))
    if (o.kind != OpKind::Memory || o.name == "cca_conv") f += o.total_flops();
  EXPECT_NEAR(3 * f / double(T), train_flops_per_token(c, 4096), 1e-6 * f);
  // Top-2 doubles the expert term.
  c.num_experts_per_tok = 2;
  const double delta = train_flops_per_token(c, 4096) -
                       train_flops_per_token(ZayaConfig::preset("zaya1-base"), 4096);
  EXPECT_DOUBLE_EQ(delta, 6.0 * 40 * 3 * 2048 * 2048);
}

TEST(SizingModel, SlidingWindowKeys) {
  EXPECT_DOUBLE_EQ(mean_keys(4096, 0), 2048);
  EXPECT_DOUBLE_EQ(mean_keys(8, 4), (1 + 2 + 3 + 4 + 4 + 4 + 4 + 4) / 8.0);
  EXPECT_DOUBLE_EQ(mean_keys(8, 8), 4);  // a window as long as the sequence is full attention
  ZayaConfig c = ZayaConfig::preset("zaya1-base");
  c.sliding_window = 1024;
  c.layer_types.assign(40, "hybrid");
  for (int i = 0; i < 40; i += 2) c.layer_types[size_t(i)] = "hybrid_sliding";
  const double full = train_flops_per_token(ZayaConfig::preset("zaya1-base"), 8192);
  const double keys_sliding = (1024.0 * 1025 / 2 + (8192.0 - 1024) * 1024) / 8192;
  EXPECT_NEAR(full - train_flops_per_token(c, 8192), 20 * 12 * (4096 - keys_sliding) * 1024, 1);
}

TEST(SizingModel, KvCacheCcaVersusMha) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  EXPECT_EQ(kv_bytes_per_token(c), 40 * 1024);          // ZAYA1.md §3.1: 40 KiB per token
  EXPECT_EQ(mha_kv_bytes_per_token(c), 8 * 40 * 1024);  // 8× less than 16-head MHA
}

TEST(SizingModel, ExpertsTouched) {
  EXPECT_DOUBLE_EQ(experts_touched(16, 1, 1), 1);
  EXPECT_DOUBLE_EQ(experts_touched(16, 2, 1), 2);
  EXPECT_NEAR(experts_touched(16, 1, 16), 16 * (1 - std::pow(15.0 / 16, 16)), 1e-12);
  EXPECT_NEAR(experts_touched(16, 1, 100000), 16, 1e-9);
}

TEST(SizingModel, ActivationBytes) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  // Attention: 4D + 4 + 2D + 8C + 2·256 + 2·1024 + 4·8 + 2D = 29,220 (D 2048, C 1280).
  // MoE: 4D + 4 + 2D + router (10R + 8·17 = 2,696) + (2D + 6I + 2D = 20,480) + 2D = 39,564.
  EXPECT_EQ(activation_bytes_per_token_layer(c), 29220 + 39564);
  EXPECT_EQ(head_activation_bytes_per_token(c), 6 * 2048 + 8 + 2 * 262272);
  const double T = 4096;
  EXPECT_DOUBLE_EQ(activation_bytes(c, 4096, false), T * (40 * 68784.0 + 536840));
  EXPECT_DOUBLE_EQ(activation_bytes(c, 4096, true), T * (40 * 8192.0 + 68784 + 536840));
}

TEST(SizingModel, Zero1Memory) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const double P = double(kTotal + kEmbedding);
  // Muon matrices: attention 5,242,880 + router 659,712 + experts 201,326,592 per layer.
  const double M = 40.0 * (5242880 + 659712 + 201326592);
  const MemoryPlan a = memory_plan(c, 8, 4096, OptimizerKind::AdamW, 4);
  EXPECT_DOUBLE_EQ(a.weights, 2 * P);
  EXPECT_DOUBLE_EQ(a.grads, 4 * P);
  EXPECT_DOUBLE_EQ(a.master, 4 * P / 8);
  EXPECT_DOUBLE_EQ(a.optimizer, 8 * P / 8);
  const MemoryPlan m = memory_plan(c, 1024, 4096, OptimizerKind::Muon, 4);
  EXPECT_DOUBLE_EQ(m.optimizer, 4 * (M + 2 * (P - M)) / 1024);
  EXPECT_LT(m.optimizer, a.optimizer);
}

TEST(SizingModel, ImpossibleShapesAreNamed) {
  auto msg = [](ZayaConfig c) {
    try {
      validate_shape(c, "model");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ZayaConfig c = ZayaConfig::preset("zaya1-base");
  c.num_key_value_heads = 3;
  EXPECT_NE(msg(c).find("num_attention_heads (8) must be a multiple of num_key_value_heads (3)"),
            std::string::npos);
  c = ZayaConfig::preset("zaya1-base");
  c.hidden_size = 0;
  EXPECT_NE(msg(c).find("hidden_size must be positive"), std::string::npos);
  c = ZayaConfig::preset("zaya1-base");
  c.num_experts_per_tok = 17;
  EXPECT_NE(msg(c).find("num_experts_per_tok (17) must be at most num_experts (16)"),
            std::string::npos);
  c = ZayaConfig::preset("zaya1-base");
  c.num_key_value_heads = 1, c.num_attention_heads = 1, c.head_dim = 127;
  EXPECT_NE(msg(c).find("must be even"), std::string::npos);
  EXPECT_EQ(msg(ZayaConfig::preset("zaya1-base")), "");
}
