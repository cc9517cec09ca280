// The roofline cost model behind `zaya size`. Backward costs what model_shape.h's ops say (twice
// the forward for GEMMs: dX and dW; 2.5x the forward's FLOPs for flash attention), recomputation
// adds one more forward of the decoder layers. The optimizer step is elementwise over each rank's
// ZeRO-1 shard (with the gradient norm's read), plus Muon's five Newton–Schulz iterations on the
// matrices a rank owns (1/ranks of them). Non-GEMM kernels run at the profile's kernel
// efficiencies (hardware.h) when it has them.
#include "sizing/cost_model.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace zaya::sizing {

using nlohmann::json;

void TrainSetup::validate() const {
  ZAYA_CHECK(micro_batch > 0, "--micro-batch must be positive, found {}", micro_batch);
  ZAYA_CHECK(seq > 0, "--seq must be positive, found {}", seq);
  ZAYA_CHECK(ranks > 0, "--ranks must be positive, found {}", ranks);
  ZAYA_CHECK(global_batch >= 0, "--global-batch must be positive, found {}", global_batch);
  ZAYA_CHECK(grad_bytes == 2 || grad_bytes == 4, "gradient element size must be 2 or 4 bytes");
  ZAYA_CHECK(grad_comm_bytes == 2 || grad_comm_bytes == 4, "--grad-comm must be bf16 or fp32");
  ZAYA_CHECK(cp >= 1 && ranks % cp == 0, "--cp {} must be positive and divide --ranks {}", cp,
             ranks);
  ZAYA_CHECK(cp == 1 || seq % (2 * cp) == 0,
             "--seq {} must be divisible by 2 × --cp = {} (each rank holds two chunks)", seq,
             2 * cp);
  const int64_t per_step = micro_batch * groups();
  ZAYA_CHECK(global_sequences() % per_step == 0 && global_sequences() >= per_step,
             "--global-batch {} must be a positive multiple of --micro-batch × --ranks / --cp = {} "
             "× {} = {}",
             global_sequences(), micro_batch, groups(), per_step);
}

double roofline_seconds(const HardwareProfile& hw, OpKind kind, double flops, double bytes,
                        double instance_gflop, bool* compute_bound) {
  const double thr =
      kind == OpKind::Gemm ? hw.gemm_flops_per_s(instance_gflop) : hw.peak_bf16_tflops * 1e12;
  const double tc = flops / thr, tm = bytes / (hw.copy_gbs * 1e9);
  if (compute_bound) *compute_bound = tc >= tm;
  return std::max(tc, tm);
}

double op_seconds(const HardwareProfile& hw, const Op& o, bool backward, bool* compute_bound) {
  const double flops = backward ? o.bwd_flops : o.flops;
  const double bytes = backward ? o.bwd_bytes : o.bytes;
  if (o.kind == OpKind::Gemm)  // dX and dW have the forward's shape: its work picks the rate
    return roofline_seconds(hw, o.kind, flops, bytes, o.flops * 1e-9, compute_bound);
  const double copy = hw.copy_gbs * 1e9, peak = hw.peak_bf16_tflops * 1e12;
  double tc = flops / peak, tm = bytes / copy;
  if (o.kind == OpKind::Attention) {
    const KernelClass c = backward ? KernelClass::AttentionBwd : KernelClass::AttentionFwd;
    tc = flops / hw.kernel_rate(c, flops * 1e-9);
  } else if (o.cls != KernelClass::None) {
    // The class's rows are measured on the forward + backward bytes of one instance.
    tm = bytes / hw.kernel_rate(o.cls, (o.bytes + o.bwd_bytes) * 1e-9);
  }
  if (compute_bound) *compute_bound = tc >= tm;
  return std::max(tc, tm);
}

namespace {

// Newton–Schulz FLOPs for one m×n matrix: per iteration A = X Xᵀ (2·s²·l), A² (2·s³),
// (bA + cA²) X (2·s²·l), with s = min(m, n), l = max(m, n); five iterations (ZAYA1.md §4).
double newton_schulz_flops(double m, double n) {
  const double s = std::min(m, n), l = std::max(m, n);
  return 5 * (4 * s * s * l + 2 * s * s * s);
}

// Σ of Newton–Schulz FLOPs over the model's Muon matrices, and the work of one NS matmul of the
// most common (expert) matrix for the GEMM-efficiency lookup.
double muon_flops(const ZayaConfig& c, double* typical_gflop) {
  const double D = double(c.hidden_size), Hq = double(c.num_attention_heads),
               Hkv = double(c.num_key_value_heads), d = double(c.head_dim),
               R = double(c.router_hidden_size), E = double(c.num_experts),
               I = double(c.moe_intermediate_size), L = double(c.num_hidden_layers);
  double per_layer = newton_schulz_flops(Hq * d, D) + newton_schulz_flops(Hkv * d, D) +
                     2 * newton_schulz_flops(Hkv * d / 2, D) + newton_schulz_flops(D, Hq * d) +
                     newton_schulz_flops(R, D) + 2 * newton_schulz_flops(R, R) +
                     newton_schulz_flops(E + 1, R) + E * 3 * newton_schulz_flops(I, D);
  const double s = std::min(I, D), l = std::max(I, D);
  *typical_gflop = 2 * s * s * l * 1e-9;
  return L * per_layer;
}

}  // namespace

TrainEstimate estimate_training(const ZayaConfig& c, const HardwareProfile& hw,
                                const TrainSetup& s) {
  s.validate();
  TrainEstimate e;
  const std::vector<Op> fwd = forward_ops(c, s.micro_tokens(), s.seq);
  for (const Op& o : fwd) {
    // forward + backward + forward again when recomputing the decoder layers
    const double fwd_mult = 1.0 + (s.recompute && o.per_layer ? 1.0 : 0.0);
    const double n = double(o.count);
    OpTime t;
    t.name = o.name;
    t.kind = o.kind;
    t.cls = o.cls;
    t.flops = n * (o.flops * fwd_mult + o.bwd_flops);
    t.bytes = n * (o.bytes * fwd_mult + o.bwd_bytes);
    t.gemm_gflop = o.kind == OpKind::Gemm ? o.flops * 1e-9 : 0;
    t.seconds =
        n * (fwd_mult * op_seconds(hw, o, false, &t.compute_bound) + op_seconds(hw, o, true));
    e.microbatch_s += t.seconds;
    e.ops.push_back(t);
  }
  e.accumulation = s.accumulation_steps();
  e.compute_s = e.microbatch_s * double(e.accumulation);

  const ParamCounts p = count_params(c);
  const double P = double(p.total_with_embedding()), N = double(s.ranks);
  // Per parameter of the shard (kOptimizerBytesPerParam) and per fp32 state element.
  const double state_elems =
      s.optimizer == OptimizerKind::Muon ? double(p.matrix) + (P - double(p.matrix)) * 2 : P * 2;
  const double opt_bytes =
      (P * kOptimizerBytesPerParam + state_elems * kOptimizerBytesPerState) / N;
  e.optimizer_s = opt_bytes / hw.kernel_rate(KernelClass::Optimizer, opt_bytes * 1e-9);
  if (s.optimizer == OptimizerKind::Muon) {
    double ns_gflop = 0;
    const double ns = muon_flops(c, &ns_gflop) / N;
    e.optimizer_s += ns / hw.gemm_flops_per_s(ns_gflop);
  }

  if (s.ranks > 1) {
    const double frac = (N - 1) / N;
    const double rs_bytes = P * double(s.grad_comm_bytes), ag_bytes = P * 2;
    e.reduce_scatter_busbw = hw.busbw_bytes_per_s("reduce_scatter", s.ranks, rs_bytes);
    e.all_gather_busbw = hw.busbw_bytes_per_s("all_gather", s.ranks, ag_bytes);
    e.reduce_scatter_s =
        e.reduce_scatter_busbw > 0 ? rs_bytes * frac / e.reduce_scatter_busbw : INFINITY;
    e.all_gather_s = e.all_gather_busbw > 0 ? ag_bytes * frac / e.all_gather_busbw : INFINITY;
  }
  const double comm = e.reduce_scatter_s + e.all_gather_s;
  e.step_s = e.compute_s + comm + e.optimizer_s;
  e.step_s_overlapped = std::max(e.compute_s, comm) + e.optimizer_s;
  e.tokens_per_step = double(s.global_sequences()) * double(s.seq);
  e.tokens_per_s = e.tokens_per_step / e.step_s;
  e.tokens_per_s_per_gpu = e.tokens_per_s / N;
  e.model_flops_per_token = train_flops_per_token(c, s.seq);
  e.mfu = e.model_flops_per_token * e.tokens_per_s / (N * hw.datasheet_bf16_tflops * 1e12);
  return e;
}

json TrainEstimate::to_json() const {
  json ops_j = json::array();
  for (auto& o : ops)
    ops_j.push_back({{"op", o.name},
                     {"class", o.kind == OpKind::Gemm ? "gemm" : kernel_class_name(o.cls)},
                     {"flops", o.flops},
                     {"bytes", o.bytes},
                     {"seconds", o.seconds},
                     {"bound", o.compute_bound ? "compute" : "memory"}});
  auto fin = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  return {{"ops", ops_j},
          {"microbatch_s", microbatch_s},
          {"accumulation_steps", accumulation},
          {"compute_s", compute_s},
          {"optimizer_s", optimizer_s},
          {"reduce_scatter_s", fin(reduce_scatter_s)},
          {"all_gather_s", fin(all_gather_s)},
          {"reduce_scatter_busbw_gbs", fin(reduce_scatter_busbw * 1e-9)},
          {"all_gather_busbw_gbs", fin(all_gather_busbw * 1e-9)},
          {"step_s", fin(step_s)},
          {"step_s_overlapped", fin(step_s_overlapped)},
          {"tokens_per_step", tokens_per_step},
          {"tokens_per_s", fin(tokens_per_s)},
          {"tokens_per_s_per_gpu", fin(tokens_per_s_per_gpu)},
          {"model_flops_per_token", model_flops_per_token},
          {"mfu", fin(mfu)}};
}

InferenceEstimate estimate_inference(const ZayaConfig& c, const HardwareProfile& hw, int64_t prompt,
                                     int64_t context, int64_t batch) {
  ZAYA_CHECK(prompt > 0, "--prompt must be positive, found {}", prompt);
  ZAYA_CHECK(context >= 0, "--context must be non-negative, found {}", context);
  ZAYA_CHECK(batch > 0, "--decode-batch must be positive, found {}", batch);
  InferenceEstimate r;
  r.prompt = prompt, r.batch = batch, r.context = context;
  for (const Op& o : forward_ops(c, prompt * batch, prompt))
    r.prefill_s += double(o.count) * op_seconds(hw, o, false);
  r.prefill_tokens_per_s = double(prompt * batch) / r.prefill_s;

  // Decode: every layer streams its dense weights, the experts the batch touches and the batch's
  // KV cache; GEMMs this thin are memory-bound, so the read bandwidth sets the pace.
  const double D = double(c.hidden_size), Hq = double(c.num_attention_heads),
               Hkv = double(c.num_key_value_heads), d = double(c.head_dim),
               R = double(c.router_hidden_size), E = double(c.num_experts),
               I = double(c.moe_intermediate_size), C = (Hq + Hkv) * d, b = double(batch);
  const double dense = (Hq + Hkv) * d * D + Hkv * d * D + D * Hq * d + C * double(c.cca_time0) +
                       C * d * double(c.cca_time1) + R * D + 2 * R * R + (E + 1) * R;
  const double touched = experts_touched(c.num_experts, c.num_experts_per_tok, batch);
  r.decode_experts_touched = touched;
  const double read_bw = hw.read_gbs * 1e9, peak = hw.peak_bf16_tflops * 1e12;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double keys = c.layer_is_sliding(l)
                            ? std::min<double>(double(context), double(c.sliding_window))
                            : double(context);
    const double bytes = 2 * (dense + touched * 3 * I * D) + b * keys * 2 * Hkv * d * 2;
    const double flops =
        2 * b * (dense + double(c.num_experts_per_tok) * 3 * I * D) + 4 * b * (keys + 1) * Hq * d;
    r.decode_bytes += bytes;
    r.decode_flops += flops;
    r.decode_s_per_token += std::max(bytes / read_bw, flops / peak);
  }
  const double head_bytes = 2 * double(c.vocab_size) * D,
               head_flops = 2 * b * double(c.vocab_size) * D;
  r.decode_bytes += head_bytes;
  r.decode_flops += head_flops;
  r.decode_s_per_token += std::max(head_bytes / read_bw, head_flops / peak);
  r.decode_tokens_per_s = b / r.decode_s_per_token;
  return r;
}

json InferenceEstimate::to_json() const {
  return {{"prompt", prompt},
          {"batch", batch},
          {"context", context},
          {"prefill_s", prefill_s},
          {"prefill_tokens_per_s", prefill_tokens_per_s},
          {"decode_s_per_token", decode_s_per_token},
          {"decode_bytes", decode_bytes},
          {"decode_flops", decode_flops},
          {"decode_experts_touched_per_layer", decode_experts_touched},
          {"decode_tokens_per_s", decode_tokens_per_s}};
}

}  // namespace zaya::sizing
