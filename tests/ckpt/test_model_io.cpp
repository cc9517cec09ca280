// Checkpoint I/O of the model: transformers-layout round trips (fp32 and bf16, sharded), the
// original alternating-stage release layout, and the errors a user sees for bad checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/model_io.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/zaya.h"
#include "original_layout.h"

using namespace zaya;
namespace fs = std::filesystem;

namespace {

ZayaConfig small_config() {
  ZayaConfig c = ZayaConfig::preset("tiny");
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.moe_intermediate_size = 16;
  c.num_experts = 3;
  c.router_hidden_size = 8;
  c.vocab_size = 64;
  c.pad_token_id = 0;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

// A model whose every tensor is random, so no mapping error can hide behind a constant.
ZayaModel random_model(const ZayaConfig& c, uint64_t seed) {
  ZayaModel m = ZayaModel::init(c, seed);
  Rng r(seed + 1);
  for (auto& [name, t] : m.named_tensors()) {
    float* p = t.f32();
    for (int64_t i = 0; i < t.numel(); i++) p[i] += 0.1f * r.normal();
  }
  return m;
}

std::string tmpdir(const std::string& name) {
  std::string d = (fs::temp_directory_path() / ("zaya_model_io_" + name)).string();
  fs::remove_all(d);
  return d;
}

std::vector<int32_t> some_ids(int64_t n, int64_t V) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; i++) ids.push_back(int32_t((i * 37 + 11) % V));
  return ids;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write_text(const std::string& path, const std::string& s) {
  std::ofstream(path) << s;
}

}  // namespace

TEST(ModelIO, SaveLoadRoundTripIsBitExact) {
  ZayaModel m = random_model(small_config(), 5);
  const std::string d = tmpdir("rt");
  save_model(m, d, DType::F32, 20000);  // small shards: exercises the index
  EXPECT_TRUE(fs::exists(d + "/model.safetensors.index.json"));
  ZayaModel l = load_model(d);
  auto a = m.named_tensors(), b = l.named_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) {
    ASSERT_EQ(a[i].first, b[i].first);
    Tensor x = a[i].second.to(DType::F32), y = b[i].second.to(DType::F32);
    ASSERT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << a[i].first;
  }
  auto ids = some_ids(10, m.cfg.vocab_size);
  Tensor la = m.forward(ids, 1, 10), lb = l.forward(ids, 1, 10);
  EXPECT_EQ(0, std::memcmp(la.raw(), lb.raw(), la.nbytes()));
}

TEST(ModelIO, Bf16CheckpointKeepsMatricesInBf16) {
  ZayaModel m = random_model(small_config(), 6);
  const std::string d = tmpdir("bf16");
  save_model(m, d, DType::BF16);
  ZayaModel l = load_model(d);
  EXPECT_EQ(l.layers[0].wq.dtype(), DType::BF16);
  EXPECT_EQ(l.layers[0].experts_gate_up.dtype(), DType::BF16);
  EXPECT_EQ(l.layers[0].ln_in.dtype(), DType::F32);
  EXPECT_EQ(l.layers[0].balancing_bias.dtype(), DType::F32);
  // The bf16 model computes the fp32 model with rounded weights: close, not equal.
  auto ids = some_ids(9, m.cfg.vocab_size);
  Tensor la = m.forward(ids, 1, 9), lb = l.forward(ids, 1, 9);
  double num = 0, den = 0;
  for (int64_t i = 0; i < la.numel(); i++) {
    num += std::pow(la.f32()[i] - lb.f32()[i], 2);
    den += std::pow(la.f32()[i], 2);
  }
  EXPECT_LT(std::sqrt(num / den), 2e-2);
  EXPECT_GT(num, 0.0);
}

TEST(ModelIO, LoadsTheOriginalReleaseLayout) {
  ZayaConfig c = small_config();
  ZayaModel m = random_model(c, 7);
  const std::string d = tmpdir("orig");
  test_util::save_original_layout(m, d);
  ZayaModel l = load_model(d);
  EXPECT_EQ(l.cfg.num_hidden_layers, 2);
  EXPECT_EQ(l.cfg.skip_output, SkipOutput::ScaledInput);  // the release's skip behaviour
  m.cfg.skip_output = SkipOutput::ScaledInput;
  auto ids = some_ids(12, c.vocab_size);
  Tensor la = m.forward(ids, 1, 12), lb = l.forward(ids, 1, 12);
  EXPECT_EQ(0, std::memcmp(la.raw(), lb.raw(), la.nbytes()));
}

TEST(ModelIO, SkipOutputModesDifferOnlyForSkippedTokens) {
  ZayaModel m = random_model(small_config(), 8);
  auto ids = some_ids(8, m.cfg.vocab_size);
  // All tokens to skip: the experts must then not matter, and the two skip modes must differ.
  for (auto& L : m.layers) L.balancing_bias.f32()[m.cfg.num_experts] = 10.0f;
  Tensor z = m.forward(ids, 1, 8);
  for (auto& L : m.layers) L.experts_down.fill(0.5f);
  Tensor z2 = m.forward(ids, 1, 8);
  EXPECT_EQ(0, std::memcmp(z.raw(), z2.raw(), z.nbytes()));
  m.cfg.skip_output = SkipOutput::ScaledInput;
  Tensor s = m.forward(ids, 1, 8);
  EXPECT_NE(0, std::memcmp(z.raw(), s.raw(), z.nbytes()));
}

TEST(ModelIO, BadCheckpointsGiveClearErrors) {
  ZayaModel m = random_model(small_config(), 9);
  const std::string d = tmpdir("bad");
  save_model(m, d);
  // Missing tensors are listed by name.
  {
    auto t = m.named_tensors();
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](auto& p) {
                             return p.first.find("layers.1.self_attn.qk_norm.temp") !=
                                        std::string::npos ||
                                    p.first == "model.norm.weight";
                           }),
            t.end());
    const std::string d2 = tmpdir("missing");
    fs::create_directories(d2);
    save_safetensors(d2 + "/model.safetensors", t);
    fs::copy_file(d + "/config.json", d2 + "/config.json");
    std::string e = error_of([&] { load_model(d2); });
    EXPECT_NE(e.find("2 tensor(s) missing"), std::string::npos) << e;
    EXPECT_NE(e.find("model.layers.1.self_attn.qk_norm.temp"), std::string::npos) << e;
    EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  }
  // Wrong shape: names the tensor, the expected and the found shape.
  {
    auto t = m.named_tensors();
    for (auto& p : t)
      if (p.first == "model.layers.0.self_attn.o_proj.weight") p.second = Tensor::zeros({32, 31});
    const std::string d3 = tmpdir("shape");
    fs::create_directories(d3);
    save_safetensors(d3 + "/model.safetensors", t);
    fs::copy_file(d + "/config.json", d3 + "/config.json");
    std::string e = error_of([&] { load_model(d3); });
    EXPECT_NE(e.find("model.layers.0.self_attn.o_proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("[32, 31]"), std::string::npos) << e;
    EXPECT_NE(e.find("[32, 32]"), std::string::npos) << e;
  }
  // Config problems.
  {
    const std::string d4 = tmpdir("cfg");
    fs::create_directories(d4);
    fs::copy_file(d + "/model.safetensors", d4 + "/model.safetensors");
    EXPECT_NE(error_of([&] { load_model(d4); }).find("missing config.json"), std::string::npos);
    write_text(d4 + "/config.json", "{\"model_type\": \"zaya\", ");
    EXPECT_NE(error_of([&] { load_model(d4); }).find("malformed JSON"), std::string::npos);
    nlohmann::json c = m.cfg.to_json();
    c["model_type"] = "llama";
    write_text(d4 + "/config.json", c.dump());
    EXPECT_NE(error_of([&] { load_model(d4); }).find("model_type is \"llama\""), std::string::npos);
    c = m.cfg.to_json();
    c["num_attention_heads"] = 3;
    write_text(d4 + "/config.json", c.dump());
    EXPECT_NE(error_of([&] { load_model(d4); }).find("multiple of num_key_value_heads"),
              std::string::npos);
  }
  // Truncated weights file.
  {
    const std::string d5 = tmpdir("trunc");
    fs::create_directories(d5);
    fs::copy_file(d + "/config.json", d5 + "/config.json");
    fs::copy_file(d + "/model.safetensors", d5 + "/model.safetensors");
    fs::resize_file(d5 + "/model.safetensors", fs::file_size(d5 + "/model.safetensors") - 100);
    std::string e = error_of([&] { load_model(d5); });
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  }
  // Token ids outside the vocabulary.
  std::string e = error_of([&] { m.forward({1, 2, 64}, 1, 3); });
  EXPECT_NE(e.find("token id 64 at position 2"), std::string::npos) << e;
}
