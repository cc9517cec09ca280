// Tests of the benchmark report writers (comm JSON/CSV/SVG/table, gemm and mem writers), the GEMM
// shape bookkeeping (ranges, a ZAYA config's GEMMs, the knee on synthetic sweeps that do and do not
// cross), the timing policy's arithmetic and the hardware profile merge.
#include <gtest/gtest.h>

#include <cmath>
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
  const GemmShape one = parse_gemm_shape("8192x1024x2K", "--shape");
  EXPECT_EQ(one.name, "shape");
  EXPECT_EQ(one.m, 8192);
  EXPECT_EQ(one.n, 1024);
  EXPECT_EQ(one.k, 2048);
  EXPECT_EQ(one.groups, 1);
  const GemmShape named = parse_gemm_shape("experts.down.fwd+=512x2048x2048x16", "--shape");
  EXPECT_EQ(named.name, "experts.down.fwd+");
  EXPECT_EQ(named.groups, 16);
  EXPECT_EQ(named.gflop(), 2.0 * 512 * 2048 * 2048 * 16 / 1e9);
  for (const char* bad : {"8192x1024", "1x2x3x4x5", "=1x2x3", "0x2x3", "ax2x3"}) {
    try {
      parse_gemm_shape(bad, "--shape");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--shape"), std::string::npos) << e.what();
    }
  }
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
  // 800 lies 70/75 of the way from 100 to 850: interpolated in log(work) between rows 0 and 1.
  const double w0 = rs[0].shape.gflop(), w1 = rs[1].shape.gflop(), w2 = rs[2].shape.gflop();
  EXPECT_NEAR(knee_gflop(rs, 1000, 0.8), std::exp(std::log(w0) + 70.0 / 75 * std::log(w1 / w0)),
              1e-9);
  EXPECT_NEAR(knee_gflop(rs, 1000, 0.9), std::exp(std::log(w1) + 50.0 / 70 * std::log(w2 / w1)),
              1e-9);
  EXPECT_LT(knee_gflop(rs, 1000, 0.95), 0);
  EXPECT_EQ(tile_count(1024, 1024, 128, 128), 64);
  EXPECT_EQ(tile_count(1025, 1024, 128, 128), 72);
  EXPECT_DOUBLE_EQ(wave_count(264, 132), 2.0);
  EXPECT_EQ(wave_shapes(1024, 1280, 128, 4096).size(), 3u);
}

// A synthetic square sweep shaped like the H200's: throughput rises with work and saturates near
// 80% of the 989.4 TFLOP/s spec, with a dip at one large size.
std::vector<GemmResult> synthetic_sweep() {
  const int64_t dims[] = {256, 512, 1024, 2048, 2944, 4096, 8192, 16384};
  const double tflops[] = {3, 25, 216, 622, 743, 790, 689, 698};
  std::vector<GemmResult> rs;
  for (size_t i = 0; i < 8; ++i) {
    GemmResult r;
    r.shape = {"square", dims[i], dims[i], dims[i]};
    r.dtype = "bf16";
    r.method = "lt";
    r.tflops = tflops[i];
    rs.push_back(r);
  }
  // Listed out of order: the knee sorts by work itself.
  std::swap(rs[0], rs[5]);
  return rs;
}

TEST(GemmKnee, CrossesTheMeasuredPeak) {
  const auto rs = synthetic_sweep();
  const double peak = measured_peak_tflops(rs, "bf16");
  EXPECT_DOUBLE_EQ(peak, 790);
  const double w2048 = 2.0 * 2048 * 2048 * 2048 / 1e9, w2944 = 2.0 * 2944 * 2944 * 2944 / 1e9;
  // 80% of 790 = 632: between 2048 (622) and 2944 (743), 10/121 of the way in log(work).
  const double p80 = knee_gflop(rs, peak, 0.8);
  EXPECT_NEAR(p80, std::exp(std::log(w2048) + 10.0 / 121 * std::log(w2944 / w2048)), 1e-9);
  EXPECT_GT(p80, w2048);
  EXPECT_LT(p80, w2944);
  // 90% = 711: first reached at 2944 (743), (711-622)/(743-622) of the way from 2048.
  const double p90 = knee_gflop(rs, peak, 0.9);
  EXPECT_NEAR(p90, std::exp(std::log(w2048) + 89.0 / 121 * std::log(w2944 / w2048)), 1e-9);
  EXPECT_GT(p90, p80);
  // Against the measured peak the knee always exists: the peak row reaches 100%.
  EXPECT_GT(knee_gflop(rs, peak, 1.0), 0);
  // The smallest row already above the threshold is the knee itself (nothing to interpolate).
  EXPECT_DOUBLE_EQ(knee_gflop(rs, peak, 0.001), 2.0 * 256 * 256 * 256 / 1e9);
}

TEST(GemmKnee, NeverCrossingIsNegative) {
  const auto rs = synthetic_sweep();
  // Against the spec peak the sweep never reaches 80% (790 < 791.5) nor 90%: the first H200
  // profile's null knees.
  EXPECT_LT(knee_gflop(rs, 989.4, 0.8), 0);
  EXPECT_LT(knee_gflop(rs, 989.4, 0.9), 0);
  EXPECT_LT(knee_gflop(rs, 0, 0.8), 0);  // no peak: no knee
  EXPECT_LT(knee_gflop({}, 790, 0.8), 0);
  EXPECT_DOUBLE_EQ(measured_peak_tflops(rs, "fp8"), 0);
}

TEST(GemmKnee, ProfileUsesTheMeasuredPeak) {
  auto rs = synthetic_sweep();
  GemmResult cublas = rs[0];  // a faster non-Lt row must not raise the reference
  cublas.method = "cublas";
  cublas.tflops = 900;
  rs.push_back(cublas);
  DeviceInfo dev;
  dev.name = "NVIDIA H200";
  dev.sm_count = 132;
  const auto p = profile_from_gemm(rs, dev, 989.4, 1978.9);
  EXPECT_DOUBLE_EQ(p["measured_peak_tflops"]["bf16"].get<double>(), 790);
  EXPECT_TRUE(p["measured_peak_tflops"]["fp8"].is_null());
  EXPECT_DOUBLE_EQ(p["knee_gflop"]["reference_tflops"].get<double>(), 790);
  const auto lt_rows = synthetic_sweep();
  EXPECT_NEAR(p["knee_gflop"]["p80"].get<double>(), knee_gflop(lt_rows, 790, 0.8), 1e-9);
  EXPECT_NEAR(p["knee_gflop"]["p90"].get<double>(), knee_gflop(lt_rows, 790, 0.9), 1e-9);
  EXPECT_TRUE(p["knee_gflop_spec"]["p80"].is_null());
  EXPECT_TRUE(p["knee_gflop_spec"]["p90"].is_null());
  EXPECT_DOUBLE_EQ(p["peak_tflops"]["bf16"].get<double>(), 989.4);
}

TEST(GemmTiming, PolicyArithmetic) {
  TimingPolicy p;  // warm 20 ms, timed >= 25 ms, 20..200 iterations, hold 1 ms + 50 us/iter
  EXPECT_EQ(timed_iters(p, 10), 200);     // 2500 wanted, capped
  EXPECT_EQ(timed_iters(p, 1000), 25);    // 25 ms / 1 ms
  EXPECT_EQ(timed_iters(p, 12600), 20);   // long GEMMs: the minimum
  EXPECT_EQ(timed_iters(p, 0), 200);      // no estimate: as many as allowed
  EXPECT_EQ(warm_launches(p, 10), 1000);  // capped
  EXPECT_EQ(warm_launches(p, 1600), 13);  // ceil(20000 / 1600)
  EXPECT_EQ(warm_launches(p, 0), 0);
  EXPECT_DOUBLE_EQ(block_us(p, 20), 2000);
  EXPECT_DOUBLE_EQ(block_us(p, 200), 11000);
  p.block_max_us = 5000;
  EXPECT_DOUBLE_EQ(block_us(p, 200), 5000);
  p.max_iters = 5;  // below the minimum: the minimum wins
  EXPECT_EQ(timed_iters(p, 10), 20);
}

TEST(GemmReport, JsonCarriesTheProtocolForThePeer) {
  auto rs = synthetic_sweep();
  rs[0].sets = 3;
  rs[0].iters = 40;
  rs[0].warm = 12;
  rs[0].algo = 2;
  rs[0].candidates = 17;
  GemmBenchOptions opt;
  opt.timing.min_time_ms = 30;
  const auto j = nlohmann::json::parse(gemm_results_json(rs, DeviceInfo{}, 989.4, 0, opt));
  EXPECT_EQ(j["workspace_bytes"], 32u << 20);
  EXPECT_EQ(j["timing"]["min_time_ms"], 30.0);
  EXPECT_EQ(j["timing"]["block_per_iter_us"], 50.0);
  EXPECT_EQ(j["measured_peak_tflops"]["bf16"], 790.0);
  EXPECT_EQ(j["results"][0]["sets"], 3);
  EXPECT_EQ(j["results"][0]["iters"], 40);
  EXPECT_EQ(j["results"][0]["warm"], 12);
  EXPECT_EQ(j["results"][0]["algo"], 2);
  EXPECT_EQ(j["results"][0]["candidates"], 17);
  // The window and clock fields are new and optional: absent when not recorded.
  EXPECT_FALSE(j["results"][0].contains("t_start"));
  EXPECT_FALSE(j["results"][0].contains("sm_clock_mhz"));
  rs[1].gpu.t_start = 1.5e9;
  rs[1].gpu.t_end = 1.5e9 + 0.03;
  rs[2].gpu = {1.6e9, 1.6e9 + 0.02, 12, 1755.5, 1650, 698.25, 61, 0x4};
  const auto j2 = nlohmann::json::parse(gemm_results_json(rs, DeviceInfo{}, 989.4, 0, opt));
  EXPECT_DOUBLE_EQ(j2["results"][1]["t_end"].get<double>(), 1.5e9 + 0.03);
  EXPECT_FALSE(j2["results"][1].contains("clock_samples"));
  EXPECT_EQ(j2["results"][2]["clock_samples"], 12);
  EXPECT_EQ(j2["results"][2]["sm_clock_mhz"], 1755.5);
  EXPECT_EQ(j2["results"][2]["sm_clock_min_mhz"], 1650.0);
  EXPECT_EQ(j2["results"][2]["power_w"], 698.25);
  EXPECT_EQ(j2["results"][2]["temp_c"], 61.0);
  EXPECT_EQ(j2["results"][2]["clock_reasons"], 4);
  const std::string csv = gemm_results_csv(rs);
  EXPECT_NE(csv.find(",sets,iters,algo,candidates\n"), std::string::npos);
  EXPECT_NE(csv.find(",3,40,2,17\n"), std::string::npos);
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

TEST(GemmReport, KeptAlgorithmsRoundTripThroughTheJson) {
  auto rs = synthetic_sweep();
  const uint8_t algo_a[4] = {0x00, 0x7f, 0xa5, 0xff};
  rs[1].algo_config = hex_encode(algo_a, sizeof(algo_a));
  rs[2].algo_config = "0102";
  rs[2].algo_reused = true;
  rs[2].algo_fields = {{"id", 66}, {"tile", 20}, {"cluster_shape", 14}};
  rs[2].launch = "cuda-graph";
  GemmResult cublas = rs[1];
  cublas.method = "cublas";  // only the autotuned rows' algorithms are kept
  cublas.algo_config = "ffff";
  rs.push_back(cublas);
  EXPECT_EQ(rs[1].algo_config, "007fa5ff");
  std::vector<uint8_t> back;
  ASSERT_TRUE(hex_decode("007FA5ff", back));
  EXPECT_EQ(back, std::vector<uint8_t>(algo_a, algo_a + 4));
  EXPECT_FALSE(hex_decode("abc", back));  // odd length
  EXPECT_FALSE(hex_decode("zz", back));

  const auto dir = std::filesystem::temp_directory_path() / "zaya_gemm_algos_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "gemm.json").string();
  std::ofstream(good) << gemm_results_json(rs, DeviceInfo{}, 989.4, 0);
  const auto j = nlohmann::json::parse(std::ifstream(good));
  EXPECT_FALSE(j["results"][0].contains("algo_config"));
  EXPECT_EQ(j["results"][2]["algo_reused"], true);
  EXPECT_EQ(j["results"][2]["algo_fields"],
            nlohmann::json({{"id", 66}, {"tile", 20}, {"cluster_shape", 14}}));
  EXPECT_FALSE(j["results"][1].contains("algo_fields"));  // none known: no empty object
  EXPECT_EQ(j["results"][0]["launch"], "direct");         // every row says how it was launched
  EXPECT_EQ(j["results"][2]["launch"], "cuda-graph");
  const auto algos = load_gemm_algos(good);
  ASSERT_EQ(algos.size(), 2u);
  EXPECT_EQ(algos.at(gemm_algo_key("bf16", rs[1].shape)), "007fa5ff");
  EXPECT_EQ(algos.at(gemm_algo_key("bf16", rs[2].shape)), "0102");
  EXPECT_EQ(gemm_algo_key("fp8", GemmShape{"x", 8, 16, 32, 4}), "fp8 8 16 32 4");

  auto throws_naming = [](const std::string& path, const std::string& what) {
    try {
      load_gemm_algos(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  throws_naming((dir / "missing.json").string(), "cannot read");
  const std::string notjson = (dir / "bad.json").string();
  std::ofstream(notjson) << "{ not json";
  throws_naming(notjson, "is not JSON");
  const std::string other = (dir / "other.json").string();
  std::ofstream(other) << R"({"schema": "zaya.bench.mem/1", "results": []})";
  throws_naming(other, "zaya.bench.gemm/1");
  rs[1].algo_config = "0g";
  const std::string badhex = (dir / "badhex.json").string();
  std::ofstream(badhex) << gemm_results_json(rs, DeviceInfo{}, 989.4, 0);
  throws_naming(badhex, "is not hex");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zaya::bench
