// The roofline cost model against hand-computed times: single ops, the whole training step's
// FLOPs, data-parallel communication time, gradient accumulation, and decode bytes (the bf16 active
// weights plus the KV cache streamed per token).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/config.h"
#include "sizing/cost_model.h"

using namespace zaya;
using namespace zaya::sizing;

TEST(SizingCost, RooflinePerOp) {
  const HardwareProfile h = builtin_hardware("h200");
  bool cb = false;
  // 1 TFLOP and 1 GB: compute-bound, 1e12 / 989.4e12 s.
  EXPECT_DOUBLE_EQ(roofline_seconds(h, OpKind::Gemm, 1e12, 1e9, 1000, &cb), 1e12 / 989.4e12);
  EXPECT_TRUE(cb);
  // 1 GFLOP and 1 GB: memory-bound, 1e9 / 4.8e12 s.
  EXPECT_DOUBLE_EQ(roofline_seconds(h, OpKind::Memory, 1e9, 1e9, 0, &cb), 1e9 / 4.8e12);
  EXPECT_FALSE(cb);
  // A measured table replaces the peak for GEMMs only.
  HardwareProfile m = h;
  m.gemm.push_back({4096, 4096, 4096, "bf16", 700, 0});
  EXPECT_DOUBLE_EQ(roofline_seconds(m, OpKind::Gemm, 1e12, 1e9, 1000), 1e12 / 700e12);
  EXPECT_DOUBLE_EQ(roofline_seconds(m, OpKind::Attention, 1e12, 1e9, 0), 1e12 / 989.4e12);
}

TEST(SizingCost, TrainingStepFlopsAndTime) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const HardwareProfile h = builtin_hardware("h200");
  TrainSetup s;
  s.micro_batch = 2, s.seq = 4096, s.ranks = 8;
  const TrainEstimate e = estimate_training(c, h, s);
  double f = 0, t = 0;
  for (auto& o : e.ops) {
    // Attention executes 1 + 2.5 forwards (FlashAttention's backward count); model FLOPs count 3.
    if (o.kind == OpKind::Attention) f += o.flops * 3.0 / 3.5;
    if (o.kind == OpKind::Gemm || o.name == "cca_conv") f += o.flops;
    t += o.seconds;
  }
  // Forward + backward FLOPs of the model ops = tokens × (6N + attention).
  EXPECT_NEAR(f, 8192 * train_flops_per_token(c, 4096), 1e-6 * f);
  EXPECT_DOUBLE_EQ(t, e.microbatch_s);
  EXPECT_GE(e.microbatch_s, f / 989.4e12);  // never faster than the peak
  EXPECT_EQ(e.accumulation, 1);
  EXPECT_DOUBLE_EQ(e.model_flops_per_token, train_flops_per_token(c, 4096));
  // Communication: reduce-scatter of fp32 grads and all-gather of bf16 weights over NVSwitch.
  const double P = 8840488784.0;
  EXPECT_NEAR(e.reduce_scatter_s, 4 * P * 7 / 8 / 450e9, 1e-12);
  EXPECT_NEAR(e.all_gather_s, 2 * P * 7 / 8 / 450e9, 1e-12);
  EXPECT_NEAR(e.step_s, e.compute_s + e.reduce_scatter_s + e.all_gather_s + e.optimizer_s, 1e-12);
  EXPECT_LE(e.step_s_overlapped, e.step_s);
  EXPECT_NEAR(e.tokens_per_s, 16 * 4096 / e.step_s, 1e-6);
  EXPECT_NEAR(e.mfu, e.model_flops_per_token * e.tokens_per_s / (8 * 989.4e12), 1e-12);
  EXPECT_LT(e.mfu, 1.0);
  // bf16 reduce-scatter halves its time.
  s.grad_comm_bytes = 2;
  EXPECT_NEAR(estimate_training(c, h, s).reduce_scatter_s, e.reduce_scatter_s / 2, 1e-12);
}

TEST(SizingCost, AccumulationRecomputeAndScaleOut) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const HardwareProfile h = builtin_hardware("mi300x");
  TrainSetup s;
  s.micro_batch = 4, s.seq = 4096, s.ranks = 8;
  const TrainEstimate one = estimate_training(c, h, s);
  s.global_batch = 64;  // 2 micro-batches per rank
  const TrainEstimate two = estimate_training(c, h, s);
  EXPECT_EQ(two.accumulation, 2);
  EXPECT_DOUBLE_EQ(two.compute_s, 2 * one.microbatch_s);
  EXPECT_DOUBLE_EQ(two.reduce_scatter_s, one.reduce_scatter_s);  // once per step
  // Recomputation adds one forward of the decoder layers: between 1.0× and 4/3× the time.
  s.global_batch = 0;
  s.recompute = true;
  const TrainEstimate rc = estimate_training(c, h, s);
  EXPECT_GT(rc.microbatch_s, one.microbatch_s);
  EXPECT_LT(rc.microbatch_s, one.microbatch_s * 4 / 3 + 1e-12);
  // ZAYA1's layout: 1024 MI300X; across nodes the 400 Gb/s NIC (50 GB/s) limits.
  s.recompute = false;
  s.ranks = 1024;
  const TrainEstimate big = estimate_training(c, h, s);
  EXPECT_DOUBLE_EQ(big.all_gather_busbw, 50e9);
  EXPECT_NEAR(big.all_gather_s, 2 * 8840488784.0 * 1023 / 1024 / 50e9, 1e-9);
}

TEST(SizingCost, DecodeStreamsActiveWeightsAndCache) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const HardwareProfile h = builtin_hardware("h200");
  // Batch 1, empty cache: bf16 bytes of every weight a token multiplies (1,289,762,816 incl. the
  // tied head), memory-bound: 2.58 GB / 4.8 TB/s = 0.537 ms.
  InferenceEstimate r = estimate_inference(c, h, 512, 0, 1);
  EXPECT_DOUBLE_EQ(r.decode_bytes, 2.0 * 1289762816);
  EXPECT_NEAR(r.decode_s_per_token, 2.0 * 1289762816 / 4.8e12, 1e-12);
  EXPECT_DOUBLE_EQ(r.decode_experts_touched, 1);
  // A 4096-token cache adds 40 KiB per cached token.
  r = estimate_inference(c, h, 512, 4096, 1);
  EXPECT_DOUBLE_EQ(r.decode_bytes, 2.0 * 1289762816 + 4096.0 * 40960);
  // Batch 16 touches 16·(1 − (15/16)^16) ≈ 10.3 experts per layer.
  r = estimate_inference(c, h, 512, 0, 16);
  const double touched = 16 * (1 - std::pow(15.0 / 16, 16));
  EXPECT_NEAR(r.decode_experts_touched, touched, 1e-12);
  EXPECT_NEAR(r.decode_bytes, 2.0 * 1289762816 + 2.0 * 40 * (touched - 1) * 3 * 2048 * 2048, 1);
  EXPECT_NEAR(r.decode_tokens_per_s, 16 / r.decode_s_per_token, 1e-9);
  // Prefill can be no faster than its FLOPs at peak.
  EXPECT_GT(r.prefill_s, 16 * 512 * 2.0 * 1289762816 / 989.4e12);
  EXPECT_THROW(estimate_inference(c, h, 0, 0, 1), Error);
}

TEST(SizingCost, Zaya1OnMeasuredH200) {
  // With the measured ceilings (790 TFLOP/s, 4.2 TB/s copy) one micro-batch of 16K tokens must
  // run below the pure-compute bound 790e12 / 8.745e9 = 90.3K tokens/s and above half of it (the
  // model is compute-dominated at this size).
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const HardwareProfile h =
      load_hardware(std::string(ZAYA_SOURCE_DIR) + "/tests/sizing/h200_measured.json");
  TrainSetup s;
  s.micro_batch = 4, s.seq = 4096, s.ranks = 1;
  const TrainEstimate e = estimate_training(c, h, s);
  const double bound = 790e12 / train_flops_per_token(c, 4096);
  EXPECT_LT(16384 / e.compute_s, bound);
  EXPECT_GT(16384 / e.compute_s, 0.5 * bound);
  EXPECT_DOUBLE_EQ(e.reduce_scatter_s, 0);
  // On one rank Muon's Newton–Schulz runs on every matrix: the expert matrices alone are
  // 40 · 48 · 5 · (4 + 2) · 2048³ FLOPs, at most 790 TFLOP/s.
  EXPECT_GT(e.optimizer_s, 40.0 * 48 * 30 * 2048.0 * 2048 * 2048 / 790e12);
  // AdamW is purely elementwise: (18 + 16) bytes per parameter (the gradient norm's read
  // included), at the 4.2 TB/s copy rate on the roofline; calibrated, at the built-in H200's
  // default optimizer efficiency (0.8 of the 4.8 TB/s datasheet, kept as an absolute rate when the
  // measured profile replaces the copy bandwidth).
  s.optimizer = OptimizerKind::AdamW;
  EXPECT_NEAR(estimate_training(c, h.roofline(), s).optimizer_s, 34 * 8840488784.0 / 4.2e12, 1e-12);
  EXPECT_NEAR(estimate_training(c, h, s).optimizer_s, 34 * 8840488784.0 / (0.8 * 4.8e12), 1e-12);
}
