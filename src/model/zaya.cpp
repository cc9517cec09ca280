// ZAYA1 forward pass on the CPU reference ops, initialisation and the named-weight visitor. See
// zaya.h (checkpoint I/O is in ckpt/model_io.cpp).
#include "model/zaya.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "core/log.h"
#include "core/rng.h"

namespace zaya {

namespace {

Tensor randn(const Shape& shape, Rng& rng, float std) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.f32();
  rng.fill_normal(p, t.numel(), std);  // rng.normal() * std per element, on the worker threads
  return t;
}
Tensor filled(const Shape& shape, float v) {
  Tensor t = Tensor::empty(shape, DType::F32);
  t.fill(v);
  return t;
}

// Visits every weight of the model with its `transformers` name. The same visitor serves naming,
// loading and saving so the three never disagree.
template <typename M, typename F>
void visit(M& m, F&& f) {
  f("model.embed_tokens.weight", m.embed);
  f("model.input_hidden_states_scale", m.input_scale);
  f("model.input_hidden_states_bias", m.input_bias);
  f("model.norm.weight", m.final_norm);
  for (size_t i = 0; i < m.layers.size(); i++) {
    auto& L = m.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    f(p + "input_layernorm.weight", L.ln_in);
    f(p + "post_attention_layernorm.weight", L.ln_post);
    f(p + "self_attn.qkv_proj.q_proj.weight", L.wq);
    f(p + "self_attn.qkv_proj.k_proj.weight", L.wk);
    f(p + "self_attn.qkv_proj.v_proj_current.weight", L.wv_cur);
    f(p + "self_attn.qkv_proj.v_proj_delayed.weight", L.wv_del);
    f(p + "self_attn.qkv_proj.conv_qk_depthwise.weight", L.conv_dw_w);
    f(p + "self_attn.qkv_proj.conv_qk_depthwise.bias", L.conv_dw_b);
    f(p + "self_attn.qkv_proj.conv_qk_grouped.weight", L.conv_g_w);
    f(p + "self_attn.qkv_proj.conv_qk_grouped.bias", L.conv_g_b);
    f(p + "self_attn.qk_norm.temp", L.temp);
    f(p + "self_attn.o_proj.weight", L.wo);
    for (auto [set, rsw] : {std::pair{"post_attention_residual_scale.", &L.post_attn},
                            std::pair{"post_mlp_residual_scale.", &L.post_mlp}}) {
      f(p + set + "hidden_states_scale", rsw->hs);
      f(p + set + "hidden_states_bias", rsw->hb);
      f(p + set + "residual_scale", rsw->rs);
      f(p + set + "residual_bias", rsw->rb);
    }
    f(p + "mlp.gate.down_proj.weight", L.r_down_w);
    f(p + "mlp.gate.down_proj.bias", L.r_down_b);
    if (i > 0) f(p + "mlp.gate.router_states_scale", L.r_states_scale);
    f(p + "mlp.gate.router_mlp.norm.weight", L.r_norm);
    f(p + "mlp.gate.router_mlp.fc1.weight", L.r_fc1_w);
    f(p + "mlp.gate.router_mlp.fc1.bias", L.r_fc1_b);
    f(p + "mlp.gate.router_mlp.fc2.weight", L.r_fc2_w);
    f(p + "mlp.gate.router_mlp.fc2.bias", L.r_fc2_b);
    f(p + "mlp.gate.router_mlp.out_proj.weight", L.r_out_w);
    f(p + "mlp.gate.balancing_biases", L.balancing_bias);
    f(p + "mlp.experts.gate_up_proj", L.experts_gate_up);
    f(p + "mlp.experts.down_proj", L.experts_down);
  }
}

}  // namespace

std::vector<std::pair<std::string, Shape>> tensor_shapes_in_order(const ZayaConfig& c) {
  const int64_t D = c.hidden_size, d = c.head_dim, Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads, C = c.conv_channels(), R = c.router_hidden_size,
                E = c.num_experts, I = c.moe_intermediate_size;
  std::vector<std::pair<std::string, Shape>> s;
  ZayaModel shape_only;
  shape_only.layers.resize(size_t(c.num_hidden_layers));
  visit(shape_only, [&](const std::string& name, Tensor&) {
    auto ends = [&](const char* suf) {
      const std::string x(suf);
      return name.size() >= x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0;
    };
    Shape sh{D};
    if (ends("embed_tokens.weight"))
      sh = {c.vocab_size, D};
    else if (ends("q_proj.weight"))
      sh = {Hq * d, D};
    else if (ends("k_proj.weight"))
      sh = {Hkv * d, D};
    else if (ends("v_proj_current.weight") || ends("v_proj_delayed.weight"))
      sh = {Hkv * d / 2, D};
    else if (ends("conv_qk_depthwise.weight"))
      sh = {C, 1, c.cca_time0};
    else if (ends("conv_qk_grouped.weight"))
      sh = {C, d, c.cca_time1};
    else if (ends("conv_qk_depthwise.bias") || ends("conv_qk_grouped.bias"))
      sh = {C};
    else if (ends("qk_norm.temp"))
      sh = {Hkv};
    else if (ends("o_proj.weight"))
      sh = {D, Hq * d};
    else if (ends("gate.down_proj.weight"))
      sh = {R, D};
    else if (ends("fc1.weight") || ends("fc2.weight"))
      sh = {R, R};
    else if (ends("out_proj.weight"))
      sh = {E + 1, R};
    else if (ends("balancing_biases"))
      sh = {E + 1};
    else if (ends("gate_up_proj"))
      sh = {E, 2 * I, D};
    else if (ends("experts.down_proj"))
      sh = {E, D, I};
    else if (name.find("mlp.gate.") != std::string::npos)
      sh = {R};
    s.emplace_back(name, sh);
  });
  return s;
}

std::map<std::string, Shape> expected_tensor_shapes(const ZayaConfig& c) {
  std::map<std::string, Shape> m;
  for (auto& [name, sh] : tensor_shapes_in_order(c)) m.emplace(std::move(name), std::move(sh));
  return m;
}

bool continues_packed_qkv(const std::string& n) {
  auto ends = [&](const char* suf) {
    const std::string x(suf);
    return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
  };
  return ends("k_proj.weight") || ends("v_proj_current.weight") || ends("v_proj_delayed.weight");
}

bool is_matrix_tensor(const std::string& n, const Shape& sh) {
  return sh.size() >= 2 && n.find("conv_qk") == std::string::npos;
}

ZayaModel ZayaModel::init(const ZayaConfig& cfg, uint64_t seed, float init_std) {
  cfg.validate("model config");
  ZayaModel m;
  m.cfg = cfg;
  m.layers.resize(size_t(cfg.num_hidden_layers));
  auto shapes = expected_tensor_shapes(cfg);
  Rng rng(seed);
  const float out_std = init_std / std::sqrt(2.0f * float(cfg.num_hidden_layers));
  visit(m, [&](const std::string& name, Tensor& t) {
    const Shape& sh = shapes.at(name);
    auto ends = [&](const char* suf) { return name.find(suf) != std::string::npos; };
    if (ends("balancing_biases")) {
      t = filled(sh, 0.0f);
      t.f32()[sh[0] - 1] = -1.0f;
    } else if (ends("conv_qk")) {
      if (ends(".bias"))
        t = filled(sh, 0.0f);
      else
        t = randn(sh, rng, 1.0f / std::sqrt(float(sh[1] * sh[2])));
    } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      // Biases first: the residual-scale biases live under "..._residual_scale." and must not
      // take the scales' 1.
      t = filled(sh, 0.0f);
    } else if (ends("temp") || ends("_scale") || ends("norm.weight") || ends("layernorm")) {
      t = filled(sh, 1.0f);
    } else if (ends("o_proj") || ends("experts.down_proj")) {
      t = randn(sh, rng, out_std);
    } else {
      t = randn(sh, rng, init_std);
    }
  });
  return m;
}

std::vector<std::pair<std::string, Tensor>> ZayaModel::named_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit(*this, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<std::pair<std::string, Tensor*>> ZayaModel::tensor_slots() {
  std::vector<std::pair<std::string, Tensor*>> out;
  visit(*this, [&](const std::string& n, Tensor& t) { out.emplace_back(n, &t); });
  return out;
}

InferenceCache ZayaModel::new_cache(int64_t batch, int64_t capacity) const {
  InferenceCache c;
  c.batch = batch;
  c.capacity = capacity;
  const int64_t P = (cfg.cca_time0 - 1) + (cfg.cca_time1 - 1);
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim;
  c.layers.resize(size_t(cfg.num_hidden_layers));
  for (auto& l : c.layers) {
    l.k.assign(size_t(batch * capacity * kv), 0.0f);
    l.v.assign(size_t(batch * capacity * kv), 0.0f);
    l.conv_hist.assign(size_t(batch * P * cfg.conv_channels()), 0.0f);
    l.v_del_last.assign(size_t(batch * kv / 2), 0.0f);
  }
  return c;
}

void ZayaModel::attention_forward(int64_t li, const float* x, float* out, int64_t B, int64_t S,
                                  InferenceCache* cache) const {
  const LayerWeights& L = layers[size_t(li)];
  const int64_t D = cfg.hidden_size, d = cfg.head_dim, Hq = cfg.num_attention_heads,
                Hkv = cfg.num_key_value_heads, C = cfg.conv_channels(), N = B * S, QD = Hq * d,
                KD = Hkv * d, VH = KD / 2;
  const int64_t t0 = cfg.cca_time0, t1 = cfg.cca_time1, P = (t0 - 1) + (t1 - 1);
  const int64_t past = cache ? cache->length : 0;
  std::vector<float> qk0(size_t(N * C)), q0(size_t(N * QD)), k0(size_t(N * KD));
  cpu::linear(q0.data(), x, L.wq, nullptr, N, D, QD);
  cpu::linear(k0.data(), x, L.wk, nullptr, N, D, KD);
  std::vector<float> mq(size_t(N * QD)), mk(size_t(N * KD));
  cpu::cca_mean_skip(mq.data(), mk.data(), q0.data(), k0.data(), N, Hq, Hkv, d);
  for (int64_t n = 0; n < N; n++) {
    std::copy_n(q0.data() + n * QD, QD, qk0.data() + n * C);
    std::copy_n(k0.data() + n * KD, KD, qk0.data() + n * C + QD);
  }
  std::vector<float> conv(size_t(N * C));
  LayerCache* lc = cache ? &cache->layers[size_t(li)] : nullptr;
  cpu::cca_conv(conv.data(), nullptr, qk0.data(), lc && past > 0 ? lc->conv_hist.data() : nullptr,
                L.conv_dw_w.f32(), L.conv_dw_b.f32(), L.conv_g_w.f32(), L.conv_g_b.f32(), B, S, C,
                d, t0, t1);
  if (lc) {  // keep the last P raw columns: the tail of [history | new inputs]
    std::vector<float> nh(lc->conv_hist.size());
    for (int64_t b = 0; b < B; b++)
      for (int64_t p = 0; p < P; p++) {
        const int64_t i = S + p;  // index into the padded sequence [hist(P) | x(S)]
        const float* src =
            i >= P ? qk0.data() + (b * S + i - P) * C : lc->conv_hist.data() + (b * P + i) * C;
        std::copy_n(src, C, nh.data() + (b * P + p) * C);
      }
    lc->conv_hist.swap(nh);
  }
  std::vector<float> q(size_t(N * QD)), k(size_t(N * KD)), v(size_t(N * KD));
  for (int64_t n = 0; n < N; n++) {
    for (int64_t i = 0; i < QD; i++) q[n * QD + i] = conv[n * C + i] + mq[n * QD + i];
    for (int64_t i = 0; i < KD; i++) k[n * KD + i] = conv[n * C + QD + i] + mk[n * KD + i];
  }
  std::vector<float> vc(size_t(N * VH)), vd(size_t(N * VH));
  cpu::linear(vc.data(), x, L.wv_cur, nullptr, N, D, VH);
  cpu::linear(vd.data(), x, L.wv_del, nullptr, N, D, VH);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < S; t++) {
      const int64_t n = b * S + t;
      std::copy_n(vc.data() + n * VH, VH, v.data() + n * KD);
      const float* prev = t > 0 ? vd.data() + (n - 1) * VH
                                : (lc && past > 0 ? lc->v_del_last.data() + b * VH : nullptr);
      for (int64_t i = 0; i < VH; i++) v[n * KD + VH + i] = prev ? prev[i] : 0.0f;
    }
  if (lc)
    for (int64_t b = 0; b < B; b++)
      std::copy_n(vd.data() + (b * S + S - 1) * VH, VH, lc->v_del_last.data() + b * VH);
  cpu::qk_norm(q.data(), nullptr, q.data(), nullptr, N, Hq, d);
  cpu::qk_norm(k.data(), nullptr, k.data(), L.temp.f32(), N, Hkv, d);
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; n++) pos[size_t(n)] = past + n % S;
  const RopeSettings& rs = cfg.rope_for_layer(li);
  const int64_t r = int64_t(double(d) * rs.partial_rotary_factor);
  cpu::rope(q.data(), pos.data(), rs.theta, N, Hq, d, r);
  cpu::rope(k.data(), pos.data(), rs.theta, N, Hkv, d, r);
  const int64_t window = cfg.layer_is_sliding(li) ? cfg.sliding_window : 0;
  std::vector<float> att(size_t(N * QD));
  if (lc) {
    ZAYA_CHECK(past + S <= cache->capacity, "decoding past the cache capacity of {} tokens",
               cache->capacity);
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < S; t++) {
        const size_t dst = size_t(((b * cache->capacity) + past + t) * KD);
        std::copy_n(k.data() + (b * S + t) * KD, KD, lc->k.data() + dst);
        std::copy_n(v.data() + (b * S + t) * KD, KD, lc->v.data() + dst);
      }
    cpu::attention(att.data(), nullptr, q.data(), lc->k.data(), lc->v.data(), B, S, cache->capacity,
                   past, Hq, Hkv, d, window);
  } else {
    cpu::attention(att.data(), nullptr, q.data(), k.data(), v.data(), B, S, S, 0, Hq, Hkv, d,
                   window);
  }
  cpu::linear(out, att.data(), L.wo, nullptr, N, QD, D);
}

void ZayaModel::moe_forward(int64_t li, const float* x, float* out, std::vector<float>& rstate,
                            int64_t N, std::vector<int32_t>* choices) const {
  const LayerWeights& L = layers[size_t(li)];
  const int64_t D = cfg.hidden_size, R = cfg.router_hidden_size, E = cfg.num_experts,
                I = cfg.moe_intermediate_size;
  std::vector<float> r(size_t(N * R));
  cpu::linear(r.data(), x, L.r_down_w, L.r_down_b.f32(), N, D, R);
  if (li > 0) {
    const float* sc = L.r_states_scale.f32();
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < R; i++) r[n * R + i] += rstate[n * R + i] * sc[i];
  }
  rstate = r;  // EDA: the next layer's router sees this layer's state (before the norm)
  std::vector<float> rn(size_t(N * R)), h1(size_t(N * R)), h2(size_t(N * R)),
      logits(size_t(N * (E + 1))), probs(size_t(N * (E + 1))), gate(static_cast<size_t>(N));
  std::vector<int32_t> choice(static_cast<size_t>(N));
  cpu::rmsnorm(rn.data(), nullptr, r.data(), L.r_norm.f32(), float(cfg.rms_norm_eps), N, R);
  cpu::linear(h1.data(), rn.data(), L.r_fc1_w, L.r_fc1_b.f32(), N, R, R);
  cpu::gelu(h1.data(), h1.data(), N * R);
  cpu::linear(h2.data(), h1.data(), L.r_fc2_w, L.r_fc2_b.f32(), N, R, R);
  cpu::gelu(h2.data(), h2.data(), N * R);
  cpu::linear(logits.data(), h2.data(), L.r_out_w, nullptr, N, R, E + 1);
  cpu::router_select(probs.data(), choice.data(), gate.data(), logits.data(),
                     L.balancing_bias.f32(), N, E + 1);
  if (choices) *choices = choice;
  // Dispatch: gather each expert's tokens, run its SwiGLU MLP on them, scatter back scaled by p[e].
  std::vector<std::vector<int64_t>> rows(size_t(E + 1));
  for (int64_t n = 0; n < N; n++) rows[size_t(choice[size_t(n)])].push_back(n);
  std::fill(out, out + N * D, 0.0f);
  for (int64_t e = 0; e < E; e++) {
    const auto& idx = rows[size_t(e)];
    const int64_t ne = int64_t(idx.size());
    if (!ne) continue;
    std::vector<float> xe(size_t(ne * D)), gu(size_t(ne * 2 * I)), act(size_t(ne * I)),
        ye(size_t(ne * D));
    for (int64_t j = 0; j < ne; j++) std::copy_n(x + idx[size_t(j)] * D, D, xe.data() + j * D);
    cpu::linear(gu.data(), xe.data(), L.experts_gate_up.select(0, e), nullptr, ne, D, 2 * I);
    cpu::swiglu(act.data(), gu.data(), ne, I);
    cpu::linear(ye.data(), act.data(), L.experts_down.select(0, e), nullptr, ne, I, D);
    for (int64_t j = 0; j < ne; j++) {
      const int64_t n = idx[size_t(j)];
      for (int64_t i = 0; i < D; i++) out[n * D + i] = gate[size_t(n)] * ye[size_t(j * D + i)];
    }
  }
  if (cfg.skip_output == SkipOutput::ScaledInput)
    for (int64_t n : rows[size_t(E)])
      for (int64_t i = 0; i < D; i++) out[n * D + i] = gate[size_t(n)] * x[n * D + i];
}

Tensor ZayaModel::forward(const std::vector<int32_t>& ids, int64_t B, int64_t S, bool all_logits,
                          InferenceCache* cache, RoutingRecord* routing) const {
  ZAYA_CHECK(int64_t(ids.size()) == B * S, "forward: {} ids for batch {} x sequence {}", ids.size(),
             B, S);
  ZAYA_CHECK(!cache || cache->batch == B, "forward: cache batch {} != {}", cache ? cache->batch : 0,
             B);
  const int64_t D = cfg.hidden_size, N = B * S, V = cfg.vocab_size;
  const float eps = float(cfg.rms_norm_eps);
  std::vector<float> h(size_t(N * D)), x(size_t(N * D)), a(size_t(N * D)),
      rstate(size_t(N * cfg.router_hidden_size));
  cpu::embedding(h.data(), ids.data(), embed, N, D);
  cpu::affine(h.data(), h.data(), input_scale.f32(), input_bias.f32(), N, D);
  if (routing) routing->choice.assign(layers.size(), {});
  for (int64_t li = 0; li < int64_t(layers.size()); li++) {
    const LayerWeights& L = layers[size_t(li)];
    cpu::rmsnorm(x.data(), nullptr, h.data(), L.ln_in.f32(), eps, N, D);
    attention_forward(li, x.data(), a.data(), B, S, cache);
    cpu::residual_scale(h.data(), a.data(), h.data(), L.post_attn.hs.f32(), L.post_attn.hb.f32(),
                        L.post_attn.rs.f32(), L.post_attn.rb.f32(), N, D);
    cpu::rmsnorm(x.data(), nullptr, h.data(), L.ln_post.f32(), eps, N, D);
    moe_forward(li, x.data(), a.data(), rstate, N,
                routing ? &routing->choice[size_t(li)] : nullptr);
    cpu::residual_scale(h.data(), a.data(), h.data(), L.post_mlp.hs.f32(), L.post_mlp.hb.f32(),
                        L.post_mlp.rs.f32(), L.post_mlp.rb.f32(), N, D);
  }
  if (cache) cache->length += S;
  const int64_t keep = all_logits ? S : 1;
  std::vector<float> hn(size_t(B * keep * D));
  for (int64_t b = 0; b < B; b++)
    cpu::rmsnorm(hn.data() + b * keep * D, nullptr, h.data() + (b * S + S - keep) * D,
                 final_norm.f32(), eps, keep, D);
  Tensor logits = Tensor::empty({B, keep, V}, DType::F32);
  cpu::linear(logits.f32(), hn.data(), embed, nullptr, B * keep, D, V);
  return logits;
}

double ZayaModel::loss(const std::vector<int32_t>& ids, int64_t B, int64_t S) const {
  Tensor logits = forward(ids, B, S, true);
  std::vector<int32_t> targets(size_t(B * S), -1);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t + 1 < S; t++) targets[size_t(b * S + t)] = ids[size_t(b * S + t + 1)];
  return cpu::cross_entropy(nullptr, logits.f32(), targets.data(), B * S, cfg.vocab_size);
}

}  // namespace zaya
