// Hardware profiles: the built-in datasheet figures, topology bandwidth limits (ZAYA1.md §5:
// a fully connected MI300X node gives a collective over n GPUs n−1 links; a switched node gives
// full bandwidth), measured-profile parsing with fallback to the built-in profile, and the
// interpolation of measured GEMM and collective tables.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "sizing/hardware.h"
#include "sizing_test_util.h"

using namespace zaya;
using namespace zaya::sizing;
using nlohmann::json;

namespace {

using test::error_of;

}  // namespace

TEST(SizingHardware, BuiltinsCarryDatasheetFigures) {
  EXPECT_EQ(builtin_hardware_names(),
            (std::vector<std::string>{"mi300x", "mi325x", "h100", "h200", "b200", "a100"}));
  const HardwareProfile m = builtin_hardware("MI300X");
  EXPECT_EQ(m.compute_units, 304);  // ZAYA1.md §5
  EXPECT_DOUBLE_EQ(m.peak_bf16_tflops, 1307.4);
  EXPECT_DOUBLE_EQ(m.hbm_peak_gbs, 5300);
  EXPECT_EQ(m.topology, Topology::FullyConnected);
  EXPECT_EQ(m.links_per_gpu, 7);
  const HardwareProfile h = builtin_hardware("h200");
  EXPECT_EQ(h.compute_units, 132);  // ZAYA1.md §5
  EXPECT_DOUBLE_EQ(h.hbm_gib, 141);
  EXPECT_EQ(h.topology, Topology::Switch);
  EXPECT_EQ(builtin_hardware("H100-SXM").key, "h100");
  EXPECT_EQ(builtin_hardware("h100 sxm5").compute_units, 132);
  EXPECT_DOUBLE_EQ(builtin_hardware("a100").peak_fp8_tflops, 0);
  // Ridge point = peak / bandwidth.
  EXPECT_NEAR(m.ridge_flop_per_byte(), 1307.4e12 / 5.3e12, 1e-9);
}

TEST(SizingHardware, UnknownHardwareListsTheKnownNames) {
  const std::string e = error_of([] { load_hardware("tpu-v5"); });
  EXPECT_NE(e.find("unknown hardware 'tpu-v5'"), std::string::npos) << e;
  EXPECT_NE(e.find("mi300x, mi325x, h100, h200, b200, a100"), std::string::npos) << e;
  const std::string f = error_of([] { load_hardware("/nonexistent/profile.json"); });
  EXPECT_NE(f.find("cannot open profile '/nonexistent/profile.json'"), std::string::npos) << f;
}

TEST(SizingHardware, TopologyLimitsCollectives) {
  const HardwareProfile m = builtin_hardware("mi300x");
  EXPECT_DOUBLE_EQ(m.intra_node_busbw(8), 7 * 64e9);  // all 7 links
  EXPECT_DOUBLE_EQ(m.intra_node_busbw(4), 3 * 64e9);  // a 4-GPU group drives only 3
  EXPECT_DOUBLE_EQ(m.intra_node_busbw(2), 64e9);
  const HardwareProfile h = builtin_hardware("h200");
  EXPECT_DOUBLE_EQ(h.intra_node_busbw(2), 450e9);  // NVSwitch: any subset gets full bandwidth
  EXPECT_DOUBLE_EQ(h.intra_node_busbw(8), 450e9);
  // Across nodes, the per-GPU NIC is the limit.
  EXPECT_DOUBLE_EQ(h.busbw_bytes_per_s("all_gather", 1024, 1e9), 50e9);
  EXPECT_DOUBLE_EQ(m.busbw_bytes_per_s("reduce_scatter", 16, 1e9), 50e9);
  EXPECT_TRUE(std::isinf(h.busbw_bytes_per_s("all_gather", 1, 1e9)));
}

TEST(SizingHardware, MeasuredProfileFallsBackToTheBuiltin) {
  json j = {{"schema", "zaya.hardware/1"},
            {"device", "NVIDIA H200"},
            {"peak_tflops", {{"bf16", 790}}},
            {"copy_bandwidth_gbs", 4200},
            {"knee_gflop", {{"p80", 40}, {"p90", 120}}}};
  const HardwareProfile h = hardware_from_json(j, "bench.json");
  EXPECT_TRUE(h.measured);
  EXPECT_EQ(h.key, "h200");
  EXPECT_DOUBLE_EQ(h.peak_bf16_tflops, 790);
  EXPECT_DOUBLE_EQ(h.copy_gbs, 4200);
  EXPECT_DOUBLE_EQ(h.read_gbs, 4800);   // not measured: the datasheet figure stays
  EXPECT_DOUBLE_EQ(h.knee_gflop, 120);  // measured p90 knee replaces the 200 GFLOP default
  EXPECT_DOUBLE_EQ(h.hbm_gib, 141);     // missing: from the built-in H200
  EXPECT_EQ(h.compute_units, 132);
  EXPECT_DOUBLE_EQ(h.peak_fp8_tflops, 1978.9);
  EXPECT_EQ(h.topology, Topology::Switch);
}

TEST(SizingHardware, MeasuredProfileErrors) {
  json j = {{"schema", "zaya.hardware/2"}, {"device", "NVIDIA H200"}};
  EXPECT_NE(error_of([&] { hardware_from_json(j, "p.json"); }).find("expected \"zaya.hardware/1\""),
            std::string::npos);
  json u = {{"schema", "zaya.hardware/1"}, {"device", "Acme X1"}, {"sm_count", 10}};
  const std::string e = error_of([&] { hardware_from_json(u, "p.json"); });
  EXPECT_NE(e.find("device 'Acme X1' is not a built-in profile"), std::string::npos) << e;
  EXPECT_NE(e.find("'hbm_capacity_gib' is required"), std::string::npos) << e;
  json n = {{"schema", "zaya.hardware/1"}, {"device", "NVIDIA H100"}, {"copy_bandwidth_gbs", -3}};
  EXPECT_NE(error_of([&] {
              hardware_from_json(n, "p.json");
            }).find("field 'copy_bandwidth_gbs' must be positive"),
            std::string::npos);
  json g = {{"schema", "zaya.hardware/1"},
            {"device", "NVIDIA H100"},
            {"gemm_efficiency", {{{"m", 0}, {"n", 1}, {"k", 1}, {"tflops", 1}}}}};
  EXPECT_NE(
      error_of([&] { hardware_from_json(g, "p.json"); }).find("gemm_efficiency[0]: field 'm'"),
      std::string::npos);
  // A complete profile of an unknown device is accepted.
  json ok = {
      {"schema", "zaya.hardware/1"}, {"device", "Acme X1"},       {"sm_count", 10},
      {"hbm_capacity_gib", 16},      {"copy_bandwidth_gbs", 500}, {"peak_tflops", {{"bf16", 50}}}};
  const HardwareProfile h = hardware_from_json(ok, "p.json");
  EXPECT_EQ(h.compute_units, 10);
  EXPECT_DOUBLE_EQ(h.read_gbs, 500);
}

TEST(SizingHardware, GemmTableInterpolatesInLogWork) {
  HardwareProfile h = builtin_hardware("h200");
  EXPECT_DOUBLE_EQ(h.gemm_flops_per_s(1), 989.4e12);  // no table: datasheet peak
  // Two rows: 1 GFLOP at 100 TFLOP/s (m=n=k=... chosen so that 2mnk = 1e9) and 100 GFLOP at 700.
  h.gemm.push_back({500, 1000, 1000, "bf16", 100, 0});
  h.gemm.push_back({50000, 1000, 1000, "bf16", 700, 0});
  h.gemm.push_back({50000, 1000, 1000, "fp8", 1500, 0});  // other dtypes are ignored
  EXPECT_NEAR(h.gemm_flops_per_s(10), 400e12, 1e3);       // log-midpoint
  EXPECT_NEAR(h.gemm_flops_per_s(0.01), 100e12, 1e3);     // clamped
  EXPECT_NEAR(h.gemm_flops_per_s(1e6), 700e12, 1e3);
}

TEST(SizingHardware, MeasuredCollectivesBySideOfTheNode) {
  HardwareProfile h = builtin_hardware("h200");
  h.collectives.push_back({"all_gather", 8, 1e6, 100, "nccl"});
  h.collectives.push_back({"all_gather", 8, 1e8, 400, "nccl"});
  EXPECT_NEAR(h.busbw_bytes_per_s("all_gather", 8, 1e7), 250e9, 1e3);
  EXPECT_NEAR(h.busbw_bytes_per_s("all_gather", 4, 1e9), 400e9, 1e3);  // nearest ranks, clamped
  // No multi-node rows: the topology model (NIC) applies beyond the node.
  EXPECT_DOUBLE_EQ(h.busbw_bytes_per_s("all_gather", 64, 1e9), 50e9);
  // No rows for this op: topology.
  EXPECT_DOUBLE_EQ(h.busbw_bytes_per_s("reduce_scatter", 8, 1e9), 450e9);
}

TEST(SizingHardware, FixtureProfileLoads) {
  const HardwareProfile h =
      load_hardware(std::string(ZAYA_SOURCE_DIR) + "/tests/sizing/h200_measured.json");
  EXPECT_EQ(h.key, "h200");
  EXPECT_DOUBLE_EQ(h.peak_bf16_tflops, 790);
  EXPECT_DOUBLE_EQ(h.knee_gflop, 60);
  EXPECT_EQ(h.gemm.size(), 5u);
  // 2·2048³ = 17.18 GFLOP is a table row.
  EXPECT_NEAR(h.gemm_flops_per_s(2.0 * 2048 * 2048 * 2048 * 1e-9), 640e12, 1e3);
}
