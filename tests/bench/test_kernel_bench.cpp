// `zaya bench kernels` without a device: from kernel timings to the cost model's efficiency rows
// (attention as FlashAttention-counted TFLOP/s, memory classes on the cost model's bytes), the
// profile update merged by (class, shape), and the result readable by `zaya size`.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/kernel_bench.h"
#include "bench/profile.h"
#include "core/error.h"
#include "sizing/cost_model.h"
#include "sizing/model_shape.h"

using namespace zaya;
using namespace zaya::bench;
using sizing::KernelClass;

namespace {

KernelTiming timing(const char* name, KernelClass c, double us, double flops, double per = 1) {
  KernelTiming t;
  t.name = name;
  t.cls = c;
  t.shape = "s";
  t.us = us;
  t.flops = flops;
  t.per_instance = per;
  return t;
}

const sizing::KernelMeasurement* find(const std::vector<sizing::KernelMeasurement>& v,
                                      KernelClass c) {
  for (const auto& k : v)
    if (k.cls == c) return &k;
  return nullptr;
}

}  // namespace

TEST(KernelBench, EfficienciesFromTimings) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const double F = 4.0 * 16384 * 2048 * 8 * 128;  // B4 S4096 Hq8 d128 causal: 137.4 GFLOP
  std::vector<KernelTiming> rows = {
      timing("attention_fwd", KernelClass::AttentionFwd, 689, F),
      timing("attention_bwd", KernelClass::AttentionBwd, 2022, 2.5 * F),
      timing("cca_conv_fwd", KernelClass::Cca, 628, 0),
      timing("cca_qkv_finish_fwd", KernelClass::Cca, 218, 0),
      timing("cca_qkv_finish_bwd", KernelClass::Cca, 494, 0),
      timing("cca_conv_bwd", KernelClass::Cca, 1236, 0),
      timing("residual_scale_rmsnorm_fwd", KernelClass::NormResidual, 100, 0, 2),
      timing("adamw_step", KernelClass::Optimizer, 1000, 0)};
  const auto eff = kernel_efficiencies(c, 4, 4096, rows, 1 << 20, 989.4, 4280);
  const auto* af = find(eff, KernelClass::AttentionFwd);
  ASSERT_NE(af, nullptr);
  EXPECT_NEAR(af->rate, 199.5, 0.1);  // the GPU test's 199.4 TFLOP/s at 0.689 ms
  EXPECT_NEAR(af->work, F * 1e-9, 1e-9);
  EXPECT_NEAR(af->fraction, af->rate / 989.4, 1e-12);
  const auto* ab = find(eff, KernelClass::AttentionBwd);
  ASSERT_NE(ab, nullptr);
  EXPECT_NEAR(ab->rate, 169.9, 0.1);
  // CCA: the cost model's CCA bytes per layer (conv 8·T·C + QK-norm/RoPE 4·T·C, forward, times 3
  // with the backward) over the four kernels' 2.576 ms.
  const double T = 16384, C = 1280;
  const auto* cca = find(eff, KernelClass::Cca);
  ASSERT_NE(cca, nullptr);
  EXPECT_NEAR(cca->work, 3 * 12 * T * C * 1e-9, 1e-9);
  EXPECT_NEAR(cca->rate, cca->work / 2.576e-3, 1e-6);
  EXPECT_NEAR(cca->fraction, cca->rate / 4280, 1e-12);
  // Norms: two launches per layer; the cost model's 32·T·D forward bytes, times 3.
  const auto* nr = find(eff, KernelClass::NormResidual);
  ASSERT_NE(nr, nullptr);
  EXPECT_NEAR(nr->work, 3 * 32 * T * 2048 * 1e-9, 1e-9);
  EXPECT_NEAR(nr->rate, nr->work / 200e-6, 1e-6);
  EXPECT_DOUBLE_EQ(nr->fraction, 1.0);  // faster than the copy: capped
  // Optimizer: 34 bytes per parameter (AdamW with the gradient norm).
  const auto* op = find(eff, KernelClass::Optimizer);
  ASSERT_NE(op, nullptr);
  EXPECT_NEAR(op->work, 34.0 * (1 << 20) * 1e-9, 1e-12);
  // Classes without timings give no row.
  EXPECT_EQ(find(eff, KernelClass::Loss), nullptr);
  EXPECT_EQ(find(eff, KernelClass::Elementwise), nullptr);
  EXPECT_THROW(kernel_efficiencies(c, 4, 4096, rows, 1, 0, 4280), Error);
  EXPECT_FALSE(kernel_table(rows, 989.4, 4280).empty());
  EXPECT_FALSE(efficiency_table(eff).empty());
}

TEST(KernelBench, ProfileMergeAndReadBack) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const double F = 4.0 * 16384 * 2048 * 8 * 128;
  DeviceInfo dev;
  dev.name = "NVIDIA H200";
  dev.sm_count = 132;
  dev.global_bytes = int64_t(141) << 30;
  auto eff = kernel_efficiencies(c, 4, 4096,
                                 {timing("attention_fwd", KernelClass::AttentionFwd, 689, F),
                                  timing("cca_conv_fwd", KernelClass::Cca, 2576, 0)},
                                 1 << 20, 989.4, 4280);
  // An existing measured profile (GEMM and copy rows) gains the kernel rows.
  nlohmann::json prof = {
      {"schema", "zaya.hardware/1"},
      {"device", "NVIDIA H200"},
      {"copy_bandwidth_gbs", 4280},
      {"gemm_efficiency",
       {{{"m", 4096}, {"n", 4096}, {"k", 4096}, {"dtype", "bf16"}, {"tflops", 700}}}}};
  merge_profile(prof, profile_from_kernels(eff, dev));
  ASSERT_EQ(prof["kernel_efficiency"].size(), 2u);
  // Re-measured: the same (class, shape) replaces its row, a new shape is added.
  eff[0].rate = 250;
  auto other = eff[0];
  other.shape = "B1 S8192";
  other.work = 2 * eff[0].work;
  merge_profile(prof, profile_from_kernels({eff[0], other}, dev));
  ASSERT_EQ(prof["kernel_efficiency"].size(), 3u);
  EXPECT_DOUBLE_EQ(prof["kernel_efficiency"][0]["tflops"].get<double>(), 250);
  EXPECT_EQ(prof["gemm_efficiency"].size(), 1u);  // untouched
  const auto h = sizing::hardware_from_json(prof, "merged.json");
  EXPECT_DOUBLE_EQ(h.kernel_rate(KernelClass::AttentionFwd, F * 1e-9), 250e12);
  EXPECT_NEAR(h.kernel_rate(KernelClass::Cca, 1), eff[1].rate * 1e9, 1e-3);
  EXPECT_DOUBLE_EQ(h.gemm_flops_per_s(137), 700e12);
}
