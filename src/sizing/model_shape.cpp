// Parameter, FLOP, byte and memory counts of a ZAYA-style model from its configuration. Parameters
// are listed tensor by tensor from the ZAYA1.md §2 name table so that the sum is an independent
// check of ZayaConfig::params_total/params_active. Legend: D hidden, L layers, Hq/Hkv heads, d head
// dim, C = (Hq+Hkv)·d conv channels, R router width, E experts, k top-k, I expert width, V vocab,
// T tokens in the micro-batch.
#include "sizing/model_shape.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace zaya::sizing {

void validate_shape(const ZayaConfig& c, const std::string& where) {
  auto pos = [&](const char* f, int64_t v) {
    ZAYA_CHECK(v > 0, "{}: {} must be positive, found {}", where, f, v);
  };
  pos("vocab_size", c.vocab_size);
  pos("hidden_size", c.hidden_size);
  pos("num_hidden_layers", c.num_hidden_layers);
  pos("num_attention_heads", c.num_attention_heads);
  pos("num_key_value_heads", c.num_key_value_heads);
  pos("head_dim", c.head_dim);
  pos("moe_intermediate_size", c.moe_intermediate_size);
  pos("num_experts", c.num_experts);
  pos("num_experts_per_tok", c.num_experts_per_tok);
  pos("router_hidden_size", c.router_hidden_size);
  pos("cca_time0", c.cca_time0);
  pos("cca_time1", c.cca_time1);
  ZAYA_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
             "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", where,
             c.num_attention_heads, c.num_key_value_heads);
  ZAYA_CHECK((c.num_key_value_heads * c.head_dim) % 2 == 0,
             "{}: num_key_value_heads*head_dim ({}) must be even (values split into current and "
             "delayed halves)",
             where, c.num_key_value_heads * c.head_dim);
  ZAYA_CHECK(c.num_experts_per_tok <= c.num_experts,
             "{}: num_experts_per_tok ({}) must be at most num_experts ({})", where,
             c.num_experts_per_tok, c.num_experts);
  ZAYA_CHECK(c.layer_types.empty() || int64_t(c.layer_types.size()) == c.num_hidden_layers,
             "{}: layer_types has {} entries, expected num_hidden_layers = {}", where,
             c.layer_types.size(), c.num_hidden_layers);
}

ParamCounts count_params(const ZayaConfig& c) {
  const int64_t D = c.hidden_size, L = c.num_hidden_layers, Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads, d = c.head_dim, R = c.router_hidden_size,
                E = c.num_experts, I = c.moe_intermediate_size, V = c.vocab_size,
                C = (Hq + Hkv) * d, t0 = c.cca_time0, t1 = c.cca_time1;
  ParamCounts p;
  auto add = [&](std::string name, int64_t per_layer_numel, ParamKind kind, int64_t layers,
                 bool expert = false) {
    p.tensors.push_back({std::move(name), per_layer_numel * layers, kind, expert});
  };
  using K = ParamKind;
  const std::string l = "model.layers.{i}.";
  add(l + "input_layernorm.weight", D, K::Vector, L);
  add(l + "post_attention_layernorm.weight", D, K::Vector, L);
  add(l + "self_attn.qkv_proj.q_proj.weight", Hq * d * D, K::Matrix, L);
  add(l + "self_attn.qkv_proj.k_proj.weight", Hkv * d * D, K::Matrix, L);
  add(l + "self_attn.qkv_proj.v_proj_current.weight", Hkv * d / 2 * D, K::Matrix, L);
  add(l + "self_attn.qkv_proj.v_proj_delayed.weight", Hkv * d / 2 * D, K::Matrix, L);
  add(l + "self_attn.qkv_proj.conv_qk_depthwise.weight", C * 1 * t0, K::Conv, L);
  add(l + "self_attn.qkv_proj.conv_qk_depthwise.bias", C, K::Vector, L);
  add(l + "self_attn.qkv_proj.conv_qk_grouped.weight", C * d * t1, K::Conv, L);
  add(l + "self_attn.qkv_proj.conv_qk_grouped.bias", C, K::Vector, L);
  add(l + "self_attn.qk_norm.temp", Hkv, K::Vector, L);
  add(l + "self_attn.o_proj.weight", D * Hq * d, K::Matrix, L);
  for (const char* set : {"post_attention_residual_scale.", "post_mlp_residual_scale."})
    for (const char* t :
         {"hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"})
      add(l + set + t, D, K::Vector, L);
  add(l + "mlp.gate.down_proj.weight", R * D, K::Matrix, L);
  add(l + "mlp.gate.down_proj.bias", R, K::Vector, L);
  add(l + "mlp.gate.router_states_scale", R, K::Vector, L - 1);  // not in layer 0
  add(l + "mlp.gate.router_mlp.norm.weight", R, K::Vector, L);
  add(l + "mlp.gate.router_mlp.fc1.weight", R * R, K::Matrix, L);
  add(l + "mlp.gate.router_mlp.fc1.bias", R, K::Vector, L);
  add(l + "mlp.gate.router_mlp.fc2.weight", R * R, K::Matrix, L);
  add(l + "mlp.gate.router_mlp.fc2.bias", R, K::Vector, L);
  add(l + "mlp.gate.router_mlp.out_proj.weight", (E + 1) * R, K::Matrix, L);
  // mlp.gate.balancing_biases is a buffer (no gradient, not optimised): not a parameter.
  add(l + "mlp.experts.gate_up_proj", E * 2 * I * D, K::Matrix, L, true);
  add(l + "mlp.experts.down_proj", E * D * I, K::Matrix, L, true);
  add("model.input_hidden_states_scale", D, K::Vector, 1);
  add("model.input_hidden_states_bias", D, K::Vector, 1);
  add("model.norm.weight", D, K::Vector, 1);
  p.embedding = V * D;

  for (auto& t : p.tensors) {
    p.total += t.numel;
    if (t.expert) p.expert += t.numel;
    if (t.kind == K::Matrix) p.matrix += t.numel;
  }
  p.active = p.total - p.expert + p.expert / E * c.num_experts_per_tok;
  // Matmul-like weights (each multiplies once per token): matrices (experts: k of E) and both
  // convolutions' kernels, plus the tied LM head.
  int64_t mm = 0;
  for (auto& t : p.tensors)
    if (t.kind == K::Matrix || t.kind == K::Conv)
      mm += t.expert ? t.numel / E * c.num_experts_per_tok : t.numel;
  p.matmul_active_with_head = mm + V * D;
  return p;
}

double mean_keys(int64_t seq, int64_t window) {
  if (window <= 0 || window >= seq) return double(seq) / 2.0;
  // Queries 0..w-1 see t+1 keys, the rest see w: (w(w+1)/2 + (S-w)·w) / S.
  const double S = double(seq), w = double(window);
  return (w * (w + 1) / 2 + (S - w) * w) / S;
}

namespace {

double layer_keys(const ZayaConfig& c, int64_t layer, int64_t seq) {
  return mean_keys(seq, c.layer_is_sliding(layer) ? c.sliding_window : 0);
}

// Σ over layers of the mean attended keys: attention FLOPs scale with it.
double total_layer_keys(const ZayaConfig& c, int64_t seq) {
  double s = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) s += layer_keys(c, l, seq);
  return s;
}

Op gemm(std::string name, double m, double n, double k, int64_t count, bool per_layer = true,
        bool expert = false) {
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::Gemm;
  o.m = m, o.n = n, o.k = k;
  o.flops = 2 * m * n * k;
  o.bytes = 2 * (m * k + k * n + m * n);  // bf16 A and B read, C written once
  o.bwd_flops = 2 * o.flops, o.bwd_bytes = 2 * o.bytes;
  o.count = count;
  o.per_layer = per_layer;
  o.expert = expert;
  return o;
}

Op mem(std::string name, KernelClass cls, double flops, double bytes, int64_t count,
       bool per_layer = true) {
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::Memory;
  o.cls = cls;
  o.flops = flops;
  o.bytes = bytes;
  o.bwd_flops = 2 * flops, o.bwd_bytes = 2 * bytes;
  o.count = count;
  o.per_layer = per_layer;
  return o;
}

}  // namespace

std::vector<Op> forward_ops(const ZayaConfig& c, int64_t tokens, int64_t seq) {
  const double T = double(tokens);
  const double D = double(c.hidden_size), Hq = double(c.num_attention_heads),
               Hkv = double(c.num_key_value_heads), d = double(c.head_dim),
               R = double(c.router_hidden_size), E = double(c.num_experts),
               I = double(c.moe_intermediate_size), V = double(c.vocab_size),
               k = double(c.num_experts_per_tok), C = (Hq + Hkv) * d;
  const int64_t L = c.num_hidden_layers, Ei = c.num_experts;
  const double Te = T * k / E;  // tokens per expert when routing is balanced
  std::vector<Op> ops;
  // q, k and both value halves read the same normed x (v_del is computed for every position then
  // shifted by one), so one fused GEMM produces them: (Hq + 2·Hkv)·d columns.
  ops.push_back(gemm("qkv_proj", T, C + Hkv * d, D, L));
  using KC = KernelClass;
  ops.push_back(mem("cca_conv", KC::Cca,
                    2 * T * (C * double(c.cca_time0) + C * d * double(c.cca_time1)), 2 * T * C * 4,
                    L));
  ops.push_back(mem("qk_norm_rope", KC::Cca, 8 * T * C, 2 * 2 * T * C, L));
  // Attention cores, grouped by window so that sliding layers cost what they attend to.
  int64_t n_sliding = 0;
  for (int64_t l = 0; l < L; ++l) n_sliding += c.layer_is_sliding(l) ? 1 : 0;
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t n = pass == 0 ? L - n_sliding : n_sliding;
    if (n == 0) continue;
    const double keys = mean_keys(seq, pass == 0 ? 0 : c.sliding_window);
    Op a;
    a.name = pass == 0 ? "attention" : "attention_sliding";
    a.kind = OpKind::Attention;
    a.cls = KC::AttentionFwd;
    a.flops = 4 * T * keys * Hq * d;               // QK^T and PV
    a.bytes = 2 * T * (2 * Hq * d + 2 * Hkv * d);  // q, k, v read once, output written
    // Flash backward recomputes QK^T and runs dV, dP, dQ, dK: 2.5x the forward's matmul FLOPs
    // (the FlashAttention papers' count, which their TFLOP/s figures use). It reads q, k, v, o,
    // dout and writes dq, dk, dv: twice the forward's bytes.
    a.bwd_flops = kAttentionBwdFlopFactor * a.flops;
    a.bwd_bytes = 2 * a.bytes;
    a.count = n;
    ops.push_back(a);
  }
  ops.push_back(gemm("o_proj", T, D, Hq * d, L));
  // Two RMSNorms (fp32 residual read, bf16 written) and two residual affines (bf16 branch and fp32
  // residual read, fp32 residual written) per layer.
  ops.push_back(mem("norms_residual", KC::NormResidual, 20 * T * D,
                    T * (2 * (4 + 2) * D + 2 * (2 + 4 + 4) * D), L));
  ops.push_back(gemm("router_down", T, R, D, L));
  ops.push_back(gemm("router_mlp", T, R, R, 2 * L));
  ops.push_back(gemm("router_out", T, E + 1, R, L));
  ops.push_back(mem("router_softmax", KC::Elementwise, 8 * T * (E + 1), 8 * T * (E + 1), L));
  ops.push_back(mem("dispatch_combine", KC::Elementwise, 2 * T * k * D, 8 * T * k * D, L));
  ops.push_back(gemm("expert_gate_up", Te, 2 * I, D, L * Ei, true, true));
  ops.push_back(mem("swiglu", KC::Elementwise, 4 * T * k * I, 6 * T * k * I, L));
  ops.push_back(gemm("expert_down", Te, D, I, L * Ei, true, true));
  ops.push_back(gemm("lm_head", T, V, D, 1, false));
  // Cross-entropy over vocabulary chunks of fp32 logits (the LM-head GEMM writes them): the
  // forward's statistics pass reads them (4V per token); the backward's gradient pass reads them
  // again and writes bf16 dlogits (6V), and the final RMSNorm's backward moves 16D.
  Op loss = mem("final_norm_loss", KC::Loss, 6 * T * V, T * (6 * D + 4 * V), 1, false);
  loss.bwd_bytes = T * (16 * D + 6 * V);
  ops.push_back(loss);
  return ops;
}

double train_flops_per_token(const ZayaConfig& c, int64_t seq) {
  const ParamCounts p = count_params(c);
  const double attn = 12.0 * total_layer_keys(c, seq) * double(c.num_attention_heads * c.head_dim);
  return 6.0 * double(p.matmul_active_with_head) + attn;
}

FlopSplit forward_flop_split(const ZayaConfig& c, int64_t seq) {
  const double D = double(c.hidden_size), Hq = double(c.num_attention_heads),
               Hkv = double(c.num_key_value_heads), d = double(c.head_dim),
               R = double(c.router_hidden_size), E = double(c.num_experts),
               I = double(c.moe_intermediate_size), k = double(c.num_experts_per_tok),
               C = (Hq + Hkv) * d, L = double(c.num_hidden_layers);
  FlopSplit s;
  s.attention_proj =
      L * 2 *
      (C * D + Hkv * d * D + D * Hq * d + C * double(c.cca_time0) + C * d * double(c.cca_time1));
  s.attention_core = 4.0 * total_layer_keys(c, seq) * Hq * d;
  s.moe = L * 2 * (R * D + 2 * R * R + (E + 1) * R + k * 3 * I * D);
  s.head = 2 * double(c.vocab_size) * D;
  return s;
}

int64_t activation_bytes_per_token_layer(const ZayaConfig& c) {
  const int64_t D = c.hidden_size, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads,
                d = c.head_dim, R = c.router_hidden_size, E = c.num_experts,
                I = c.moe_intermediate_size, k = c.num_experts_per_tok, C = (Hq + Hkv) * d;
  // Attention block: fp32 residual in and RMSNorm rstd; bf16 normed input, [q0|k0], depthwise
  // output, q/k before and after norm+RoPE, values, attention output, fp32 log-sum-exp per head,
  // and the o_proj output (the residual affine's gradient needs it).
  int64_t attn = 4 * D + 4 + 2 * D + 4 * (2 * C) + 2 * Hkv * d + 2 * Hq * d + 4 * Hq + 2 * D;
  // MoE block: fp32 residual and rstd; normed input; router: fp32 r, normed r, two pre-GELU
  // hiddens, fp32 logits and probabilities; per routed copy: permuted input, gate|up, SwiGLU
  // output, expert output; the combined output.
  int64_t router = 4 * R + 2 * R + 2 * R + 2 * R + 4 * (E + 1) + 4 * (E + 1);
  int64_t moe = 4 * D + 4 + 2 * D + router + k * (2 * D + 2 * 2 * I + 2 * I + 2 * D) + 2 * D;
  return attn + moe;
}

int64_t head_activation_bytes_per_token(const ZayaConfig& c) {
  // Final fp32 residual and rstd, normed bf16 input, bf16 logits, fp32 log-sum-exp.
  return 4 * c.hidden_size + 4 + 2 * c.hidden_size + 2 * c.vocab_size + 4;
}

double activation_bytes(const ZayaConfig& c, int64_t tokens, bool recompute) {
  const double per_layer = double(activation_bytes_per_token_layer(c));
  const double L = double(c.num_hidden_layers), T = double(tokens);
  const double head = double(head_activation_bytes_per_token(c));
  if (!recompute) return T * (L * per_layer + head);
  // Each layer keeps its fp32 input; backward rebuilds one layer's full set at a time.
  return T * (L * 4.0 * double(c.hidden_size) + per_layer + head);
}

const char* optimizer_name(OptimizerKind o) {
  return o == OptimizerKind::Muon ? "muon" : "adamw";
}

MemoryPlan memory_plan(const ZayaConfig& c, int ranks, int64_t micro_tokens, OptimizerKind opt,
                       int grad_bytes) {
  const ParamCounts p = count_params(c);
  const double P = double(p.total_with_embedding()), N = double(ranks);
  MemoryPlan m;
  m.weights = 2 * P;
  m.grads = double(grad_bytes) * P;
  m.master = 4 * P / N;
  const double states = opt == OptimizerKind::Muon
                            ? double(p.matrix) * 1 + (P - double(p.matrix)) * 2  // momentum | Adam
                            : P * 2;
  m.optimizer = 4 * states / N;
  m.activations = activation_bytes(c, micro_tokens, false);
  m.activations_recompute = activation_bytes(c, micro_tokens, true);
  return m;
}

double context_parallel_kv_bytes(const ZayaConfig& c, int64_t micro_batch, int64_t seq, int cp,
                                 bool recompute) {
  if (cp <= 1) return 0;
  const double per_layer = double(micro_batch) * double(seq) * (1.0 - 1.0 / double(cp)) * 2.0 *
                           double(c.num_key_value_heads * c.head_dim) * 2.0;
  return per_layer * (recompute ? 1.0 : double(c.num_hidden_layers));
}

int64_t kv_bytes_per_token(const ZayaConfig& c) {
  return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 2;
}

int64_t mha_kv_bytes_per_token(const ZayaConfig& c) {
  return c.num_hidden_layers * 2 * c.hidden_size * 2;
}

double experts_touched(int64_t experts, int64_t top_k, int64_t tokens) {
  const double E = double(experts);
  return E * (1.0 - std::pow(1.0 - double(top_k) / E, double(tokens)));
}

}  // namespace zaya::sizing
