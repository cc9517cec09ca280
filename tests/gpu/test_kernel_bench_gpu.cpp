// GPU test of `zaya bench kernels` (label gpu; skipped without a CUDA device): every kernel of the
// tiny preset's training shapes runs and times positive, every class gets an efficiency row in
// (0, 1], and the profile update loads into the sizing cost model.
#include <gtest/gtest.h>

#include "bench/kernel_bench.h"
#include "bench/profile.h"
#include "gpu_test_util.h"
#include "sizing/cost_model.h"

namespace zaya::bench {
namespace {

using test_util::have_gpu;

TEST(KernelBenchGpu, TinyPresetAllClasses) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceInfo dev = query_device(0);
  KernelBenchOptions o;
  o.cfg = ZayaConfig::preset("tiny");
  o.batch = 2;
  o.seq = 256;
  o.optimizer_elems = 1 << 20;
  o.timing.min_iters = 3;
  o.timing.max_iters = 5;
  o.timing.warmup = 1;
  o.timing.warm_ms = 1;
  o.timing.min_time_ms = 1;
  const auto rows = run_kernel_bench(o, dev);
  ASSERT_GE(rows.size(), 16u);
  for (const auto& r : rows) {
    EXPECT_GT(r.us, 0) << r.name;
    EXPECT_GT(r.iters, 0) << r.name;
    EXPECT_NE(r.cls, sizing::KernelClass::None) << r.name;
  }
  const double peak = dev.peak_bf16_tflops > 0 ? dev.peak_bf16_tflops : 1000;
  const double copy = dev.peak_hbm_gbs > 0 ? dev.peak_hbm_gbs : 5000;
  const auto eff = kernel_efficiencies(o.cfg, o.batch, o.seq, rows, o.optimizer_elems, peak, copy);
  for (sizing::KernelClass c : sizing::kKernelClasses) {
    int n = 0;
    for (const auto& k : eff)
      if (k.cls == c) {
        ++n;
        EXPECT_GT(k.rate, 0) << sizing::kernel_class_name(c);
        EXPECT_GT(k.fraction, 0) << sizing::kernel_class_name(c);
        EXPECT_LE(k.fraction, 1) << sizing::kernel_class_name(c);
      }
    // Attention: one row per distinct window of the layers; memory classes: one row.
    if (sizing::kernel_class_is_compute(c))
      EXPECT_GE(n, 1) << sizing::kernel_class_name(c);
    else
      EXPECT_EQ(n, 1) << sizing::kernel_class_name(c);
  }
  nlohmann::json prof = nlohmann::json::object();
  merge_profile(prof, profile_from_kernels(eff, dev));
  prof["peak_tflops"] = {{"bf16", peak}};
  prof["copy_bandwidth_gbs"] = copy;
  const auto h = sizing::hardware_from_json(prof, "kernel bench profile");
  sizing::TrainSetup s;
  s.micro_batch = o.batch, s.seq = o.seq, s.ranks = 1;
  const auto cal = sizing::estimate_training(o.cfg, h, s);
  const auto roof = sizing::estimate_training(o.cfg, h.roofline(), s);
  EXPECT_GT(cal.step_s, roof.step_s);
}

}  // namespace
}  // namespace zaya::bench
