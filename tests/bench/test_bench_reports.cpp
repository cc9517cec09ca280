// Tests of the benchmark report writers (comm JSON/CSV/SVG/table, gemm and mem writers), the GEMM
// shape bookkeeping (ranges, a ZAYA config's GEMMs, knee) and the hardware profile merge.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/comm_bench.h"
#include "bench/gemm_bench.h"
#include "bench/mem_bench.h"
#include "bench/profile.h"
#include "core/error.h"

namespace zaya::bench {
namespace {

std::vector<CommRow> sample_rows() {
  CommRow a;
  a.op = "all_reduce";
  a.group = "world";
  a.backend = "mpi";
  a.ranks = 4;
  a.bytes = 1024;
  a.count = 256;
  a.dtype = "float";
  a.redop = "sum";
  a.time_us = 10;
  a.algbw_gbs = algbw_gbs(1024, 10e-6);
  a.busbw_gbs = busbw_gbs(CommOp::AllReduce, 4, 1024, 10e-6);
  a.wrong = 0;
  CommRow b = a;
  b.op = "broadcast";
  b.redop = "none";
  b.inplace = true;
  b.wrong = 3;
  return {a, b};
}

TEST(CommReport, JsonHasOneRecordPerRow) {
  const auto j =
      nlohmann::json::parse(comm_rows_json(sample_rows(), "mpi", 4, {"a", "a", "b", "b"}));
  EXPECT_EQ(j["schema"], "zaya.bench.comm/1");
  EXPECT_EQ(j["world_size"], 4);
  ASSERT_EQ(j["results"].size(), 2u);
  const auto& r = j["results"][0];
  EXPECT_EQ(r["name"], "all_reduce");
  EXPECT_EQ(r["size"], 1024);
  EXPECT_EQ(r["ranks"], 4);
  EXPECT_DOUBLE_EQ(r["time_us"].get<double>(), 10.0);
  EXPECT_NEAR(r["algbw"].get<double>(), 0.1024, 1e-12);
  EXPECT_NEAR(r["busbw"].get<double>(), 0.1024 * 1.5, 1e-12);
  EXPECT_EQ(r["wrong"], 0);
  EXPECT_EQ(j["results"][1]["inplace"], true);
  EXPECT_EQ(j["results"][1]["wrong"], 3);
}

TEST(CommReport, CsvAndTable) {
  const std::string csv = comm_rows_csv(sample_rows());
  std::istringstream in(csv);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("name,group,ranks,", 0), 0u);
  std::getline(in, line);
  EXPECT_EQ(
      line.rfind("all_reduce,world,4,mpi,1024,256,float,sum,0,10.0000,0.102400,0.153600,0", 0), 0u)
      << line;
  const std::string row = comm_table_row(sample_rows()[1]);
  EXPECT_NE(row.find("broadcast"), std::string::npos);
  EXPECT_NE(row.find(" in "), std::string::npos);
  EXPECT_EQ(comm_table_header().size(), comm_table_row(sample_rows()[0]).size());
  const std::string svg = comm_rows_svg(sample_rows());
  EXPECT_NE(svg.find("all_reduce 4 ranks (world)"), std::string::npos);
}

TEST(GemmShapes, RangesAndModelShapes) {
  EXPECT_EQ(parse_dim_range("256:2048:x2", "--m"), (std::vector<int64_t>{256, 512, 1024, 2048}));
  EXPECT_EQ(parse_dim_range("1024:1536:+256", "--n"), (std::vector<int64_t>{1024, 1280, 1536}));
  EXPECT_EQ(parse_dim_range("4K,8192", "--k"), (std::vector<int64_t>{4096, 8192}));
  EXPECT_THROW(parse_dim_range("256:128:x2", "--m"), Error);
  EXPECT_THROW(parse_dim_range("256:1024:*2", "--m"), Error);
  EXPECT_THROW(parse_dim_range("abc", "--m"), Error);
  EXPECT_EQ(cartesian_shapes({1, 2}, {3}, {4, 5}).size(), 4u);
  const auto knee = knee_shapes(1024);
  EXPECT_EQ(knee.front().m, 256);
  EXPECT_LE(knee.back().m, 1024 + 63);
  for (const auto& s : knee) EXPECT_EQ(s.m % 64, 0);

  const ZayaConfig cfg = ZayaConfig::preset("zaya1-8b");
  const int64_t T = 4096;
  const auto shapes = model_gemm_shapes(cfg, T);
  // Independent count: the step's linear-layer FLOPs are 6 x tokens x (weights touched per token),
  // with every expert's weights seen by T/E tokens (balanced routing).
  const int64_t D = cfg.hidden_size, d = cfg.head_dim, R = cfg.router_hidden_size,
                E = cfg.num_experts, I = cfg.moe_intermediate_size;
  const double per_layer = double(cfg.num_attention_heads * d * D * 2 +  // q and o
                                  cfg.num_key_value_heads * d * D +      // k
                                  cfg.num_key_value_heads * d * D +      // two half-width v
                                  R * D + 2 * R * R + (E + 1) * R) *
                               T +
                           double(3 * I * D) * double(T / E) * double(E);
  const double want =
      6.0 * (per_layer * double(cfg.num_hidden_layers) + double(cfg.vocab_size * D) * T);
  double got = 0;
  for (const auto& s : shapes) got += s.gflop() * 1e9 * double(s.count);
  EXPECT_NEAR(got / want, 1.0, 1e-12);
  bool grouped = false;
  for (const auto& s : shapes)
    if (s.name == "experts.gate_up.fwd") {
      grouped = true;
      EXPECT_EQ(s.groups, E);
      EXPECT_EQ(s.m, T / E);
      EXPECT_EQ(s.n, 2 * I);
      EXPECT_EQ(s.k, D);
    }
  EXPECT_TRUE(grouped);
}

TEST(GemmShapes, KneeAndWaves) {
  std::vector<GemmResult> rs(3);
  rs[0].shape = {"square", 256, 256, 256};  // 0.034 GFLOP
  rs[0].tflops = 100;
  rs[1].shape = {"square", 1024, 1024, 1024};  // 2.1 GFLOP
  rs[1].tflops = 850;
  rs[2].shape = {"square", 4096, 4096, 4096};  // 137 GFLOP
  rs[2].tflops = 920;
  EXPECT_NEAR(knee_gflop(rs, 1000, 0.8), rs[1].shape.gflop(), 1e-12);
  EXPECT_NEAR(knee_gflop(rs, 1000, 0.9), rs[2].shape.gflop(), 1e-12);
  EXPECT_LT(knee_gflop(rs, 1000, 0.95), 0);
  EXPECT_EQ(tile_count(1024, 1024, 128, 128), 64);
  EXPECT_EQ(tile_count(1025, 1024, 128, 128), 72);
  EXPECT_DOUBLE_EQ(wave_count(264, 132), 2.0);
  EXPECT_EQ(wave_shapes(1024, 1280, 128, 4096).size(), 3u);
}

TEST(MemReport, TestsBytesAndWriters) {
  EXPECT_EQ(parse_mem_tests("all").size(), mem_test_names().size());
  EXPECT_EQ(parse_mem_tests("copy,read"), (std::vector<std::string>{"copy", "read"}));
  EXPECT_THROW(parse_mem_tests("scale"), Error);
  EXPECT_EQ(mem_bytes_moved("copy", 100), 200u);
  EXPECT_EQ(mem_bytes_moved("triad", 100), 300u);
  EXPECT_EQ(mem_bytes_moved("h2d_pinned", 100), 100u);
  std::vector<MemResult> rs(2);
  rs[0] = {"copy", 1 << 20, 2 << 20, 1.0, 2000, 0.4, 0};
  rs[1] = {"copy", 1 << 30, 2u << 30, 1000, 3500, 0.7, 0};
  EXPECT_DOUBLE_EQ(mem_best_gbs(rs, "copy", 0), 3500);
  EXPECT_DOUBLE_EQ(mem_best_gbs(rs, "copy", 2u << 30), 0);
  const auto j = nlohmann::json::parse(mem_results_json(rs, DeviceInfo{}, 4800));
  EXPECT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][1]["size"], 1 << 30);
  EXPECT_NE(mem_results_csv(rs).find("copy,1073741824,2147483648,"), std::string::npos);
}

TEST(HardwareProfile, MergeReplacesByKeyAndKeepsTheRest) {
  nlohmann::json p;
  merge_profile(p, {{"device", "X"},
                    {"peak_tflops", {{"bf16", 900}}},
                    {"collectives",
                     {{{"op", "all_reduce"},
                       {"ranks", 2},
                       {"bytes", 8},
                       {"backend", "mpi"},
                       {"busbw_gbs", 1.0}}}}});
  merge_profile(
      p,
      {{"peak_tflops", {{"fp8", 1800}}},
       {"collectives",
        {{{"op", "all_reduce"}, {"ranks", 2}, {"bytes", 8}, {"backend", "mpi"}, {"busbw_gbs", 2.0}},
         {{"op", "all_reduce"},
          {"ranks", 4},
          {"bytes", 8},
          {"backend", "mpi"},
          {"busbw_gbs", 3.0}}}}});
  EXPECT_EQ(p["schema"], kHardwareSchema);
  EXPECT_EQ(p["device"], "X");
  EXPECT_EQ(p["peak_tflops"]["bf16"], 900);
  EXPECT_EQ(p["peak_tflops"]["fp8"], 1800);
  ASSERT_EQ(p["collectives"].size(), 2u);
  EXPECT_EQ(p["collectives"][0]["busbw_gbs"], 2.0);
}

TEST(HardwareProfile, FileMergeAndBadFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "zaya_profile_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "hw.json").string();
  merge_profile_file(path, {{"sm_count", 132}});
  merge_profile_file(path, {{"copy_bandwidth_gbs", 4000.5}});
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["schema"], "zaya.hardware/1");
  EXPECT_EQ(j["sm_count"], 132);
  EXPECT_EQ(j["copy_bandwidth_gbs"], 4000.5);
  const std::string other = (dir / "other.json").string();
  std::ofstream(other) << R"({"schema":"something/else"})";
  EXPECT_THROW(merge_profile_file(other, {{"sm_count", 1}}), Error);
  EXPECT_THROW(check_output_path("--json", (dir / "missing" / "x.json").string()), Error);
  EXPECT_THROW(check_output_path("--json", dir.string()), Error);
  EXPECT_NO_THROW(check_output_path("--json", path));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zaya::bench
