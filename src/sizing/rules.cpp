// The sizing rules. Performance rules (knee, waves, tokens per expert, FLOP split, collectives)
// only warn: a slow configuration still trains. Fail is kept for what breaks or cannot run:
// widths below the 16-byte operand alignment, a model that does not fit in HBM, a KV cache that
// leaves no room for one full-context sequence.
#include "sizing/rules.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "optim/param_rules.h"
#include "sizing/zero1_layout.h"

namespace zaya::sizing {

using nlohmann::json;

const char* status_name(Status s) {
  switch (s) {
    case Status::Pass: return "pass";
    case Status::Warn: return "warn";
    case Status::Fail: return "fail";
  }
  return "?";
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t pow2_divisor(int64_t v, int64_t cap) {
  int64_t p = 1;
  while (p < cap && v % (p * 2) == 0) p *= 2;
  return p;
}

std::string gib(double bytes) {
  return fmt::format("{:.1f} GiB", bytes / kGiB);
}

// GEMMs that carry at least 1% of the forward FLOPs: the rules about GEMM efficiency ignore the
// router's thin matmuls, which cannot matter for throughput.
std::vector<Op> significant_gemms(const std::vector<Op>& ops) {
  double total = 0;
  for (auto& o : ops) total += o.total_flops();
  std::vector<Op> r;
  for (auto& o : ops)
    if (o.kind == OpKind::Gemm && o.total_flops() >= 0.01 * total) r.push_back(o);
  return r;
}

}  // namespace

double wave_efficiency(int64_t tiles, int64_t units) {
  ZAYA_ASSERT(units > 0);
  if (tiles <= 0) return 0;
  const int64_t waves = (tiles + units - 1) / units;
  return double(tiles) / double(waves * units);
}

int64_t gemm_tiles(double m, double n, int tm, int tn) {
  return int64_t(std::ceil(m / tm)) * int64_t(std::ceil(n / tn));
}

RuleResult check_alignment(const std::string& id, const std::string& field, int64_t v) {
  RuleResult r;
  r.id = id;
  const int64_t p2 = pow2_divisor(v, 256);
  r.value = fmt::format("{} = {} = {} × {}", field, v, p2, v / p2);
  r.threshold = "multiple of 64 (pass), of 8 (warn), else fail";
  r.why =
      "matrix units consume operands in 16-byte (8 bf16) vectors and GEMM libraries tile by "
      "64–256; other widths run on padded or fallback kernels";
  r.source = "ZAYA1.md §5 (GEMM dimensions multiples of 64–256)";
  r.status = v % 64 == 0 ? Status::Pass : v % 8 == 0 ? Status::Warn : Status::Fail;
  r.numbers = {{"field", field}, {"value", v}, {"pow2_divisor", p2}};
  return r;
}

std::vector<RuleResult> check_rules(const ZayaConfig& c, const HardwareProfile& hw,
                                    const CheckOptions& o) {
  validate_shape(c, "model");
  o.train.validate();
  std::vector<RuleResult> out;
  const int64_t T = o.train.micro_tokens();

  {  // head dim
    RuleResult r;
    r.id = "head_dim";
    r.value = fmt::format("head_dim = {}", c.head_dim);
    r.threshold = "multiple of 64 (128 preferred); not a multiple of 8 fails";
    r.why =
        "flash-attention kernels are built for head dims 64/128/256, and the QK^T and PV "
        "matmuls have K = head_dim: 128 fills the matrix unit's K loop with no remainder";
    r.source = "ZAYA1.md §5 (head dim a multiple of 64, 128 used)";
    r.status = c.head_dim % 64 == 0  ? Status::Pass
               : c.head_dim % 8 == 0 ? Status::Warn
                                     : Status::Fail;
    if (r.status == Status::Pass && c.head_dim % 128 != 0) r.value += " (128 preferred)";
    r.numbers = {{"head_dim", c.head_dim}, {"multiple_of_128", c.head_dim % 128 == 0}};
    out.push_back(r);
  }
  out.push_back(check_alignment("width.hidden", "hidden_size", c.hidden_size));
  out.push_back(check_alignment("width.attention_q", "num_attention_heads*head_dim",
                                c.num_attention_heads * c.head_dim));
  out.push_back(check_alignment("width.attention_kv", "num_key_value_heads*head_dim",
                                c.num_key_value_heads * c.head_dim));
  out.push_back(check_alignment("width.expert", "moe_intermediate_size", c.moe_intermediate_size));
  out.push_back(check_alignment("width.router", "router_hidden_size", c.router_hidden_size));

  {  // vocab padding
    RuleResult r;
    r.id = "vocab";
    const int64_t V = c.vocab_size, padded = (V + 127) / 128 * 128;
    r.value = fmt::format("vocab_size = {} ({})", V,
                          V % 128 == 0  ? "multiple of 128"
                          : V % 64 == 0 ? "multiple of 64"
                                        : fmt::format("pad to {}", padded));
    r.threshold = "multiple of 64 (128 preferred)";
    r.why =
        "the LM head is the largest GEMM (N = vocab) and the embedding gather is row-wise: an "
        "unpadded vocab leaves a partial tile in every LM-head GEMM";
    r.source = "ZAYA1.md §1, §5 (Gemma-3's 262,144 tokens padded to 262,272)";
    r.status = V % 64 == 0 ? Status::Pass : Status::Warn;
    r.numbers = {{"vocab_size", V}, {"padded_to_128", padded}};
    out.push_back(r);
  }

  const std::vector<Op> fwd = forward_ops(c, T, o.train.seq);
  const std::vector<Op> gemms = significant_gemms(fwd);
  {  // knee
    RuleResult r;
    r.id = "gemm.knee";
    r.threshold = fmt::format(
        "every GEMM with ≥1% of the FLOPs does ≥ {:.0f} GFLOP ({})", hw.knee_gflop,
        hw.measured && hw.knee_gflop != 200 ? "measured p90 knee" : "ZAYA1 default knee");
    r.why =
        "below the knee a GEMM cannot fill the device (launch, prologue and tail costs "
        "dominate) and runs well under peak";
    r.source = "ZAYA1.md §5 (~200 GFLOP per GEMM to approach peak); measured knee_gflop.p90";
    json rows = json::array();
    double min_work = INFINITY;
    std::string min_name, below;
    for (auto& g : gemms) {
      const double w = g.flops * 1e-9;
      rows.push_back({{"gemm", g.name}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"gflop", w}});
      if (w < min_work) min_work = w, min_name = g.name;
      if (w < hw.knee_gflop)
        below += fmt::format("{}{} {:.1f}", below.empty() ? "" : ", ", g.name, w);
    }
    r.status = min_work >= hw.knee_gflop ? Status::Pass : Status::Warn;
    r.value = r.status == Status::Pass
                  ? fmt::format("smallest: {} {:.1f} GFLOP at {} tokens", min_name, min_work, T)
                  : fmt::format("below knee at {} tokens: {} GFLOP", T, below);
    r.numbers = {{"knee_gflop", hw.knee_gflop}, {"micro_tokens", T}, {"gemms", rows}};
    out.push_back(r);
  }
  {  // wave quantization
    RuleResult r;
    r.id = "gemm.wave";
    r.threshold = "wave efficiency ≥ 0.80 for every GEMM with ≥1% of the FLOPs";
    r.why = fmt::format(
        "a GEMM runs in waves of {} {}s; a last wave that is mostly empty idles the rest of the "
        "device (efficiency = tiles / (ceil(tiles / {}) · {}))",
        hw.compute_units, hw.cu_name, hw.compute_units, hw.compute_units);
    r.source = "ZAYA1.md §5 (avoid wave quantization; 304 CUs on MI300X, 132 SMs on H100/H200)";
    json rows = json::array();
    double worst = 1, weighted = 0, wsum = 0;
    std::string worst_name, low;
    for (auto& g : gemms) {
      // Expert GEMMs of one layer go out as one grouped launch: their tiles share the waves.
      const int64_t group = g.expert ? int64_t(c.num_experts) : 1;
      const int64_t tiles = group * gemm_tiles(g.m, g.n, hw.tile_m, hw.tile_n);
      const double eff = wave_efficiency(tiles, hw.compute_units);
      rows.push_back(
          {{"gemm", g.name}, {"tiles", tiles}, {"efficiency", eff}, {"grouped", g.expert}});
      weighted += eff * g.total_flops();
      wsum += g.total_flops();
      if (eff < worst) worst = eff, worst_name = g.name;
      if (eff < 0.8) low += fmt::format("{}{} {:.2f}", low.empty() ? "" : ", ", g.name, eff);
    }
    r.status = worst >= 0.8 ? Status::Pass : Status::Warn;
    r.value =
        fmt::format("{}×{} tiles on {} {}s: worst {} {:.2f}, FLOP-weighted {:.2f}", hw.tile_m,
                    hw.tile_n, hw.compute_units, hw.cu_name, worst_name, worst, weighted / wsum);
    if (!low.empty()) r.value += " (low: " + low + ")";
    r.numbers = {{"tile", {hw.tile_m, hw.tile_n}},
                 {"compute_units", hw.compute_units},
                 {"worst", worst},
                 {"flop_weighted", weighted / wsum},
                 {"gemms", rows}};
    out.push_back(r);
  }
  {  // tokens per expert
    RuleResult r;
    r.id = "expert.tokens";
    const double Te = double(T) * double(c.num_experts_per_tok) / double(c.num_experts);
    const double D = double(c.hidden_size), N2 = 2.0 * double(c.moe_intermediate_size);
    const double flops = 2 * Te * N2 * D, bytes = 2 * (Te * D + D * N2 + Te * N2);
    const double intensity = flops / bytes, ridge = hw.ridge_flop_per_byte();
    r.value = fmt::format(
        "{:.0f} tokens/expert ({} tokens × top-{} / {} experts): {:.0f} FLOP/B "
        "vs ridge {:.0f}",
        Te, T, c.num_experts_per_tok, c.num_experts, intensity, ridge);
    r.threshold = "expert gate_up GEMM intensity ≥ 2× the ridge point (peak / bandwidth)";
    r.why =
        "each expert's GEMM has M = tokens routed to it; its weights are re-read for every "
        "micro-batch, so with few tokens the expert GEMMs turn memory-bound";
    r.source = "ZAYA1.md §5 (large enough per-expert GEMMs for training throughput); roofline";
    r.status = intensity >= 2 * ridge ? Status::Pass : Status::Warn;
    if (Te < hw.tile_m)
      r.value += fmt::format("; fewer than one {}-row tile per expert", hw.tile_m);
    r.numbers = {{"tokens_per_expert", Te},
                 {"intensity_flop_per_byte", intensity},
                 {"ridge_flop_per_byte", ridge},
                 {"tokens_for_2x_ridge",
                  // Solve 2TeN2D / 2(TeD + DN2 + TeN2) = 2·ridge for Te.
                  2 * ridge * D * N2 / std::max(1e-9, N2 * D - 2 * ridge * (D + N2))}};
    out.push_back(r);
  }
  {  // FLOP split
    RuleResult r;
    r.id = "flops.split";
    const FlopSplit s = forward_flop_split(c, o.train.seq);
    const double tot = s.total();
    r.value = fmt::format(
        "at seq {}: attention projections+conv {:.1f}%, attention scores {:.1f}%, MoE {:.1f}%, "
        "LM head {:.1f}%",
        o.train.seq, 100 * s.attention_proj / tot, 100 * s.attention_core / tot, 100 * s.moe / tot,
        100 * s.head / tot);
    r.threshold = "attention scores (S-dependent) ≤ 50% of forward FLOPs";
    r.why =
        "past half, step time follows the attention kernel and the sequence length rather "
        "than the MoE width being sized; consider a sliding window or a shorter context";
    r.source = "DESIGN.md (6·S·Hq·d attention FLOPs per layer and token)";
    r.status = s.attention_core <= 0.5 * tot ? Status::Pass : Status::Warn;
    r.numbers = {{"seq", o.train.seq},
                 {"attention_proj_flops", s.attention_proj},
                 {"attention_core_flops", s.attention_core},
                 {"moe_flops", s.moe},
                 {"head_flops", s.head},
                 {"attention_fraction", (s.attention_proj + s.attention_core) / tot}};
    out.push_back(r);
  }
  const ParamCounts p = count_params(c);
  {  // KV cache
    RuleResult r;
    r.id = "kv_cache";
    const int64_t kv = kv_bytes_per_token(c), mha = mha_kv_bytes_per_token(c);
    const int64_t ctx = o.context > 0 ? o.context : c.max_position_embeddings;
    const double weights = 2.0 * double(p.total_with_embedding());
    const double free = hw.hbm_gib * kGiB * o.memory_headroom - weights;
    const double per_seq = double(kv) * double(ctx);
    const double seqs = free > 0 ? std::floor(free / per_seq) : 0;
    r.value = fmt::format(
        "{:.1f} KiB/token (MHA with {} heads: {:.1f} KiB, {:.1f}× more); {} full {}-token "
        "sequences fit beside the bf16 weights",
        kv / 1024.0, c.hidden_size / c.head_dim, mha / 1024.0, double(mha) / double(kv), seqs, ctx);
    r.threshold = fmt::format("at least --decode-batch = {} full-context sequences fit in HBM",
                              o.decode_batch);
    r.why =
        "decode streams the whole KV cache every token; CCA keeps 2·Hkv·d per layer where "
        "standard attention keeps 2·D";
    r.source = "ZAYA1.md §3.1 (40 KiB per token in bf16, 8× less than 16-head MHA)";
    r.status = seqs >= double(o.decode_batch) ? Status::Pass : Status::Fail;
    r.numbers = {{"kv_bytes_per_token", kv},
                 {"mha_kv_bytes_per_token", mha},
                 {"context", ctx},
                 {"sequences_that_fit", seqs},
                 {"weights_bytes", weights}};
    out.push_back(r);
  }
  {  // memory
    RuleResult r;
    r.id = "memory";
    MemoryPlan m = memory_plan(c, o.train.ranks, T, o.train.optimizer, o.train.grad_bytes);
    const TrainSetup& ts = o.train;
    const double cp_kv = context_parallel_kv_bytes(c, ts.micro_batch, ts.seq, ts.cp, false);
    m.activations += cp_kv;
    m.activations_recompute += context_parallel_kv_bytes(c, ts.micro_batch, ts.seq, ts.cp, true);
    // The data-parallel step's in-place bucket layout pads the fp32 gradient buffer.
    OptimizerSettings os;
    if (o.train.optimizer == OptimizerKind::AdamW) {
      os.default_rules = false;
      os.rules = {ParamRule{"re:.*", zaya::OptimizerKind::AdamW, 1.0, std::nullopt}};
    }
    const Zero1LayoutSummary lay =
        zero1_layout(c, o.train.ranks, os, std::max<int64_t>(1, o.train.bucket_elems));
    const double pad = double(lay.padding_elems) * 4.0;
    m.grads += pad;
    const double cap = hw.hbm_gib * kGiB, usable = cap * o.memory_headroom;
    const double full = m.total(false), rec = m.total(true);
    r.value = fmt::format(
        "per GPU: weights {} + grads {} (bucket padding {}) + master {} + {} states {} + "
        "activations {} (recompute: {}) = {} ({} with recompute) of {}",
        gib(m.weights), gib(m.grads), gib(pad), gib(m.master), optimizer_name(o.train.optimizer),
        gib(m.optimizer), gib(m.activations), gib(m.activations_recompute), gib(full), gib(rec),
        gib(cap));
    r.threshold = fmt::format(
        "total ≤ {:.0f}% of HBM (pass without recomputation; warn when only "
        "recomputation fits; fail when neither fits)",
        100 * o.memory_headroom);
    r.why =
        "ZeRO-1 shards fp32 master weights and optimizer states over the data-parallel ranks "
        "but replicates bf16 weights, gradients and activations";
    r.source = "ZAYA1.md §4 (ZeRO-1, fp32 master and states, Muon + AdamW)";
    if (o.train.recompute)
      r.status = rec <= usable ? Status::Pass : Status::Fail;
    else
      r.status = full <= usable ? Status::Pass : rec <= usable ? Status::Warn : Status::Fail;
    r.numbers = {{"ranks", o.train.ranks},
                 {"cp", o.train.cp},
                 {"cp_gathered_kv_bytes", cp_kv},
                 {"optimizer", optimizer_name(o.train.optimizer)},
                 {"weights_bytes", m.weights},
                 {"grads_bytes", m.grads},
                 {"bucket_padding_bytes", pad},
                 {"zero1_buckets", lay.buckets},
                 {"zero1_rooted_buckets", lay.rooted},
                 {"state_max_over_mean", lay.state_max_over_mean},
                 {"master_bytes", m.master},
                 {"optimizer_bytes", m.optimizer},
                 {"activations_bytes", m.activations},
                 {"activations_recompute_bytes", m.activations_recompute},
                 {"total_bytes", full},
                 {"total_recompute_bytes", rec},
                 {"capacity_bytes", cap}};
    out.push_back(r);
  }
  {  // collectives
    RuleResult r;
    r.id = "collectives";
    const TrainEstimate e = estimate_training(c, hw, o.train);
    const int n = o.train.ranks, G = hw.gpus_per_node;
    const int in_node = std::min(n, G);
    const double node_bw = hw.intra_node_busbw(in_node), full_node = hw.intra_node_busbw(G);
    const double comm = e.reduce_scatter_s + e.all_gather_s;
    r.threshold =
        "data-parallel gradient sync ≤ compute time per step, and on a fully connected "
        "node a data-parallel group spans the whole node";
    r.why = hw.topology == Topology::FullyConnected
                ? fmt::format(
                      "each GPU has {} direct links of {:.0f} GB/s: a collective over n GPUs "
                      "of a node uses n−1 of them, so sub-groups lose bandwidth",
                      hw.links_per_gpu, hw.link_gbs)
                : fmt::format("a switched node gives every GPU its full {:.0f} GB/s to any subset",
                              hw.gpu_fabric_gbs);
    r.source = "ZAYA1.md §5 (MI300X: 7 peer links, (n−1) links per collective; NVSwitch)";
    r.status = Status::Pass;
    if (n == 1) {
      r.value = "1 rank: no data-parallel collectives";
    } else {
      r.value = fmt::format(
          "{} ranks: reduce-scatter {:.3f} s at {:.0f} GB/s + all-gather {:.3f} s at {:.0f} GB/s "
          "vs "
          "compute {:.3f} s",
          n, e.reduce_scatter_s, e.reduce_scatter_busbw * 1e-9, e.all_gather_s,
          e.all_gather_busbw * 1e-9, e.compute_s);
      if (!(comm <= e.compute_s)) r.status = Status::Warn;
      if (hw.topology == Topology::FullyConnected && n < G) {
        r.value += fmt::format("; a {}-GPU group gets {:.0f} of the node's {:.0f} GB/s", n,
                               node_bw * 1e-9, full_node * 1e-9);
        r.status = Status::Warn;
      }
    }
    r.numbers = {
        {"ranks", n},
        {"topology", hw.topology == Topology::FullyConnected ? "fully_connected" : "switch"},
        {"intra_node_busbw_gbs", std::isfinite(node_bw) ? json(node_bw * 1e-9) : json(nullptr)},
        {"comm_s", std::isfinite(comm) ? json(comm) : json(nullptr)},
        {"compute_s", e.compute_s}};
    out.push_back(r);
  }
  return out;
}

Status worst_status(const std::vector<RuleResult>& rs) {
  Status w = Status::Pass;
  for (auto& r : rs)
    if (int(r.status) > int(w)) w = r.status;
  return w;
}

json rules_to_json(const std::vector<RuleResult>& rs) {
  json a = json::array();
  for (auto& r : rs)
    a.push_back({{"id", r.id},
                 {"status", status_name(r.status)},
                 {"value", r.value},
                 {"threshold", r.threshold},
                 {"why", r.why},
                 {"source", r.source},
                 {"numbers", r.numbers}});
  return a;
}

}  // namespace zaya::sizing
