#include "bench/bench_model.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/parallel.h"
#include "core/rng.h"

namespace zaya::bench {

namespace {

// normal(0, std) values for benchmark weights: one Philox4x32 counter stream per 1M-element chunk
// (chunks in parallel, so the values depend only on the seed), each Philox output giving four
// values by Box-Muller in float (two pairs of 24-bit uniforms, both the cosine and the sine
// branch). Rng::normal spends four Philox evaluations and double-precision log/cos on each value:
// at 2.2B parameters that took ~35 s of a device call's host time on 16 cores.
void fill_normal(Tensor& t, uint64_t seed, float std) {
  float* p = t.f32();
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  const std::array<uint32_t, 2> key{uint32_t(seed), uint32_t(seed >> 32)};
  parallel_for(chunks, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; c++) {
      const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
      for (int64_t i = i0; i < i1; i += 4) {
        const auto r = philox4x32({uint32_t((i - i0) / 4), uint32_t(c), 0x6e6f726du, 0u}, key);
        float v[4];
        for (int q = 0; q < 2; q++) {
          const float u1 = (float(r[2 * q] >> 8) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
          const float u2 = float(r[2 * q + 1] >> 8) * (1.0f / 16777216.0f);
          const float rad = std::sqrt(-2.0f * std::log(u1)) * std;
          const float a = 6.2831853f * u2;
          v[2 * q] = rad * std::cos(a);
          v[2 * q + 1] = rad * std::sin(a);
        }
        for (int j = 0; j < 4 && i + j < i1; j++) p[i + j] = v[j];
      }
    }
  });
}

}  // namespace

ZayaModel random_model(const ZayaConfig& cfg, uint64_t seed) {
  ZayaConfig small = cfg.with_layers(std::min<int64_t>(2, cfg.num_hidden_layers));
  small.vocab_size = 128;
  small.num_experts = 1;  // the experts (most of the weights) are filled in parallel below
  small.pad_token_id = 0, small.bos_token_id = 2, small.eos_token_id = 1;
  ZayaModel m = ZayaModel::init(small, seed);
  m.cfg = cfg;
  m.embed = Tensor::empty({cfg.vocab_size, cfg.hidden_size}, DType::F32);
  fill_normal(m.embed, seed ^ 0x9e3779b97f4a7c15ull, 0.02f);
  m.layers.resize(size_t(cfg.num_hidden_layers));
  // Layers 2.. start as copies of layer 1's handles (sharing its storage); give each its own.
  for (int64_t l = 2; l < cfg.num_hidden_layers; l++) {
    LayerWeights& w = m.layers[size_t(l)];
    w = m.layers[1];
    for (Tensor* t : {&w.ln_in,
                      &w.ln_post,
                      &w.wq,
                      &w.wk,
                      &w.wv_cur,
                      &w.wv_del,
                      &w.wo,
                      &w.conv_dw_w,
                      &w.conv_dw_b,
                      &w.conv_g_w,
                      &w.conv_g_b,
                      &w.temp,
                      &w.post_attn.hs,
                      &w.post_attn.hb,
                      &w.post_attn.rs,
                      &w.post_attn.rb,
                      &w.post_mlp.hs,
                      &w.post_mlp.hb,
                      &w.post_mlp.rs,
                      &w.post_mlp.rb,
                      &w.r_down_w,
                      &w.r_down_b,
                      &w.r_states_scale,
                      &w.r_norm,
                      &w.r_fc1_w,
                      &w.r_fc1_b,
                      &w.r_fc2_w,
                      &w.r_fc2_b,
                      &w.r_out_w,
                      &w.balancing_bias,
                      &w.experts_gate_up,
                      &w.experts_down})
      if (t->defined()) *t = t->clone();
  }
  const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, D = cfg.hidden_size,
                R = cfg.router_hidden_size;
  const float out_std = 0.02f / std::sqrt(2.0f * float(cfg.num_hidden_layers));
  for (int64_t l = 0; l < cfg.num_hidden_layers; l++) {
    LayerWeights& w = m.layers[size_t(l)];
    const uint64_t ls = seed + 0x100000001b3ull * uint64_t(l + 1);
    w.experts_gate_up = Tensor::empty({E, 2 * I, D}, DType::F32);
    fill_normal(w.experts_gate_up, ls ^ 1, 0.02f);
    w.experts_down = Tensor::empty({E, D, I}, DType::F32);
    fill_normal(w.experts_down, ls ^ 2, out_std);
    w.r_out_w = Tensor::empty({E + 1, R}, DType::F32);
    fill_normal(w.r_out_w, ls ^ 3, 0.02f);
    w.balancing_bias = Tensor::zeros({E + 1});
    w.balancing_bias.f32()[E] = -1.0f;  // skip class, as ZayaModel::init
  }
  return m;
}

}  // namespace zaya::bench
