// The sizing rules on ZAYA1-base, MI300X and H200, with expected figures computed by hand from the
// rule definitions (ZAYA1.md §5) in the comments.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/config.h"
#include "sizing/rules.h"
#include "sizing/zero1_layout.h"

using namespace zaya;
using namespace zaya::sizing;

namespace {

const RuleResult& rule(const std::vector<RuleResult>& rs, const std::string& id) {
  for (auto& r : rs)
    if (r.id == id) return r;
  throw std::runtime_error("no rule " + id);
}

CheckOptions opts(int64_t micro_batch, int ranks) {
  CheckOptions o;
  o.train.micro_batch = micro_batch;
  o.train.seq = 4096;
  o.train.ranks = ranks;
  return o;
}

}  // namespace

TEST(SizingRules, WaveEfficiency) {
  EXPECT_DOUBLE_EQ(wave_efficiency(132, 132), 1.0);
  EXPECT_DOUBLE_EQ(wave_efficiency(133, 132), 133.0 / 264);
  EXPECT_DOUBLE_EQ(wave_efficiency(512, 304), 512.0 / 608);
  EXPECT_DOUBLE_EQ(wave_efficiency(64, 304), 64.0 / 304);
  EXPECT_EQ(gemm_tiles(16384, 1536, 256, 256), 64 * 6);
  EXPECT_EQ(gemm_tiles(1000, 257, 128, 256), 8 * 2);
  EXPECT_EQ(gemm_tiles(16384, 262272, 128, 256), 128 * 1025);
}

TEST(SizingRules, Alignment) {
  EXPECT_EQ(check_alignment("w", "x", 2048).status, Status::Pass);
  EXPECT_EQ(check_alignment("w", "x", 64 * 3).status, Status::Pass);
  EXPECT_EQ(check_alignment("w", "x", 8 * 257).status, Status::Warn);
  EXPECT_EQ(check_alignment("w", "x", 2050).status, Status::Fail);
  EXPECT_EQ(check_alignment("w", "x", 2048).numbers["pow2_divisor"], 256);
  EXPECT_EQ(check_alignment("w", "x", 192).numbers["pow2_divisor"], 64);
}

TEST(SizingRules, Zaya1BaseAlignmentPasses) {
  const auto rs =
      check_rules(ZayaConfig::preset("zaya1-base"), builtin_hardware("mi300x"), opts(4, 8));
  for (const char* id : {"head_dim", "width.hidden", "width.attention_q", "width.attention_kv",
                         "width.expert", "width.router", "vocab"})
    EXPECT_EQ(rule(rs, id).status, Status::Pass) << id;
}

TEST(SizingRules, HeadDimAndVocabThresholds) {
  ZayaConfig c = ZayaConfig::preset("zaya1-base");
  c.head_dim = 96;  // multiple of 8, not of 64
  auto rs = check_rules(c, builtin_hardware("h200"), opts(4, 8));
  EXPECT_EQ(rule(rs, "head_dim").status, Status::Warn);
  c.head_dim = 100;
  rs = check_rules(c, builtin_hardware("h200"), opts(4, 8));
  EXPECT_EQ(rule(rs, "head_dim").status, Status::Fail);
  EXPECT_EQ(worst_status(rs), Status::Fail);
  c = ZayaConfig::preset("zaya1-base");
  c.vocab_size = 262144 + 3;  // Gemma-3 vocab plus 3 specials, unpadded
  rs = check_rules(c, builtin_hardware("h200"), opts(4, 8));
  EXPECT_EQ(rule(rs, "vocab").status, Status::Warn);
  EXPECT_EQ(rule(rs, "vocab").numbers["padded_to_128"], 262272);
}

TEST(SizingRules, KneeUsesPerExpertWork) {
  // 4 × 4096 tokens, 16 experts, top-1: 1024 tokens per expert; gate_up = 2·1024·4096·2048 =
  // 17.18 GFLOP, down = 8.59 GFLOP, both under the 200 GFLOP default knee.
  const auto rs =
      check_rules(ZayaConfig::preset("zaya1-base"), builtin_hardware("h200"), opts(4, 8));
  const RuleResult& r = rule(rs, "gemm.knee");
  EXPECT_EQ(r.status, Status::Warn);
  EXPECT_DOUBLE_EQ(r.numbers["knee_gflop"].get<double>(), 200);
  bool seen = false;
  for (auto& g : r.numbers["gemms"])
    if (g["gemm"] == "expert_gate_up") {
      EXPECT_NEAR(g["gflop"].get<double>(), 2.0 * 1024 * 4096 * 2048 * 1e-9, 1e-9);
      seen = true;
    }
  EXPECT_TRUE(seen);
  // With a measured knee of 5 GFLOP every significant GEMM clears it (smallest: down, 8.59).
  HardwareProfile h = builtin_hardware("h200");
  h.knee_gflop = 5;
  EXPECT_EQ(rule(check_rules(ZayaConfig::preset("zaya1-base"), h, opts(4, 8)), "gemm.knee").status,
            Status::Pass);
}

TEST(SizingRules, WaveQuantizationMi300xVersusH200) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  // MI300X, 256×256 tiles, 16,384 tokens: qkv_proj (N = 1536) has 64·6 = 384 tiles on 304 CUs:
  // 2 waves, 384/608 = 0.63; router_down (N = 256, 1.4% of the FLOPs) 64 tiles: 64/304 = 0.21.
  auto m = rule(check_rules(c, builtin_hardware("mi300x"), opts(4, 8)), "gemm.wave");
  EXPECT_EQ(m.status, Status::Warn);
  EXPECT_NEAR(m.numbers["worst"].get<double>(), 64.0 / 304, 1e-12);
  bool seen = false;
  for (auto& g : m.numbers["gemms"])
    if (g["gemm"] == "qkv_proj") {
      EXPECT_NEAR(g["efficiency"].get<double>(), 384.0 / 608, 1e-12);
      seen = true;
    } else if (g["gemm"] == "expert_gate_up") {  // grouped: 16 · 4 · 16 = 1024 tiles, 4 waves
      EXPECT_NEAR(g["efficiency"].get<double>(), 1024.0 / 1216, 1e-12);
    }
  EXPECT_TRUE(seen);
  // H200, 128×256 tiles: qkv 128·6 = 768 tiles on 132 SMs, 6 waves: 768/792; o_proj 1024/1056;
  // grouped experts 16·8·16 = 2048 → 2048/2112 — all 0.97.
  auto h = rule(check_rules(c, builtin_hardware("h200"), opts(4, 8)), "gemm.wave");
  EXPECT_EQ(h.status, Status::Pass);
  EXPECT_NEAR(h.numbers["worst"].get<double>(), 768.0 / 792, 1e-12);
}

TEST(SizingRules, TokensPerExpertAgainstRidge) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  // 1024 tokens/expert: gate_up intensity = 2·1024·4096·2048 / (2·(1024·2048 + 2048·4096 +
  // 1024·4096)) = 585 FLOP/B; MI300X ridge 1307.4/5.3 = 246.7, 2× = 493: pass.
  auto r = rule(check_rules(c, builtin_hardware("mi300x"), opts(4, 8)), "expert.tokens");
  EXPECT_DOUBLE_EQ(r.numbers["tokens_per_expert"].get<double>(), 1024);
  const double want = 2.0 * 1024 * 4096 * 2048 / (2.0 * (1024 * 2048 + 2048 * 4096 + 1024 * 4096));
  EXPECT_NEAR(r.numbers["intensity_flop_per_byte"].get<double>(), want, 1e-9);
  EXPECT_EQ(r.status, Status::Pass);
  // One sequence per micro-batch: 256 tokens/expert, 215.6 FLOP/B < 493: warn.
  r = rule(check_rules(c, builtin_hardware("mi300x"), opts(1, 8)), "expert.tokens");
  EXPECT_DOUBLE_EQ(r.numbers["tokens_per_expert"].get<double>(), 256);
  EXPECT_EQ(r.status, Status::Warn);
  // The token count that reaches 2× ridge sits between the two.
  const double need = r.numbers["tokens_for_2x_ridge"].get<double>();
  EXPECT_GT(need, 256);
  EXPECT_LT(need, 1024);
}

TEST(SizingRules, FlopSplit) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  auto r = rule(check_rules(c, builtin_hardware("h200"), opts(1, 8)), "flops.split");
  EXPECT_EQ(r.status, Status::Pass);
  // Attention scores per token at S = 4096: 40 · 4 · 2048 · 1024.
  EXPECT_DOUBLE_EQ(r.numbers["attention_core_flops"].get<double>(), 40.0 * 4 * 2048 * 1024);
  EXPECT_DOUBLE_EQ(r.numbers["head_flops"].get<double>(), 2.0 * 262272 * 2048);
  // At 128K tokens the scores alone (40·4·65536·1024 = 1.07e13) dwarf the rest (~2.6e9).
  CheckOptions o = opts(1, 8);
  o.train.seq = 131072;
  EXPECT_EQ(rule(check_rules(c, builtin_hardware("h200"), o), "flops.split").status, Status::Warn);
}

TEST(SizingRules, KvCacheFit) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  auto r = rule(check_rules(c, builtin_hardware("h100"), opts(1, 8)), "kv_cache");
  EXPECT_EQ(r.status, Status::Pass);
  EXPECT_EQ(r.numbers["kv_bytes_per_token"], 40960);
  EXPECT_EQ(r.numbers["context"], 32768);  // the preset's max_position_embeddings
  // H100: 0.9·80 GiB − 2·8.84e9 B of weights = 59.6e9 B; one 32K sequence is 1.34e9 B: 44 fit.
  const double free = 0.9 * 80 * 1073741824.0 - 2.0 * 8840488784;
  EXPECT_EQ(r.numbers["sequences_that_fit"].get<double>(), std::floor(free / (40960.0 * 32768)));
  CheckOptions o = opts(1, 8);
  o.context = 2'000'000;  // 81.9 GB of cache per sequence
  EXPECT_EQ(rule(check_rules(c, builtin_hardware("h100"), o), "kv_cache").status, Status::Fail);
}

TEST(SizingRules, MemoryUnderZero1) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const double P = 8840488784.0, M = 40.0 * (5242880 + 659712 + 201326592);
  const double gib = 1073741824.0;
  // MI300X, 8 ranks, 16K tokens, Muon: 2P + 4P + 4P/8 + 4(M + 2(P−M))/8 + 16384·(40·68784 +
  // 536840).
  // Plus the data-parallel step's bucket padding of the fp32 gradients (sizing/zero1_layout.h),
  // a few MB here.
  auto r = rule(check_rules(c, builtin_hardware("mi300x"), opts(4, 8)), "memory");
  const double pad =
      4.0 * double(zero1_layout(c, 8, OptimizerSettings{}, int64_t(25) << 18).padding_elems);
  EXPECT_EQ(r.numbers["bucket_padding_bytes"].get<double>(), pad);
  EXPECT_LT(pad, 1e-3 * 4 * P);
  const double want =
      6 * P + 4 * P / 8 + 4 * (M + 2 * (P - M)) / 8 + 16384.0 * (40 * 68784.0 + 536840) + pad;
  EXPECT_NEAR(r.numbers["total_bytes"].get<double>(), want, 1);
  EXPECT_LT(want, 0.9 * 192 * gib);
  EXPECT_EQ(r.status, Status::Pass);
  // One H100 holding everything: 6P + 4P + 4(M + 2(P−M)) ≈ 126 GB of state alone: fail.
  r = rule(check_rules(c, builtin_hardware("h100"), opts(1, 1)), "memory");
  EXPECT_EQ(r.status, Status::Fail);
  // H100 with 64 ranks: the state shrinks to ~54 GB; 16K tokens of activations (~54 GB) only fit
  // with recomputation (16384·(40·8192 + 68784 + 536840) ≈ 15 GB).
  r = rule(check_rules(c, builtin_hardware("h100"), opts(4, 64)), "memory");
  EXPECT_EQ(r.status, Status::Warn);
  CheckOptions o = opts(4, 64);
  o.train.recompute = true;
  EXPECT_EQ(rule(check_rules(c, builtin_hardware("h100"), o), "memory").status, Status::Pass);
}

TEST(SizingRules, MemoryUnderContextParallelism) {
  // 32K tokens of ZAYA1-base on 8 ranks: with cp = 2 each rank keeps the activations of 16K tokens
  // (16384·(40·68784 + 536840)) plus the other chunk's gathered bf16 keys and values of every
  // layer: 40 · 32768 · (1 − 1/2) · 2 · (2·128) · 2 bytes = 671,088,640.
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  CheckOptions o = opts(1, 8);
  o.train.seq = 32768;
  const auto r1 = rule(check_rules(c, builtin_hardware("h200"), o), "memory");
  o.train.cp = 2;
  const auto r2 = rule(check_rules(c, builtin_hardware("h200"), o), "memory");
  EXPECT_DOUBLE_EQ(r2.numbers["cp_gathered_kv_bytes"].get<double>(), 671088640.0);
  const double act1 = r1.numbers["activations_bytes"].get<double>();
  const double act2 = r2.numbers["activations_bytes"].get<double>();
  EXPECT_NEAR(act2, 16384.0 * (40 * 68784.0 + 536840) + 671088640.0, 1);
  EXPECT_NEAR(act1, 32768.0 * (40 * 68784.0 + 536840), 1);
  // The state is sharded over all 8 ranks either way.
  EXPECT_EQ(r1.numbers["master_bytes"], r2.numbers["master_bytes"]);
  // cp must divide the ranks and 2·cp the sequence.
  o.train.cp = 3;
  EXPECT_THROW(check_rules(c, builtin_hardware("h200"), o), Error);
  o.train.cp = 2;
  o.train.seq = 32766;
  EXPECT_THROW(check_rules(c, builtin_hardware("h200"), o), Error);
}

TEST(SizingRules, CollectivesFollowTheTopology) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  // A 4-GPU group on a fully connected MI300X node gets 3 of 7 links: warned.
  auto m = rule(check_rules(c, builtin_hardware("mi300x"), opts(4, 4)), "collectives");
  EXPECT_EQ(m.status, Status::Warn);
  EXPECT_DOUBLE_EQ(m.numbers["intra_node_busbw_gbs"].get<double>(), 192);
  // The same group on a switched H200 node gets the full 450 GB/s, and 8.84e9·6 B·3/4 / 450e9 =
  // 0.088 s of sync is below the compute time.
  auto h = rule(check_rules(c, builtin_hardware("h200"), opts(4, 4)), "collectives");
  EXPECT_DOUBLE_EQ(h.numbers["intra_node_busbw_gbs"].get<double>(), 450);
  EXPECT_NEAR(h.numbers["comm_s"].get<double>(), 8840488784.0 * 6 * 0.75 / 450e9, 1e-9);
  EXPECT_EQ(h.status, Status::Pass);
  EXPECT_EQ(rule(check_rules(c, builtin_hardware("h200"), opts(4, 1)), "collectives").status,
            Status::Pass);
}

TEST(SizingRules, BadInputIsNamed) {
  ZayaConfig c = ZayaConfig::preset("zaya1-base");
  CheckOptions o = opts(4, 8);
  o.train.global_batch = 33;
  try {
    check_rules(c, builtin_hardware("h200"), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--global-batch 33 must be a positive multiple of"),
              std::string::npos)
        << e.what();
  }
  c.num_attention_heads = 6;
  c.num_key_value_heads = 4;
  EXPECT_THROW(check_rules(c, builtin_hardware("h200"), opts(4, 8)), Error);
}
