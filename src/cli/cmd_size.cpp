// `zaya size`: hardware-aware sizing of ZAYA-style models (ZAYA1.md §5).
//   zaya size check   (--preset P | --config F) --hardware H [training flags] [--json F]
//   zaya size propose --total 8.3B --active 0.76B --hardware H [--top N] [--json F]
//   zaya size moe     --total 8.3B --active 0.76B --hardware H [--svg F] [--json F]
//   zaya size io      --global-batch G --seq S --bytes-per-token B --page P --step-time T --iops I
//   zaya size hardware [--hardware H]
// The logic lives in src/sizing; this file parses flags and prints tables. Exit status: 0 when no
// rule fails, 3 when one does (check; io when the storage is too slow), 1 on bad input, 2 on bad
// flags.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/plot.h"
#include "model/config.h"
#include "sizing/cost_model.h"
#include "sizing/hardware.h"
#include "sizing/rules.h"
#include "sizing/search.h"
#include "sizing/storage.h"

namespace {

using nlohmann::json;
namespace sz = zaya::sizing;

constexpr int kExitRuleFailed = 3;

struct ModelFlags {
  std::string preset, config;
  void add(CLI::App* app) {
    auto* p = app->add_option("--preset", preset, "model preset (tiny, zaya1-base, zaya1-8b)");
    auto* c = app->add_option("--config", config, "model config.json (or a folder holding one)");
    p->excludes(c);
    c->excludes(p);
  }
  zaya::ZayaConfig load(bool default_base) const {
    if (!config.empty()) return zaya::ZayaConfig::load(config);
    if (!preset.empty()) return zaya::ZayaConfig::preset(preset);
    ZAYA_CHECK(default_base, "give the model with --preset NAME or --config FILE");
    return zaya::ZayaConfig::preset("zaya1-base");
  }
  std::string name() const {
    return !config.empty() ? config : !preset.empty() ? preset : "zaya1-base";
  }
};

struct TrainFlags {
  sz::CheckOptions o;
  std::string optimizer = "muon", grad_comm = "fp32";
  void add(CLI::App* app) {
    app->add_option("--ranks", o.train.ranks, "GPUs (ZeRO-1 over all of them)")->capture_default_str();
    app->add_option("--cp", o.train.cp,
                    "context-parallel GPUs per sequence (activations for seq/cp tokens per GPU, "
                    "plus the gathered keys and values)")
        ->capture_default_str();
    app->add_option("--micro-batch", o.train.micro_batch, "sequences per rank per micro-step")
        ->capture_default_str();
    app->add_option("--seq", o.train.seq, "tokens per sequence")->capture_default_str();
    app->add_option("--global-batch", o.train.global_batch,
                    "sequences per optimizer step (default: micro-batch × ranks / cp)");
    app->add_flag("--recompute", o.train.recompute, "full per-layer activation recomputation");
    app->add_option("--optimizer", optimizer, "muon (Muon on matrices, AdamW elsewhere) or adamw")
        ->capture_default_str();
    app->add_option("--grad-comm", grad_comm, "gradient reduce-scatter dtype: fp32 or bf16")
        ->capture_default_str();
    app->add_option("--decode-batch", o.decode_batch, "sequences decoded together")
        ->capture_default_str();
    app->add_option("--context", o.context,
                    "context for the KV-cache rule and decode (default: max_position_embeddings)");
  }
  void finish() {
    ZAYA_CHECK(optimizer == "muon" || optimizer == "adamw",
               "--optimizer must be muon or adamw, found '{}'", optimizer);
    o.train.optimizer = optimizer == "muon" ? sz::OptimizerKind::Muon : sz::OptimizerKind::AdamW;
    ZAYA_CHECK(grad_comm == "fp32" || grad_comm == "bf16",
               "--grad-comm must be fp32 or bf16, found '{}'", grad_comm);
    o.train.grad_comm_bytes = grad_comm == "fp32" ? 4 : 2;
    ZAYA_CHECK(o.decode_batch > 0, "--decode-batch must be positive, found {}", o.decode_batch);
    ZAYA_CHECK(o.context >= 0, "--context must be non-negative, found {}", o.context);
    o.train.validate();
  }
};

std::string si(double v) {  // 1234567 -> "1.23M"
  const char* suf[] = {"", "K", "M", "B", "T"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 4) v /= 1000, ++i;
  return fmt::format("{:.3g}{}", v, suf[i]);
}

void write_json(const std::string& path, const json& j) {
  if (!path.empty()) zaya::write_text_file_atomic(path, j.dump(2) + "\n");
}

void print_training(const sz::TrainEstimate& e, const sz::TrainSetup& s) {
  fmt::print(
      "\ntraining ({} ranks{}, {} × {} tokens per micro-batch, {} micro-batch(es) per step):\n",
      s.ranks, s.cp > 1 ? fmt::format(" (cp {}: {} tokens per rank)", s.cp, s.seq / s.cp) : "",
      s.micro_batch, s.seq, e.accumulation);
  fmt::print("  {:<18} {:>10} {:>12} {:>10}  {}\n", "op", "TFLOP", "GB", "ms", "bound");
  for (auto& o : e.ops)
    fmt::print("  {:<18} {:>10.2f} {:>12.2f} {:>10.3f}  {}\n", o.name, o.flops * 1e-12,
               o.bytes * 1e-9, o.seconds * 1e3, o.compute_bound ? "compute" : "memory");
  fmt::print(
      "  compute {:.3f} s, optimizer {:.3f} s, reduce-scatter {:.3f} s, all-gather {:.3f} s\n",
      e.compute_s, e.optimizer_s, e.reduce_scatter_s, e.all_gather_s);
  fmt::print("  step {:.3f} s ({:.3f} s if communication hides behind compute)\n", e.step_s,
             e.step_s_overlapped);
  fmt::print("  {} tokens/s per GPU, {} tokens/s in all; {:.3g} model FLOP/token; MFU {:.1f}%\n",
             si(e.tokens_per_s_per_gpu), si(e.tokens_per_s), e.model_flops_per_token, 100 * e.mfu);
}

void print_inference(const sz::InferenceEstimate& r) {
  fmt::print("\ninference (batch {}):\n", r.batch);
  fmt::print("  prefill of {} tokens: {:.1f} ms, {} tokens/s\n", r.prompt, r.prefill_s * 1e3,
             si(r.prefill_tokens_per_s));
  fmt::print(
      "  decode at context {}: {:.3f} ms per token ({:.2f} GB read, {:.2f} experts/layer), "
      "{} tokens/s\n",
      r.context, r.decode_s_per_token * 1e3, r.decode_bytes * 1e-9, r.decode_experts_touched,
      si(r.decode_tokens_per_s));
}

int run_check(const ModelFlags& mf, const std::string& hw_name, TrainFlags& tf, bool explain,
              int64_t prompt, const std::string& json_path) {
  tf.finish();
  const zaya::ZayaConfig c = mf.load(false);
  const sz::HardwareProfile hw = sz::load_hardware(hw_name);
  const auto rules = sz::check_rules(c, hw, tf.o);
  const sz::TrainEstimate e = sz::estimate_training(c, hw, tf.o.train);
  const int64_t ctx = tf.o.context > 0 ? tf.o.context : c.max_position_embeddings;
  const sz::InferenceEstimate inf = sz::estimate_inference(c, hw, prompt, ctx, tf.o.decode_batch);
  const sz::ParamCounts p = sz::count_params(c);

  fmt::print("model {}: {} params ({} with embedding), {} active per token\n", mf.name(),
             si(double(p.total)), si(double(p.total_with_embedding())), si(double(p.active)));
  fmt::print("hardware {} ({}): {} {}s, {:.0f} TFLOP/s bf16, {:.0f} GiB at {:.0f} GB/s\n\n",
             hw.device, hw.origin, hw.compute_units, hw.cu_name, hw.peak_bf16_tflops, hw.hbm_gib,
             hw.copy_gbs);
  fmt::print("{:<20} {:<6} {}\n", "rule", "status", "value");
  for (auto& r : rules) {
    fmt::print("{:<20} {:<6} {}\n", r.id, sz::status_name(r.status), r.value);
    if (explain)
      fmt::print("{:27}threshold: {}\n{:27}why: {}\n{:27}source: {}\n", "", r.threshold, "", r.why,
                 "", r.source);
  }
  print_training(e, tf.o.train);
  print_inference(inf);
  const sz::Status worst = sz::worst_status(rules);
  fmt::print("\nresult: {}\n", sz::status_name(worst));

  json j = {{"schema", "zaya.size_check/1"},
            {"model", mf.name()},
            {"config", c.to_json()},
            {"hardware", hw.to_json()},
            {"setup",
             {{"ranks", tf.o.train.ranks},
              {"cp", tf.o.train.cp},
              {"micro_batch", tf.o.train.micro_batch},
              {"seq", tf.o.train.seq},
              {"global_batch", tf.o.train.global_sequences()},
              {"recompute", tf.o.train.recompute},
              {"optimizer", sz::optimizer_name(tf.o.train.optimizer)}}},
            {"params",
             {{"total", p.total},
              {"embedding", p.embedding},
              {"active", p.active},
              {"matmul_active_with_head", p.matmul_active_with_head}}},
            {"rules", sz::rules_to_json(rules)},
            {"training", e.to_json()},
            {"inference", inf.to_json()},
            {"result", sz::status_name(worst)}};
  write_json(json_path, j);
  return worst == sz::Status::Fail ? kExitRuleFailed : 0;
}

void print_candidates(const std::vector<sz::Candidate>& cs, bool show_budget) {
  fmt::print("{:<4} {:<30} {:>8} {:>8} {:>12} {:>7} {:>10} {:>6}  {}\n", "rank", "config", "total",
             "active", "train tok/s", "MFU", "decode ms", "front", "rules not passing");
  int i = 0;
  for (auto& c : cs) {
    std::string notes;
    for (auto& w : c.warned) notes += (notes.empty() ? "" : ",") + w;
    if (c.reference) notes = "[reference] " + notes;
    if (show_budget && !c.within_budget) notes = "[outside budget] " + notes;
    fmt::print("{:<4} {:<30} {:>8} {:>8} {:>12} {:>6.1f}% {:>10.3f} {:>6}  {}\n", ++i, c.label(),
               si(double(c.total)), si(double(c.active)), si(c.train.tokens_per_s_per_gpu),
               100 * c.train.mfu, c.infer.decode_s_per_token * 1e3, c.pareto ? "*" : "", notes);
  }
}

struct SearchFlags {
  std::string total, active;
  double tolerance = 0.10;
  int64_t prompt = 4096;
  void add(CLI::App* app) {
    app->add_option("--total", total, "total parameters without the embedding (e.g. 8.3B)")
        ->required();
    app->add_option("--active", active, "active parameters per token without the embedding")
        ->required();
    app->add_option("--tolerance", tolerance, "relative tolerance on both budgets")
        ->capture_default_str();
  }
  void finish(sz::SearchOptions& o, TrainFlags& tf) {
    tf.finish();
    o.budget.total = sz::parse_count("--total", total);
    o.budget.active = sz::parse_count("--active", active);
    o.budget.tolerance = tolerance;
    o.budget.validate();
    o.check = tf.o;
    o.prompt = prompt;
    o.decode_context = tf.o.context > 0 ? tf.o.context : 4096;
  }
};

json search_json(const char* schema, const std::string& hw, const sz::SearchOptions& o,
                 const std::vector<sz::Candidate>& cs) {
  return {
      {"schema", schema},
      {"hardware", hw},
      {"budget",
       {{"total", o.budget.total}, {"active", o.budget.active}, {"tolerance", o.budget.tolerance}}},
      {"setup",
       {{"ranks", o.check.train.ranks},
        {"micro_batch", o.check.train.micro_batch},
        {"seq", o.check.train.seq},
        {"decode_batch", o.check.decode_batch},
        {"decode_context", o.decode_context}}},
      {"candidates", sz::candidates_to_json(cs)}};
}

int run_size(int argc, char** argv) {
  CLI::App app{"hardware-aware sizing of ZAYA-style models (ZAYA1.md §5)", "zaya size"};
  app.require_subcommand(1);

  auto* check = app.add_subcommand("check", "judge a model config against the sizing rules");
  ModelFlags check_model;
  check_model.add(check);
  std::string hw_name, json_path;
  check->add_option("--hardware", hw_name, "built-in name or measured profile JSON")->required();
  TrainFlags check_train;
  check_train.add(check);
  bool explain = false;
  int64_t prompt = 4096;
  check->add_option("--prompt", prompt, "prompt length for the prefill estimate")
      ->capture_default_str();
  check->add_flag("--explain", explain, "print each rule's threshold, reason and source");
  check->add_option("--json", json_path, "write the report as JSON");

  auto* prop = app.add_subcommand("propose", "rank candidate configs for a parameter budget");
  ModelFlags prop_model;
  prop_model.add(prop);
  prop->add_option("--hardware", hw_name, "built-in name or measured profile JSON")->required();
  TrainFlags prop_train;
  prop_train.add(prop);
  SearchFlags prop_search;
  prop_search.add(prop);
  size_t top = 10;
  prop->add_option("--top", top, "candidates to show")->capture_default_str();
  std::vector<int64_t> hidden, layers, prop_experts, prop_top_k;
  prop->add_option("--hidden", hidden, "hidden sizes to sweep (default 1024..4096)")
      ->delimiter(',');
  prop->add_option("--layers", layers, "depths to sweep (default 16..64)")->delimiter(',');
  prop->add_option("--experts", prop_experts, "expert counts to sweep")->delimiter(',');
  prop->add_option("--top-k", prop_top_k, "top-k values to sweep (default 1,2,4,8)")
      ->delimiter(',');
  prop->add_option("--json", json_path, "write the candidates as JSON");

  auto* moe = app.add_subcommand("moe", "sweep experts, expert width and top-k for a budget");
  ModelFlags moe_model;
  moe_model.add(moe);
  moe->add_option("--hardware", hw_name, "built-in name or measured profile JSON")->required();
  TrainFlags moe_train;
  moe_train.add(moe);
  SearchFlags moe_search;
  moe_search.add(moe);
  std::vector<int64_t> experts, top_k;
  std::string svg_path;
  moe->add_option("--experts", experts, "expert counts to sweep (default 4..256)")->delimiter(',');
  moe->add_option("--top-k", top_k, "top-k values to sweep (default 1,2,4,8)")->delimiter(',');
  moe->add_option("--svg", svg_path, "write the Pareto plot (SVG)");
  moe->add_option("--json", json_path, "write the table as JSON");

  auto* io = app.add_subcommand("io", "storage IOPS needed by the data loader");
  sz::IoInput ioin;
  io->add_option("--global-batch", ioin.global_batch, "G: sequences per step")->required();
  io->add_option("--seq", ioin.seq, "s: tokens per sequence")->required();
  io->add_option("--bytes-per-token", ioin.bytes_per_token, "b: bytes per token (uint32: 4)")
      ->required();
  io->add_option("--page", ioin.page, "P: page (read) size in bytes")->required();
  io->add_option("--step-time", ioin.step_time, "t: step time in seconds")->required();
  io->add_option("--iops", ioin.iops, "I_max: sustainable IOPS of the storage")->required();
  io->add_option("--scatter", ioin.scatter, "σ ≥ 1: pages touched per page of tokens")
      ->capture_default_str();
  io->add_option("--json", json_path, "write the result as JSON");

  auto* hwc = app.add_subcommand("hardware", "print a hardware profile, or list the built-in ones");
  std::string hw_show;
  hwc->add_option("--hardware", hw_show, "built-in name or measured profile JSON");

  if (!zaya::cli::parse_or_help(app, argc, argv)) return 0;

  if (*check) return run_check(check_model, hw_name, check_train, explain, prompt, json_path);

  if (*prop || *moe) {
    const bool is_moe = bool(*moe);
    sz::SearchOptions o;
    (is_moe ? moe_search : prop_search).finish(o, is_moe ? moe_train : prop_train);
    const zaya::ZayaConfig base = (is_moe ? moe_model : prop_model).load(true);
    const sz::HardwareProfile hw = sz::load_hardware(hw_name);
    fmt::print(
        "budget: {} total, {} active (±{:.0f}%) on {}; {} ranks, {} × {} tokens per "
        "micro-batch; decode batch {} at context {}\n\n",
        si(o.budget.total), si(o.budget.active), 100 * o.budget.tolerance, hw.device,
        o.check.train.ranks, o.check.train.micro_batch, o.check.train.seq, o.check.decode_batch,
        o.decode_context);
    if (is_moe) {
      if (!experts.empty()) o.experts = experts;
      if (!top_k.empty()) o.top_k = top_k;
      for (int64_t e : o.experts)
        ZAYA_CHECK(e > 0, "--experts: counts must be positive, found {}", e);
      for (int64_t k : o.top_k) ZAYA_CHECK(k > 0, "--top-k: values must be positive, found {}", k);
      const auto cs = sz::moe_sweep(base, hw, o);
      print_candidates(cs, true);
      fmt::print("\n* = on the Pareto front of training throughput vs decode latency\n");
      if (!svg_path.empty()) {
        sz::write_moe_plot(cs, hw.device, svg_path);
        fmt::print("wrote {}\n", svg_path);
      }
      write_json(json_path, search_json("zaya.size_moe/1", hw.device, o, cs));
    } else {
      if (!hidden.empty()) o.hidden = hidden;
      if (!layers.empty()) o.layers = layers;
      if (!prop_experts.empty()) o.experts = prop_experts;
      if (!prop_top_k.empty()) o.top_k = prop_top_k;
      for (int64_t d : o.hidden)
        ZAYA_CHECK(d > 0 && d % 256 == 0,
                   "--hidden: sizes must be positive multiples of 256 (head dim 128, Hq·d = D/2), "
                   "found {}",
                   d);
      for (int64_t l : o.layers)
        ZAYA_CHECK(l > 0, "--layers: depths must be positive, found {}", l);
      for (int64_t e : o.experts)
        ZAYA_CHECK(e > 0, "--experts: counts must be positive, found {}", e);
      for (int64_t k : o.top_k) ZAYA_CHECK(k > 0, "--top-k: values must be positive, found {}", k);
      const auto cs = sz::propose(base, hw, o, top);
      ZAYA_CHECK(!cs.empty(),
                 "no candidate within ±{:.0f}% of {} total / {} active passes the rules on {} "
                 "(try --tolerance or more --ranks)",
                 100 * o.budget.tolerance, si(o.budget.total), si(o.budget.active), hw.device);
      print_candidates(cs, false);
      fmt::print("\nranked by training tokens/s per GPU; * = Pareto front with decode latency\n");
      write_json(json_path, search_json("zaya.size_propose/1", hw.device, o, cs));
    }
    return 0;
  }

  if (*io) {
    const sz::IoSizing r = sz::size_io(ioin);
    fmt::print("bytes per step      {:.4g} ({} × {} tokens × {} B)\n", r.bytes_per_step,
               ioin.global_batch, ioin.seq, ioin.bytes_per_token);
    fmt::print("pages per step      {:.6g} (σ = {})\n", r.pages_per_step, ioin.scatter);
    fmt::print("required IOPS       {:.6g} at {} s per step\n", r.required_iops, ioin.step_time);
    fmt::print("break-even step     {:.4g} s at {} IOPS\n", r.break_even_step_s, ioin.iops);
    const bool ok = r.required_iops <= ioin.iops;
    fmt::print("result: {} (storage gives {:.3g}× the required IOPS)\n", ok ? "pass" : "fail",
               r.headroom);
    json j = r.to_json();
    j["schema"] = "zaya.size_io/1";
    j["result"] = ok ? "pass" : "fail";
    write_json(json_path, j);
    return ok ? 0 : kExitRuleFailed;
  }

  if (*hwc) {
    if (hw_show.empty()) {
      for (auto& n : sz::builtin_hardware_names()) {
        auto h = sz::builtin_hardware(n);
        fmt::print("{:<8} {}\n", n, h.device);
      }
      return 0;
    }
    fmt::print("{}\n", sz::load_hardware(hw_show).to_json().dump(2));
    return 0;
  }
  return 2;
}

}  // namespace

ZAYA_COMMAND("size", "hardware-aware sizing rules, cost model and MoE width sweeps", run_size);
