// Kernel efficiencies in hardware profiles (sizing/kernel_class.h): the "kernel_efficiency" rows of
// a measured profile (round trip, errors naming the field and the file), interpolation by work,
// the built-in defaults, and the calibrated cost model using them (against the pure roofline).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "sizing/cost_model.h"
#include "sizing_test_util.h"

using namespace zaya;
using namespace zaya::sizing;
using nlohmann::json;

namespace {

using test::error_of;

json h200_with(json rows) {
  return {{"schema", "zaya.hardware/1"},
          {"device", "NVIDIA H200"},
          {"peak_tflops", {{"bf16", 989.4}}},
          {"copy_bandwidth_gbs", 4280},
          {"kernel_efficiency", std::move(rows)}};
}

double seconds_of(const TrainEstimate& e, const std::string& op) {
  for (const auto& o : e.ops)
    if (o.name == op) return o.seconds;
  ADD_FAILURE() << "no op " << op;
  return 0;
}

}  // namespace

TEST(SizingKernels, ClassNames) {
  for (KernelClass c : kKernelClasses) {
    KernelClass back = KernelClass::None;
    ASSERT_TRUE(kernel_class_from_name(kernel_class_name(c), &back)) << kernel_class_name(c);
    EXPECT_EQ(back, c);
  }
  KernelClass x;
  EXPECT_FALSE(kernel_class_from_name("gemm", &x));
  EXPECT_TRUE(kernel_class_is_compute(KernelClass::AttentionBwd));
  EXPECT_FALSE(kernel_class_is_compute(KernelClass::Loss));
}

TEST(SizingKernels, JsonRoundTrip) {
  const json rows = json::array(
      {{{"class", "attention_fwd"},
        {"shape", "B4 S4096"},
        {"work", 137.4},
        {"tflops", 199.4},
        {"fraction", 0.2015}},
       {{"class", "attention_bwd"}, {"shape", "B4 S4096"}, {"work", 343.6}, {"fraction", 0.1717}},
       {{"class", "cca"},
        {"shape", "T16384"},
        {"work", 0.755},
        {"gbs", 293.1},
        {"source", "kbench"}}});
  const HardwareProfile h = hardware_from_json(h200_with(rows), "p.json");
  // Measured classes replace the built-in's defaults; the others keep them.
  int att_f = 0, cca = 0, loss = 0;
  for (const auto& k : h.kernels) {
    att_f += k.cls == KernelClass::AttentionFwd;
    cca += k.cls == KernelClass::Cca;
    loss += k.cls == KernelClass::Loss;
  }
  EXPECT_EQ(att_f, 1);
  EXPECT_EQ(cca, 1);
  EXPECT_EQ(loss, 1);  // the default
  EXPECT_DOUBLE_EQ(h.kernel_rate(KernelClass::AttentionFwd, 137.4), 199.4e12);
  // A row with only a fraction: fraction × this profile's peak.
  EXPECT_NEAR(h.kernel_rate(KernelClass::AttentionBwd, 1), 0.1717 * 989.4e12, 1e3);
  EXPECT_DOUBLE_EQ(h.kernel_rate(KernelClass::Cca, 5), 293.1e9);
  EXPECT_NEAR(h.kernel_fraction(KernelClass::Cca, 5), 293.1 / 4280, 1e-12);
  // Written back as `zaya bench kernels` writes rows, they parse to the same rates.
  json again = json::array();
  for (const auto& k : h.kernels) again.push_back(kernel_measurement_json(k));
  const HardwareProfile h2 = hardware_from_json(h200_with(again), "q.json");
  ASSERT_EQ(h2.kernels.size(), h.kernels.size());
  for (KernelClass c : kKernelClasses)
    EXPECT_DOUBLE_EQ(h2.kernel_rate(c, 3.0), h.kernel_rate(c, 3.0)) << kernel_class_name(c);
  EXPECT_EQ(h2.kernels.back().source, "kbench");
  // The profile's JSON lists them with the fraction in use.
  const json pj = h.to_json();
  ASSERT_TRUE(pj.contains("kernel_efficiency"));
  EXPECT_EQ(pj["kernel_efficiency"].size(), h.kernels.size());
}

TEST(SizingKernels, InterpolatesInLogWorkAndClamps) {
  const json rows = json::array({{{"class", "attention_fwd"}, {"work", 10}, {"tflops", 100}},
                                 {{"class", "attention_fwd"}, {"work", 1000}, {"tflops", 300}},
                                 {{"class", "norm_residual"}, {"work", 0.1}, {"gbs", 1000}},
                                 {{"class", "norm_residual"}, {"work", 10}, {"gbs", 3000}}});
  const HardwareProfile h = hardware_from_json(h200_with(rows), "p.json");
  EXPECT_NEAR(h.kernel_rate(KernelClass::AttentionFwd, 100), 200e12, 1e3);  // log midpoint
  EXPECT_NEAR(h.kernel_rate(KernelClass::AttentionFwd, 1), 100e12, 1e3);    // clamped
  EXPECT_NEAR(h.kernel_rate(KernelClass::AttentionFwd, 1e6), 300e12, 1e3);
  EXPECT_NEAR(h.kernel_rate(KernelClass::NormResidual, 1), 2000e9, 1e-3);
}

TEST(SizingKernels, BuiltinDefaultsAndRoofline) {
  const HardwareProfile h = builtin_hardware("h200");
  // FlashAttention-3 figures (hardware.cpp): 0.60 forward, 0.55 backward of the bf16 peak.
  EXPECT_NEAR(h.kernel_fraction(KernelClass::AttentionFwd, 1), 0.60, 1e-12);
  EXPECT_NEAR(h.kernel_fraction(KernelClass::AttentionBwd, 1), 0.55, 1e-12);
  EXPECT_NEAR(h.kernel_fraction(KernelClass::Optimizer, 1), 0.80, 1e-12);
  const HardwareProfile a = builtin_hardware("a100");
  EXPECT_NEAR(a.kernel_fraction(KernelClass::AttentionFwd, 1), 0.60, 1e-12);
  EXPECT_NEAR(a.kernel_fraction(KernelClass::AttentionBwd, 1), 0.50, 1e-12);
  for (const auto& name : builtin_hardware_names()) {
    const HardwareProfile b = builtin_hardware(name);
    for (KernelClass c : kKernelClasses) {
      const double f = b.kernel_fraction(c, 1);
      EXPECT_GT(f, 0) << name << " " << kernel_class_name(c);
      EXPECT_LT(f, 1) << name << " " << kernel_class_name(c);
    }
    for (const auto& k : b.kernels) EXPECT_FALSE(k.source.empty()) << name;
  }
  // The roofline drops them: every class at the peak or the copy bandwidth.
  const HardwareProfile r = h.roofline();
  EXPECT_TRUE(r.kernels.empty());
  EXPECT_DOUBLE_EQ(r.kernel_rate(KernelClass::AttentionFwd, 1), 989.4e12);
  EXPECT_DOUBLE_EQ(r.kernel_rate(KernelClass::Cca, 1), 4800e9);
  // A measured profile without kernel rows keeps the built-in's absolute default rates, so a
  // measured (lower) copy bandwidth does not compound with the defaults' datasheet fraction.
  const HardwareProfile m = hardware_from_json(
      {{"schema", "zaya.hardware/1"}, {"device", "NVIDIA H200"}, {"copy_bandwidth_gbs", 4280}},
      "old.json");
  EXPECT_DOUBLE_EQ(m.kernel_rate(KernelClass::Loss, 1), 0.8 * 4800e9);
  // An unknown device has no defaults: the roofline unless it measured its kernels.
  const HardwareProfile u = hardware_from_json({{"schema", "zaya.hardware/1"},
                                                {"device", "Some GPU"},
                                                {"sm_count", 100},
                                                {"peak_tflops", {{"bf16", 500}}},
                                                {"hbm_capacity_gib", 64},
                                                {"copy_bandwidth_gbs", 2000}},
                                               "u.json");
  EXPECT_TRUE(u.kernels.empty());
  EXPECT_DOUBLE_EQ(u.kernel_rate(KernelClass::AttentionBwd, 1), 500e12);
}

TEST(SizingKernels, CalibratedPredictionUsesTheEfficiencies) {
  ZayaConfig c = ZayaConfig::preset("zaya1-base");
  TrainSetup s;
  s.micro_batch = 4, s.seq = 4096, s.ranks = 1, s.optimizer = OptimizerKind::AdamW;
  auto with = [&](double att, double mem) {
    json rows = json::array({{{"class", "attention_fwd"}, {"work", 100}, {"fraction", att}},
                             {{"class", "attention_bwd"}, {"work", 100}, {"fraction", att}}});
    for (const char* cl : {"norm_residual", "elementwise", "cca", "loss", "optimizer"})
      rows.push_back({{"class", cl}, {"work", 1}, {"fraction", mem}});
    return estimate_training(c, hardware_from_json(h200_with(rows), "p.json"), s);
  };
  const TrainEstimate full = with(0.4, 0.8), half = with(0.2, 0.4);
  // Attention is compute-bound: halving its efficiency doubles its time; the memory-bound ops
  // likewise with theirs; GEMMs do not move.
  EXPECT_NEAR(seconds_of(half, "attention"), 2 * seconds_of(full, "attention"), 1e-12);
  for (const char* op : {"norms_residual", "swiglu", "cca_conv", "final_norm_loss"})
    EXPECT_NEAR(seconds_of(half, op), 2 * seconds_of(full, op), 1e-12) << op;
  EXPECT_NEAR(half.optimizer_s, 2 * full.optimizer_s, 1e-12);
  EXPECT_DOUBLE_EQ(seconds_of(half, "qkv_proj"), seconds_of(full, "qkv_proj"));
  // Attention time = F / (f·peak) forward + 2.5·F / (f·peak) backward, per layer.
  const double F = 4.0 * 16384 * 2048 * 1024;  // 4·T·(S/2)·Hq·d
  EXPECT_NEAR(seconds_of(full, "attention"), 40 * 3.5 * F / (0.4 * 989.4e12), 1e-9);
  // The roofline is the calibrated model at efficiency 1, and never slower.
  const HardwareProfile h = hardware_from_json(h200_with(json::array()), "p.json");
  const TrainEstimate roof = estimate_training(c, h.roofline(), s);
  const TrainEstimate one = with(1.0, 1.0);
  EXPECT_NEAR(roof.step_s, one.step_s, 1e-12);
  EXPECT_LT(roof.step_s, full.step_s);
  EXPECT_NEAR(seconds_of(roof, "attention"), 40 * 3.5 * F / 989.4e12, 1e-9);
  // Prefill uses the forward efficiencies too.
  const HardwareProfile hf = hardware_from_json(
      h200_with(json::array({{{"class", "attention_fwd"}, {"work", 1}, {"fraction", 0.1}}})),
      "p.json");
  EXPECT_GT(estimate_inference(c, hf, 4096, 0, 1).prefill_s,
            estimate_inference(c, hf.roofline(), 4096, 0, 1).prefill_s);
}

TEST(SizingKernels, BadRowsNameTheFieldAndTheFile) {
  auto err = [](json row) {
    return error_of([&] { hardware_from_json(h200_with(json::array({row})), "prof.json"); });
  };
  auto expect = [](const std::string& e, std::initializer_list<const char*> parts) {
    EXPECT_FALSE(e.empty());
    for (const char* p : parts) EXPECT_NE(e.find(p), std::string::npos) << e;
  };
  expect(err({{"class", "cca"}, {"work", 1}, {"fraction", 1.5}}),
         {"prof.json kernel_efficiency[0]", "'fraction'", "(0, 1]", "1.5"});
  expect(err({{"class", "cca"}, {"work", 1}, {"fraction", 0}}),
         {"prof.json kernel_efficiency[0]", "'fraction'"});
  expect(err({{"class", "cca"}, {"work", 1}, {"fraction", -0.3}}), {"'fraction'", "-0.3"});
  expect(err({{"class", "cca"}, {"work", 1}, {"fraction", "0.5"}}),
         {"prof.json kernel_efficiency[0]", "'fraction' must be a number"});
  expect(err({{"class", "cca"}, {"work", -1}, {"gbs", 100}}), {"'work'", "positive"});
  expect(err({{"class", "cca"}, {"work", "big"}, {"gbs", 100}}), {"'work'", "number"});
  expect(err({{"class", "cca"}, {"gbs", 100}}), {"prof.json kernel_efficiency[0]", "'work'"});
  expect(err({{"class", "cca"}, {"work", 1}, {"gbs", 0}}), {"'gbs'", "positive"});
  expect(err({{"class", "attention_fwd"}, {"work", 1}, {"tflops", -5}}), {"'tflops'"});
  expect(err({{"class", "attention_fwd"}, {"work", 1}, {"gbs", 5}}),
         {"'gbs' does not apply", "attention_fwd"});
  expect(err({{"class", "cca"}, {"work", 1}}), {"needs a positive 'gbs' or a 'fraction'"});
  expect(err({{"class", "flash"}, {"work", 1}, {"fraction", 0.5}}),
         {"prof.json kernel_efficiency[0]", "'class' is 'flash'"});
  expect(err({{"class", 3}, {"work", 1}, {"fraction", 0.5}}), {"'class' must be a string"});
  expect(err({{"class", "cca"}, {"work", 1}, {"fraction", 0.5}, {"shape", 4}}),
         {"'shape' must be a string"});
  expect(err(json(7)), {"prof.json kernel_efficiency[0]", "expected an object"});
  json j = h200_with(json::array());
  j["kernel_efficiency"] = {{"class", "cca"}};
  expect(error_of([&] { hardware_from_json(j, "prof.json"); }),
         {"prof.json", "'kernel_efficiency' must be an array"});
  // Through a file: the path names the source.
  const std::string path = ::testing::TempDir() + "bad_kernel_profile.json";
  {
    std::ofstream f(path);
    f << h200_with(json::array({{{"class", "loss"}, {"work", 1}, {"fraction", 2}}})).dump();
  }
  expect(error_of([&] { load_hardware(path); }),
         {path.c_str(), "kernel_efficiency[0]", "'fraction'"});
  // A profile without the field (schema zaya.hardware/1 as written before) still loads.
  json old = h200_with(json::array());
  old.erase("kernel_efficiency");
  EXPECT_NO_THROW(hardware_from_json(old, "old.json"));
}
