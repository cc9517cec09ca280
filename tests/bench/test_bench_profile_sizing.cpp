// The hardware profile the benchmarks write must be readable by `zaya size` (src/sizing's
// hardware_from_json): build one from made-up gemm, mem and comm results of an unknown device (so
// no built-in datasheet fills gaps) and check the sizing side sees the measured values.
#include <gtest/gtest.h>

#include "bench/profile.h"
#include "sizing/hardware.h"

namespace zaya::bench {
namespace {

TEST(BenchProfile, ReadableByZayaSize) {
  DeviceInfo dev;
  dev.name = "Test GPU 9000";
  dev.sm_count = 100;
  dev.l2_bytes = 32 << 20;
  dev.global_bytes = int64_t(80) << 30;
  std::vector<GemmResult> g(3);
  g[0].shape = {"square", 1024, 1024, 1024};  // 2.15 GFLOP
  g[0].dtype = "bf16";
  g[0].method = "lt";
  g[0].tflops = 450;
  g[1].shape = {"square", 4096, 4096, 4096};  // 137 GFLOP
  g[1].dtype = "bf16";
  g[1].method = "lt";
  g[1].tflops = 480;
  g[2].shape = {"experts", 512, 4096, 2048, 16};
  g[2].dtype = "bf16";
  g[2].method = "loop";  // not a single-call row: kept out of gemm_efficiency
  g[2].tflops = 300;
  for (auto& r : g) r.fraction = r.tflops / 500;
  std::vector<MemResult> m = {{"copy", 1 << 20, 2 << 20, 1, 9000, 0, 0},  // L2-resident: ignored
                              {"copy", 1u << 30, 2u << 30, 1, 1800, 0, 0},
                              {"read", 1u << 30, 1u << 30, 1, 1900, 0, -1},
                              {"h2d_pinned", 1u << 30, 1u << 30, 1, 25, 0, 0}};
  CommRow c;
  c.op = "all_reduce";
  c.group = "world";
  c.backend = "nccl";
  c.ranks = 8;
  c.bytes = 1 << 30;
  c.busbw_gbs = 350;
  CommRow one = c;  // a one-rank group: busbw 0, must not reach the profile
  one.ranks = 1;
  one.busbw_gbs = 0;

  nlohmann::json p = nlohmann::json::object();
  merge_profile(p, profile_from_mem(m, dev));
  merge_profile(p, profile_from_gemm(g, dev, 500, 0));
  merge_profile(p, profile_from_comm({c, one}));
  EXPECT_EQ(p["knee_gflop"]["p80"].get<double>(), g[0].shape.gflop());  // 450 >= 0.8 * 500
  EXPECT_EQ(p["knee_gflop"]["p90"].get<double>(), g[0].shape.gflop());  // 450 >= 0.9 * 500
  EXPECT_TRUE(p["peak_tflops"]["fp8"].is_null());
  EXPECT_EQ(p["gemm_efficiency"].size(), 2u);
  ASSERT_EQ(p["collectives"].size(), 1u);

  const auto h = sizing::hardware_from_json(p, "test profile");
  EXPECT_EQ(h.compute_units, 100);
  EXPECT_DOUBLE_EQ(h.peak_bf16_tflops, 500);
  EXPECT_DOUBLE_EQ(h.copy_gbs, 1800);
  EXPECT_DOUBLE_EQ(h.read_gbs, 1900);
  EXPECT_DOUBLE_EQ(h.h2d_gbs, 25);
  EXPECT_DOUBLE_EQ(h.hbm_gib, 80);
  EXPECT_DOUBLE_EQ(h.knee_gflop, g[0].shape.gflop());
  EXPECT_EQ(h.gemm.size(), 2u);
  ASSERT_EQ(h.collectives.size(), 1u);
  EXPECT_DOUBLE_EQ(h.collectives[0].busbw_gbs, 350);
}

}  // namespace
}  // namespace zaya::bench
