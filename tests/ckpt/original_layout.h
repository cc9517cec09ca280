// A writer of the original ZAYA1-base release layout for tests (tests/ckpt/test_model_io.cpp,
// tests/train/test_train_init.cpp): no such checkpoint is small enough to keep as a fixture, so the
// tests write one from a model. Header-only; deliberately not in src/ (zaya reads that layout and
// never writes it).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "model/zaya.h"

namespace zaya::test_util {

// Writes `m` in the original ZAYA1-base release layout, following ZAYA1.md §2 independently of the
// loader's mapping: stage 2j is layer j's attention, stage 2j+1 its MoE; stage 0's res_scale is the
// input affine, stage 2j+1's the post-attention set, stage 2j+2's (and the final one) post-MoE.
inline void save_original_layout(const ZayaModel& m, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> t;
  auto rs = [&](const std::string& p, const ResidualScaleWeights& w) {
    t.emplace_back(p + "hidden_states_scale", w.hs);
    t.emplace_back(p + "hidden_states_bias", w.hb);
    t.emplace_back(p + "residual_scale", w.rs);
    t.emplace_back(p + "residual_bias", w.rb);
  };
  t.emplace_back("model.embed_tokens.weight", m.embed);
  t.emplace_back("model.layers.0.res_scale.hidden_states_scale", m.input_scale);
  t.emplace_back("model.layers.0.res_scale.hidden_states_bias", m.input_bias);
  t.emplace_back("model.final_norm.weight", m.final_norm);
  const int64_t L = int64_t(m.layers.size());
  for (int64_t j = 0; j < L; j++) {
    const auto& w = m.layers[size_t(j)];
    const std::string a = "model.layers." + std::to_string(2 * j) + ".";
    const std::string b = "model.layers." + std::to_string(2 * j + 1) + ".";
    t.emplace_back(a + "input_norm.weight", w.ln_in);
    t.emplace_back(a + "self_attn.qkv.linear_q.weight", w.wq);
    t.emplace_back(a + "self_attn.qkv.linear_k.weight", w.wk);
    t.emplace_back(a + "self_attn.qkv.val_proj1.weight", w.wv_cur);
    t.emplace_back(a + "self_attn.qkv.val_proj2.weight", w.wv_del);
    t.emplace_back(a + "self_attn.qkv.conv_qk.0.weight", w.conv_dw_w);
    t.emplace_back(a + "self_attn.qkv.conv_qk.0.bias", w.conv_dw_b);
    t.emplace_back(a + "self_attn.qkv.conv_qk.1.weight", w.conv_g_w);
    t.emplace_back(a + "self_attn.qkv.conv_qk.1.bias", w.conv_g_b);
    t.emplace_back(a + "self_attn.qkv.temp", w.temp);
    t.emplace_back(a + "self_attn.linear_proj.weight", w.wo);
    if (j > 0) rs(a + "res_scale.", m.layers[size_t(j - 1)].post_mlp);
    t.emplace_back(b + "input_norm.weight", w.ln_post);
    rs(b + "res_scale.", w.post_attn);
    t.emplace_back(b + "zaya_block.router.down_proj.weight", w.r_down_w);
    t.emplace_back(b + "zaya_block.router.down_proj.bias", w.r_down_b);
    if (j > 0) t.emplace_back(b + "zaya_block.router.router_states_scale", w.r_states_scale);
    t.emplace_back(b + "zaya_block.router.rmsnorm_eda.weight", w.r_norm);
    t.emplace_back(b + "zaya_block.router.router_mlp.0.weight", w.r_fc1_w);
    t.emplace_back(b + "zaya_block.router.router_mlp.0.bias", w.r_fc1_b);
    t.emplace_back(b + "zaya_block.router.router_mlp.2.weight", w.r_fc2_w);
    t.emplace_back(b + "zaya_block.router.router_mlp.2.bias", w.r_fc2_b);
    t.emplace_back(b + "zaya_block.router.router_mlp.4.weight", w.r_out_w);
    t.emplace_back(b + "zaya_block.router.balancing_biases", w.balancing_bias);
    for (int64_t e = 0; e < m.cfg.num_experts; e++) {
      const std::string x = b + "zaya_block.experts.local_experts." + std::to_string(e) + ".";
      t.emplace_back(x + "linear_fc1.weight", w.experts_gate_up.select(0, e).clone());
      t.emplace_back(x + "linear_fc2.weight", w.experts_down.select(0, e).clone());
    }
  }
  rs("model.res_scale.", m.layers[size_t(L - 1)].post_mlp);
  save_safetensors(dir + "/model.safetensors", t);
  nlohmann::json c = m.cfg.to_json();
  c["num_hidden_layers"] = 999;  // stale in the release: the tensors define the stack
  c.erase("layer_types");
  std::ofstream(dir + "/config.json") << c.dump();
}

}  // namespace zaya::test_util
