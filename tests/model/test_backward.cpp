// Tests of the training forward + backward (model/backward.h): the loss against ZayaModel::loss,
// every parameter tensor's gradient against central finite differences of ZayaModel::loss on a
// small random model (both skip-output modes, a sliding-window layer, tokens routed to skip),
// gradient accumulation, determinism across thread counts, the fp32-only guard, and a few SGD
// steps of the tiny preset (with its throughput printed).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/parallel.h"
#include "core/rng.h"
#include "model/backward.h"
#include "model/zaya.h"

using namespace zaya;

namespace {

ZayaConfig small_config(SkipOutput skip) {
  ZayaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.moe_intermediate_size = 12;
  c.num_experts = 3;
  c.router_hidden_size = 8;
  c.layer_types = {"hybrid", "hybrid_sliding"};
  c.sliding_window = 3;
  c.rope_hybrid = {10000.0, 0.5};
  c.rope_sliding = {500.0, 1.0};
  c.max_position_embeddings = 64;
  c.pad_token_id = 0;
  c.bos_token_id = 2;
  c.eos_token_id = 1;
  c.skip_output = skip;
  c.torch_dtype = "float32";
  c.validate("small test config");
  return c;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& v : ids) v = int32_t(rng.next_u32() % uint32_t(vocab));
  return ids;
}

// Targets of ZayaModel::loss: the ids shifted by one, -1 at each sequence's last position.
std::vector<int32_t> shifted(const std::vector<int32_t>& ids, int64_t B, int64_t S) {
  std::vector<int32_t> t(ids.size(), -1);
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s + 1 < S; s++) t[size_t(b * S + s)] = ids[size_t(b * S + s + 1)];
  return t;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// A small model with non-trivial values everywhere (the init's ones and zeros would hide bugs
// in scales, biases and temperatures), and skip balancing biases calibrated per layer so that
// roughly a third of the tokens skip.
ZayaModel random_model(const ZayaConfig& cfg, const std::vector<int32_t>& ids, int64_t B, int64_t S,
                       uint64_t seed) {
  ZayaModel m = ZayaModel::init(cfg, seed);
  Rng rng(seed + 1000);
  for (auto& [name, t] : m.named_tensors()) {
    float* p = t.f32();
    const int64_t n = t.numel();
    const int64_t fan_in = t.dim() >= 2 ? t.size(-1) : 1;
    for (int64_t i = 0; i < n; i++) {
      const float z = rng.normal();
      if (name.find("balancing_biases") != std::string::npos)
        p[i] = 0.0f;
      else if (name.find("conv_qk") != std::string::npos)
        p[i] = 0.4f * z;
      else if (ends_with(name, "temp") || ends_with(name, "_scale") ||
               ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight"))
        p[i] = 1.0f + 0.25f * z;
      else if (ends_with(name, "bias") || ends_with(name, "_bias"))
        p[i] = 0.2f * z;
      else if (ends_with(name, "embed_tokens.weight"))
        p[i] = z;
      else
        p[i] = 1.2f * z / std::sqrt(float(fan_in));
    }
  }
  // Balancing biases, layer by layer (later routing depends on earlier): the balancing rule with
  // targets of ~1/3 of the tokens to skip and the rest spread over the experts, until every
  // expert has tokens and no token is within 0.004 of changing its class (so that perturbations
  // of the finite differences rarely flip a decision).
  const int64_t E = cfg.num_experts, N = B * S;
  auto choices = [&](int64_t li) {
    RoutingRecord rec;
    m.forward(ids, B, S, true, nullptr, &rec);
    return rec.choice[size_t(li)];
  };
  for (int64_t li = 0; li < cfg.num_hidden_layers; li++) {
    float* bias = m.layers[size_t(li)].balancing_bias.f32();
    bool found = false;
    for (int it = 0; it < 2000 && !found; it++) {
      const auto ch = choices(li);
      std::vector<int64_t> counts(size_t(E + 1));
      for (int32_t c : ch) counts[size_t(c)]++;
      const double skip = double(counts[size_t(E)]) / double(N);
      bool ok = skip >= 0.25 && skip <= 0.5;
      for (int64_t e = 0; e < E; e++) ok = ok && counts[size_t(e)] > 0;
      if (ok) {
        bool margin = true;
        for (int64_t c = 0; c <= E && margin; c++)
          for (float delta : {-0.004f, 0.004f}) {
            bias[c] += delta;
            margin = margin && choices(li) == ch;
            bias[c] -= delta;
          }
        if (margin) {
          found = true;
          break;
        }
        bias[rng.next_u32() % uint32_t(E + 1)] += 0.003f * (rng.uniform() - 0.5f);
        continue;
      }
      for (int64_t c = 0; c <= E; c++) {
        const double target = c == E ? 0.35 : 0.65 / double(E);
        bias[c] -= 0.01f * float(double(counts[size_t(c)]) / double(N) - target);
      }
    }
    EXPECT_TRUE(found) << "no balancing biases give a clear routing mix in layer " << li;
  }
  return m;
}

double max_abs(const Tensor& t) {
  double r = 0;
  for (int64_t i = 0; i < t.numel(); i++) r = std::max(r, double(std::fabs(t.f32()[i])));
  return r;
}

class ModelBackwardGrad : public ::testing::TestWithParam<SkipOutput> {};

}  // namespace

TEST(ModelBackward, LossMatchesForwardTinyPreset) {
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 7);
  const int64_t B = 2, S = 48;
  auto ids = random_ids(B * S, m.cfg.vocab_size, 3);
  auto targets = shifted(ids, B, S);
  ModelGrads g = make_grads(m);
  StepStats st = forward_backward(m, ids.data(), targets.data(), B, S, g);
  const double ref = m.loss(ids, B, S);
  EXPECT_NEAR(st.loss, ref, 1e-6 * ref);
  EXPECT_EQ(st.tokens, B * (S - 1));
  ASSERT_EQ(st.routed.size(), size_t(m.cfg.num_hidden_layers));
  for (auto& counts : st.routed) {
    ASSERT_EQ(counts.size(), size_t(m.cfg.num_experts + 1));
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    EXPECT_EQ(total, B * S);
  }
  ASSERT_EQ(g.tensors.size(), m.named_tensors().size());
  EXPECT_GT(max_abs(g.get("model.embed_tokens.weight")), 0.0);
  EXPECT_GT(max_abs(g.get("model.layers.3.self_attn.qkv_proj.q_proj.weight")), 0.0);
  EXPECT_THROW(g.get("model.no_such_tensor"), Error);
}

TEST_P(ModelBackwardGrad, MatchesFiniteDifferences) {
  const ZayaConfig cfg = small_config(GetParam());
  const int64_t B = 2, S = 7;
  auto ids = random_ids(B * S, cfg.vocab_size, 11);
  ZayaModel m = random_model(cfg, ids, B, S, GetParam() == SkipOutput::Zero ? 21 : 22);
  auto targets = shifted(ids, B, S);

  ModelGrads g = make_grads(m);
  StepStats st = forward_backward(m, ids.data(), targets.data(), B, S, g);
  const double ref = m.loss(ids, B, S);
  EXPECT_NEAR(st.loss, ref, 1e-6 * ref);
  RoutingRecord base;
  m.forward(ids, B, S, true, nullptr, &base);
  for (int64_t li = 0; li < cfg.num_hidden_layers; li++) {
    EXPECT_GT(st.routed[size_t(li)][size_t(cfg.num_experts)], 0) << "layer " << li;
    for (int64_t e = 0; e < cfg.num_experts; e++) {
      int64_t n = 0;
      for (int32_t c : base.choice[size_t(li)]) n += c == e;
      EXPECT_EQ(st.routed[size_t(li)][size_t(e)], n);
    }
  }
  double gmax = 0;
  for (auto& [name, t] : g.tensors) gmax = std::max(gmax, max_abs(t));

  // Central differences in fp32: h = 1e-2 keeps the rounding noise of the loss (~1e-6) at ~1e-4
  // of the derivative while the truncation error (h²/6 · f''') stays of the same order.
  const float h = 1e-2f;
  Rng rng(99);
  int checked = 0, flipped = 0;
  double worst_rel = 0, worst_abs = 0;  // relative: over coordinates with |grad| >= 1% of the max
  std::string worst_name;
  const auto named = m.named_tensors();
  for (size_t ti = 0; ti < named.size(); ti++) {
    const auto& [name, w] = named[ti];
    const Tensor& gt = g.tensors[ti].second;
    ASSERT_EQ(g.tensors[ti].first, name);
    if (name.find("balancing_biases") != std::string::npos) {
      EXPECT_EQ(max_abs(gt), 0.0) << name << " must get no gradient";
      continue;
    }
    const double tmax = max_abs(gt);
    EXPECT_GT(tmax, 0.0) << name << " got no gradient at all";
    const int64_t n = w.numel(), samples = std::min<int64_t>(n, 6);
    int tensor_checked = 0;
    for (int64_t s = 0; s < samples; s++) {
      const int64_t i = n <= 6 ? s : int64_t(rng.next_u32() % uint32_t(n));
      float* p = w.f32() + i;
      const float orig = *p;
      RoutingRecord rp, rm;
      *p = orig + h;
      const double lp = m.loss(ids, B, S);
      m.forward(ids, B, S, true, nullptr, &rp);
      *p = orig - h;
      const double lm = m.loss(ids, B, S);
      m.forward(ids, B, S, true, nullptr, &rm);
      *p = orig;
      if (rp.choice != base.choice || rm.choice != base.choice) {
        flipped++;  // the loss is discontinuous across a routing change: no derivative to compare
        continue;
      }
      const double num = (lp - lm) / (2.0 * double(h));
      const double ana = gt.f32()[i];
      const double err = std::fabs(num - ana);
      const double rel = err / std::max(std::fabs(num), std::fabs(ana));
      EXPECT_TRUE(rel < 2e-2 || err < 1e-3 * gmax)
          << name << "[" << i << "]: analytic " << ana << " numeric " << num << " (max grad "
          << gmax << ")";
      worst_abs = std::max(worst_abs, err / gmax);
      if (std::fabs(ana) >= 1e-2 * gmax && rel > worst_rel) {
        worst_rel = rel;
        worst_name = name;
      }
      checked++;
      tensor_checked++;
    }
    EXPECT_GT(tensor_checked, 0) << name << ": every sampled coordinate flipped a routing decision";
  }
  std::printf(
      "[ gradcheck ] %d coordinates checked, %d skipped for routing flips; max |grad| %.3g, "
      "max abs error %.2g of it, max relative error %.2g (%s) where |grad| >= 1%% of the max\n",
      checked, flipped, gmax, worst_abs, worst_rel, worst_name.c_str());
  EXPECT_LE(flipped, checked / 5);
}

INSTANTIATE_TEST_SUITE_P(ModelBackward, ModelBackwardGrad,
                         ::testing::Values(SkipOutput::Zero, SkipOutput::ScaledInput),
                         [](const auto& info) {
                           return info.param == SkipOutput::Zero ? std::string("SkipZero")
                                                                 : std::string("SkipScaledInput");
                         });

TEST(ModelBackward, GradientsAccumulateOverMicroBatches) {
  const ZayaConfig cfg = small_config(SkipOutput::ScaledInput);
  const int64_t B = 2, S = 7;
  auto ids = random_ids(B * S, cfg.vocab_size, 5);
  ZayaModel m = random_model(cfg, ids, B, S, 31);
  auto targets = shifted(ids, B, S);
  // One call over both sequences, against two micro-batches of one sequence at loss_scale 1/2
  // (each sequence has S-1 targets, so the mean over the batch is the mean of the two means).
  ModelGrads whole = make_grads(m), parts = make_grads(m);
  const double loss = forward_backward(m, ids.data(), targets.data(), B, S, whole).loss;
  double lsum = 0;
  for (int64_t b = 0; b < B; b++)
    lsum += forward_backward(m, ids.data() + b * S, targets.data() + b * S, 1, S, parts, 0.5f).loss;
  EXPECT_NEAR(lsum / 2, loss, 1e-6 * loss);
  for (size_t i = 0; i < whole.tensors.size(); i++) {
    const Tensor &a = whole.tensors[i].second, &b = parts.tensors[i].second;
    const double scale = std::max(max_abs(a), 1e-6);
    for (int64_t j = 0; j < a.numel(); j++)
      ASSERT_NEAR(a.f32()[j], b.f32()[j], 1e-5 * scale)
          << whole.tensors[i].first << "[" << j << "]";
  }
  // loss_scale is a plain factor, and a second call adds to (does not overwrite) the first.
  ModelGrads half = make_grads(m);
  forward_backward(m, ids.data(), targets.data(), B, S, half, 0.25f);
  forward_backward(m, ids.data(), targets.data(), B, S, half, 0.25f);
  for (size_t i = 0; i < whole.tensors.size(); i++) {
    const Tensor &a = whole.tensors[i].second, &b = half.tensors[i].second;
    const double scale = max_abs(a);
    for (int64_t j = 0; j < a.numel(); j++)
      ASSERT_NEAR(0.5f * a.f32()[j], b.f32()[j], 1e-6 * scale)
          << whole.tensors[i].first << "[" << j << "]";
  }
  half.zero();
  for (auto& [name, t] : half.tensors) EXPECT_EQ(max_abs(t), 0.0) << name;
}

// The gradients of the tiny preset on a fixed batch, as raw bytes.
std::string tiny_gradient_bytes() {
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 8);
  const int64_t B = 2, S = 40;
  auto ids = random_ids(B * S, m.cfg.vocab_size, 9);
  auto targets = shifted(ids, B, S);
  ModelGrads g = make_grads(m);
  const double loss = forward_backward(m, ids.data(), targets.data(), B, S, g).loss;
  std::string out(reinterpret_cast<const char*>(&loss), sizeof loss);
  for (auto& [name, t] : g.tensors) out.append(static_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

// Helper run in a child process by DeterministicAcrossThreadCounts (the thread count is fixed per
// process through ZAYA_THREADS): writes the gradients to the file named by ZAYA_BWD_DUMP.
TEST(ModelBackward, DumpGradientsForThreadCountCheck) {
  const char* path = std::getenv("ZAYA_BWD_DUMP");
  if (!path) GTEST_SKIP() << "helper of DeterministicAcrossThreadCounts";
  std::ofstream(path, std::ios::binary) << tiny_gradient_bytes();
}

TEST(ModelBackward, DeterministicAcrossThreadCounts) {
  const std::string here = tiny_gradient_bytes();
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  for (int threads : {1, 3}) {
    const std::string dump = ::testing::TempDir() + "zaya_bwd_" + std::to_string(threads) + ".bin";
    const std::string cmd = "ZAYA_THREADS=" + std::to_string(threads) + " ZAYA_BWD_DUMP='" + dump +
                            "' '" + exe +
                            "' --gtest_filter=ModelBackward.DumpGradientsForThreadCountCheck "
                            ">/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(dump, std::ios::binary);
    const std::string there((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::filesystem::remove(dump);
    ASSERT_EQ(there.size(), here.size()) << threads << " threads";
    EXPECT_TRUE(there == here) << "gradients differ between " << num_threads() << " and " << threads
                               << " threads";
  }
}

TEST(ModelBackward, RefusesNonFp32Weights) {
  ZayaModel m = ZayaModel::init(small_config(SkipOutput::Zero), 1);
  m.layers[1].wk = m.layers[1].wk.to(DType::BF16);
  ModelGrads g = make_grads(m);
  const int64_t B = 1, S = 4;
  auto ids = random_ids(B * S, m.cfg.vocab_size, 2);
  auto targets = shifted(ids, B, S);
  try {
    forward_backward(m, ids.data(), targets.data(), B, S, g);
    FAIL() << "a bf16 weight was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.self_attn.qkv_proj.k_proj.weight"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("fp32"), std::string::npos) << e.what();
  }
}

// A few plain SGD steps of the tiny preset on one batch of a repetitive text must lower the loss;
// prints the throughput of forward_backward.
TEST(ModelBackward, TinyPresetSgdLowersLoss) {
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 4);
  const int64_t B = 2, S = 256;
  std::vector<int32_t> ids(size_t(B * S));
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  for (int64_t n = 0; n < B * S; n++) ids[size_t(n)] = int32_t(uint8_t(text[size_t(n % 45)]));
  auto targets = shifted(ids, B, S);
  ModelGrads g = make_grads(m);
  const auto named = m.named_tensors();
  std::vector<double> losses;
  double seconds = 0;
  const int steps = 3;
  for (int step = 0; step < steps; step++) {
    g.zero();
    auto t0 = std::chrono::steady_clock::now();
    losses.push_back(forward_backward(m, ids.data(), targets.data(), B, S, g).loss);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < named.size(); i++) {
      if (named[i].first.find("balancing_biases") != std::string::npos) continue;
      float* w = named[i].second.f32();
      const float* gw = g.tensors[i].second.f32();
      for (int64_t j = 0; j < named[i].second.numel(); j++) w[j] -= 0.1f * gw[j];
    }
  }
  std::printf("[ tiny ] losses %.4f -> %.4f; forward_backward %.0f tokens/s (%d threads)\n",
              losses.front(), losses.back(), double(steps * B * S) / seconds, num_threads());
  EXPECT_LT(losses.back(), losses.front() - 0.05);
  EXPECT_TRUE(std::isfinite(losses.back()));
}
