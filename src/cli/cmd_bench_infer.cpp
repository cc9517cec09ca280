// `zaya bench infer`: GPU inference speed of a preset at a chosen depth on random weights: prefill
// tokens/s for a batch of prompts, and cached decode time per step with its fraction of the
// memory-bandwidth roofline (bytes a step must read — active weights, LM head, K/V cache — over
// the measured device copy bandwidth). tools/bench_infer_peer.py measures transformers' generate
// on the same model shape for comparison. Deliberately not here: sampling (greedy on the device),
// tokenization, mixed-length batches.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/bench_model.h"
#include "bench/decode_trace.h"
#include "bench/mem_bench.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/atomic.h"
#include "model/config.h"
#if defined(ZAYA_HAVE_CUDA)
#include <cuda_runtime.h>

#include "engine/cuda/infer_cuda.h"
#include "backend/cuda/decode/decode_kernels.h"
#endif

namespace zaya::cli {

int bench_infer_cli(int argc, char** argv);

namespace {

struct BenchInferArgs {
  std::string preset = "zaya1-base", json, write_config;
  int64_t layers = 0, batch = 1, prompt = 4096, decode = 128, warmup = 8, repeats = 3;
  double copy_gbs = 0.0;  // 0: measured on the device at start
  bool no_graphs = false, profile = false, ablate = false, trace = false;
  std::vector<int> attn_chunks, attn_pipes, attn_stage, router_clusters, fuse_norms, fold_qkv_norm,
      router_stage, router_spread, norm_early, oproj_early, gemv_stage_x, attn_cluster, router_regs,
      fused_ends, lm_head_l2, fuse_cca, fuse_experts, attn_exact, attn_finish, down_smem, carveout,
      down_l2, evict_first, lm_head_pre, lm_head_persist, router_async, router_norm, expert_stage_x,
      router_stage_x, router_down_in_norm, qkv_norm_gemv, lm_head_stage_x, lm_head_no_l1,
      attn_trigger, down_rows, mlp_norm_early;
  uint64_t seed = 1234;
};

#if defined(ZAYA_HAVE_CUDA)
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run(const BenchInferArgs& a) {
  ZAYA_CHECK(!a.trace || cuda::decode_trace_built(),
             "--trace: this zaya was built without decode tracing (configure with "
             "-DZAYA_DECODE_TRACE=ON)");
  ZayaConfig cfg = ZayaConfig::preset(a.preset);
  if (a.layers > 0) {
    cfg.num_hidden_layers = a.layers;
    if (!cfg.layer_types.empty()) cfg.layer_types.resize(size_t(a.layers));
  }
  cfg.max_position_embeddings =
      std::max(cfg.max_position_embeddings, a.prompt + a.decode + a.warmup);
  cfg.validate("bench infer");
  if (!a.write_config.empty()) {  // the same shape for tools/bench_infer_peer.py
    write_file_atomic(a.write_config, cfg.to_json().dump(2) + "\n");
    std::printf("# wrote %s\n", a.write_config.c_str());
    return 0;
  }
  int ndev = 0;
  const cudaError_t e = cudaGetDeviceCount(&ndev);
  ZAYA_CHECK(e == cudaSuccess && ndev > 0, "zaya bench infer: no CUDA device ({})",
             e == cudaSuccess ? "0 found" : cudaGetErrorString(e));
  // The roofline's bandwidth: given, or measured here before the model takes the device's memory
  // (zaya bench mem's copy kernel over 1 GiB buffers, read + written bytes, best of 10 passes).
  double copy_gbs = a.copy_gbs;
  const bool copy_measured = copy_gbs <= 0;
  if (copy_measured) {
    bench::MemBenchOptions mo;
    mo.tests = {"copy"};
    mo.sizes = {uint64_t(1) << 30};
    mo.iters = 10;
    mo.warmup = 2;
    copy_gbs = bench::mem_best_gbs(bench::run_mem_bench(mo, 0.0), "copy", uint64_t(1) << 30);
    ZAYA_CHECK(copy_gbs > 0, "zaya bench infer: the device copy bandwidth could not be measured");
  }
  std::fprintf(stderr, "# building a random %s model with %lld layers ...\n", a.preset.c_str(),
               (long long)cfg.num_hidden_layers);
  ZayaModel m = bench::random_model(cfg, a.seed);
  cuda::CudaInferOptions io;
  io.max_batch = a.batch;
  io.max_context = a.prompt + a.warmup + a.decode + 1;
  io.max_prefill_tokens = a.batch * a.prompt;
  io.graphs = !a.no_graphs;
  cuda::CudaInference inf(m, io);
  Rng rng(a.seed + 1);
  std::vector<int32_t> ids(size_t(a.batch * a.prompt));
  for (auto& t : ids) t = int32_t(rng.next_u32() % uint32_t(cfg.vocab_size));
  // Prefill: median of `repeats` timed passes over the same prompts (after one untimed pass).
  std::vector<double> pre;
  for (int64_t r = 0; r <= a.repeats; r++) {
    inf.reset(a.batch);
    const double t0 = now_s();
    inf.prefill(ids, a.prompt);  // returns after copying the logits to the host
    if (r > 0) pre.push_back(now_s() - t0);
  }
  std::sort(pre.begin(), pre.end());
  const double prefill_s = pre[pre.size() / 2];
  // Decode: greedy steps on the device after a fresh prefill; warm-up steps capture the graph.
  // Returns seconds per step and the bytes a step reads (the mean of the first and last step's);
  // `last` ends as the tokens that follow the timed steps.
  std::vector<int32_t> first(size_t(a.batch)), last;
  for (int64_t b = 0; b < a.batch; b++) first[size_t(b)] = ids[size_t(b * a.prompt)];
  auto time_decode = [&](double& bytes_per_step) {
    inf.reset(a.batch);
    inf.prefill(ids, a.prompt);
    const auto warm = inf.decode_greedy(first, a.warmup);
    inf.prepare_decode_graphs();  // no graph capture inside the timed steps
    const double bytes0 = inf.decode_bytes_per_step();
    last.assign(warm.end() - a.batch, warm.end());
    const double t0 = now_s();
    const auto out = inf.decode_greedy(last, a.decode);
    const double s = (now_s() - t0) / double(a.decode);
    bytes_per_step = 0.5 * (bytes0 + inf.decode_bytes_per_step());
    last.assign(out.end() - a.batch, out.end());
    return s;
  };
  double bytes = 0;
  const double decode_s = time_decode(bytes);
  const double roofline_s = bytes / (copy_gbs * 1e9);
  const double prefill_tps = double(a.batch * a.prompt) / prefill_s;
  const double decode_tps = double(a.batch) / decode_s;
  std::printf("# zaya bench infer: %s, %lld layers, batch %lld, prompt %lld, %lld decode steps%s\n",
              a.preset.c_str(), (long long)cfg.num_hidden_layers, (long long)a.batch,
              (long long)a.prompt, (long long)a.decode, a.no_graphs ? " (no graphs)" : "");
  std::printf("%-28s %14.1f\n", "prefill tokens/s", prefill_tps);
  std::printf("%-28s %14.3f\n", "prefill ms", prefill_s * 1e3);
  std::printf("%-28s %14.3f\n", "decode ms/step", decode_s * 1e3);
  std::printf("%-28s %14.1f\n", "decode tokens/s", decode_tps);
  std::printf("%-28s %14.3f\n", "decode GB read/step", bytes / 1e9);
  std::printf("%-28s %14.1f  (%s)\n", "copy GB/s", copy_gbs,
              copy_measured ? "measured: 1 GiB copy, read + written bytes" : "--copy-gbs");
  std::printf("%-28s %14.3f\n", "roofline ms/step", roofline_s * 1e3);
  std::printf("%-28s %14.3f\n", "fraction of roofline", roofline_s / decode_s);
  std::printf("%-28s %14.2f\n", "device GiB", double(inf.device_bytes()) / double(1 << 30));
  nlohmann::json prof = nlohmann::json::object();
  if (a.profile) {  // one eager step, events between ops (launch gaps included)
    const auto ops = inf.profile_decode(last);
    double total = 0;
    for (const auto& [name, ms] : ops) total += ms;
    std::printf("# one eager decode step by op class (%.3f ms, launch gaps included):\n", total);
    for (const auto& [name, ms] : ops) {
      std::printf("  %-28s %9.3f ms %6.1f%%\n", name.c_str(), ms, 100.0 * ms / total);
      prof[name] = ms;
    }
  }
  // Decode variants: every combination of the values given to the variant options (an option not
  // given keeps the default's value; the norm fused and folded at once is no variant), the same
  // prompt and steps, the graph captured again for each. The table shows the options given; the
  // JSON rows hold every choice.
  struct Axis {
    const char* key;                 // JSON field and column header
    const std::vector<int>* values;  // the option's values (empty: the default's only)
    int dflt;                        // the default tuning's value
    void (*apply)(cuda::DecodeTuning&, int);
    bool count;                 // printed as a number rather than yes/no
    const char* zero = "auto";  // how a count of 0 is printed
  };
  const cuda::DecodeTuning dflt;
  const std::vector<Axis> axes = {
      {"attn_chunk", &a.attn_chunks, dflt.attn_chunk,
       [](cuda::DecodeTuning& t, int v) { t.attn_chunk = v; }, true},
      {"attn_pipe", &a.attn_pipes, dflt.attn_pipe,
       [](cuda::DecodeTuning& t, int v) { t.attn_pipe = v; }, true},
      {"attn_stage_combine", &a.attn_stage, dflt.attn_stage_combine,
       [](cuda::DecodeTuning& t, int v) { t.attn_stage_combine = v != 0; }, false},
      {"attn_cluster", &a.attn_cluster, dflt.attn_cluster,
       [](cuda::DecodeTuning& t, int v) { t.attn_cluster = v != 0; }, false},
      {"router_cluster", &a.router_clusters, dflt.router_cluster,
       [](cuda::DecodeTuning& t, int v) { t.router_cluster = v; }, true},
      {"router_stage", &a.router_stage, dflt.router_stage,
       [](cuda::DecodeTuning& t, int v) { t.router_stage = v != 0; }, false},
      {"router_one_per_sm", &a.router_spread, dflt.router_one_per_sm,
       [](cuda::DecodeTuning& t, int v) { t.router_one_per_sm = v != 0; }, false},
      {"router_mlp_regs", &a.router_regs, dflt.router_mlp_regs,
       [](cuda::DecodeTuning& t, int v) { t.router_mlp_regs = v != 0; }, false},
      {"router_async", &a.router_async, dflt.router_async,
       [](cuda::DecodeTuning& t, int v) { t.router_async = v != 0; }, false},
      {"expert_stage_x", &a.expert_stage_x, dflt.expert_stage_x,
       [](cuda::DecodeTuning& t, int v) { t.expert_stage_x = v != 0; }, false},
      {"router_stage_x", &a.router_stage_x, dflt.router_stage_x,
       [](cuda::DecodeTuning& t, int v) { t.router_stage_x = v != 0; }, false},
      {"router_down_in_norm", &a.router_down_in_norm, dflt.router_down_in_norm,
       [](cuda::DecodeTuning& t, int v) { t.router_down_in_norm = v != 0; }, false},
      {"qkv_norm_gemv", &a.qkv_norm_gemv, dflt.qkv_norm_gemv,
       [](cuda::DecodeTuning& t, int v) { t.qkv_norm_gemv = v != 0; }, false},
      {"lm_head_stage_x", &a.lm_head_stage_x, dflt.lm_head_stage_x,
       [](cuda::DecodeTuning& t, int v) { t.lm_head_stage_x = v != 0; }, false},
      {"lm_head_no_l1", &a.lm_head_no_l1, dflt.lm_head_no_l1,
       [](cuda::DecodeTuning& t, int v) { t.lm_head_no_l1 = v != 0; }, false},
      {"router_norm", &a.router_norm, dflt.router_norm,
       [](cuda::DecodeTuning& t, int v) { t.router_norm = v != 0; }, false},
      {"fuse_norms", &a.fuse_norms, dflt.fuse_norms,
       [](cuda::DecodeTuning& t, int v) { t.fuse_norms = v != 0; }, false},
      {"fold_qkv_norm", &a.fold_qkv_norm, dflt.fold_qkv_norm,
       [](cuda::DecodeTuning& t, int v) { t.fold_qkv_norm = v != 0; }, false},
      {"norm_early_trigger", &a.norm_early, dflt.norm_early_trigger,
       [](cuda::DecodeTuning& t, int v) { t.norm_early_trigger = v != 0; }, false},
      {"mlp_norm_early_trigger", &a.mlp_norm_early, dflt.mlp_norm_early_trigger,
       [](cuda::DecodeTuning& t, int v) { t.mlp_norm_early_trigger = v != 0; }, false},
      {"oproj_early_trigger", &a.oproj_early, dflt.oproj_early_trigger,
       [](cuda::DecodeTuning& t, int v) { t.oproj_early_trigger = v != 0; }, false},
      {"gemv_stage_x", &a.gemv_stage_x, dflt.gemv_stage_x,
       [](cuda::DecodeTuning& t, int v) { t.gemv_stage_x = v != 0; }, false},
      {"fused_step_ends", &a.fused_ends, dflt.fused_step_ends,
       [](cuda::DecodeTuning& t, int v) { t.fused_step_ends = v != 0; }, false},
      {"fuse_cca", &a.fuse_cca, dflt.fuse_cca,
       [](cuda::DecodeTuning& t, int v) { t.fuse_cca = v != 0; }, false},
      {"attn_exact_heads", &a.attn_exact, dflt.attn_exact_heads,
       [](cuda::DecodeTuning& t, int v) { t.attn_exact_heads = v != 0; }, false},
      {"attn_trigger", &a.attn_trigger, dflt.attn_trigger,
       [](cuda::DecodeTuning& t, int v) { t.attn_trigger = v; }, true, "0"},
      {"expert_down_rows", &a.down_rows, dflt.expert_down_rows,
       [](cuda::DecodeTuning& t, int v) { t.expert_down_rows = v; }, true},
      {"attn_finish", &a.attn_finish, dflt.attn_finish,
       [](cuda::DecodeTuning& t, int v) { t.attn_finish = v != 0; }, false},
      {"smem_carveout", &a.carveout, dflt.smem_carveout,
       [](cuda::DecodeTuning& t, int v) { t.smem_carveout = v; }, true, "0"},
      {"expert_down_l2", &a.down_l2, dflt.expert_down_l2,
       [](cuda::DecodeTuning& t, int v) { t.expert_down_l2 = v != 0; }, false},
      {"expert_down_smem", &a.down_smem, dflt.expert_down_smem,
       [](cuda::DecodeTuning& t, int v) { t.expert_down_smem = v != 0; }, false},
      {"fuse_experts", &a.fuse_experts, dflt.fuse_experts,
       [](cuda::DecodeTuning& t, int v) { t.fuse_experts = v != 0; }, false},
      {"weights_evict_first", &a.evict_first, dflt.weights_evict_first,
       [](cuda::DecodeTuning& t, int v) { t.weights_evict_first = v != 0; }, false},
      {"lm_head_prefetch", &a.lm_head_pre, dflt.lm_head_prefetch,
       [](cuda::DecodeTuning& t, int v) { t.lm_head_prefetch = v != 0; }, false},
      {"lm_head_persistent", &a.lm_head_persist, dflt.lm_head_persistent,
       [](cuda::DecodeTuning& t, int v) { t.lm_head_persistent = v != 0; }, false},
      {"lm_head_l2_mib", &a.lm_head_l2, dflt.lm_head_l2_mib,
       [](cuda::DecodeTuning& t, int v) { t.lm_head_l2_mib = v; }, true, "none"},
  };
  nlohmann::json variants = nlohmann::json::array();
  if (std::any_of(axes.begin(), axes.end(), [](const Axis& x) { return !x.values->empty(); })) {
    std::printf("# decode variants (same prompt and steps; graph captured again for each):\n ");
    for (const Axis& x : axes)
      if (!x.values->empty()) std::printf(" %s", x.key);
    std::printf("  ms/step  roofline\n");
    // The combinations in the order of nested loops over the axes (the last one innermost).
    std::vector<std::vector<int>> vals;
    for (const Axis& x : axes)
      vals.push_back(x.values->empty() ? std::vector<int>{x.dflt} : *x.values);
    std::vector<std::vector<int>> combos{{}};
    for (const auto& v : vals) {
      std::vector<std::vector<int>> next;
      for (const auto& c : combos)
        for (int x : v) {
          next.push_back(c);
          next.back().push_back(x);
        }
      combos = std::move(next);
    }
    for (const std::vector<int>& c : combos) {
      cuda::DecodeTuning t;
      for (size_t i = 0; i < axes.size(); i++) axes[i].apply(t, c[i]);
      if (t.fuse_norms && t.fold_qkv_norm) continue;  // one or the other
      nlohmann::json row = nlohmann::json::object();
      std::printf(" ");
      for (size_t i = 0; i < axes.size(); i++) {
        const int w = int(std::strlen(axes[i].key));
        const bool shown = !axes[i].values->empty();
        if (axes[i].count) {
          row[axes[i].key] = c[i];
          if (shown) std::printf(" %*s", w, c[i] ? std::to_string(c[i]).c_str() : axes[i].zero);
        } else {
          row[axes[i].key] = c[i] != 0;
          if (shown) std::printf(" %*s", w, c[i] ? "yes" : "no");
        }
      }
      std::printf(" ");
      // A variant the device refuses (a launch configuration it cannot schedule) is reported and
      // skipped, so that the others are still timed.
      try {
        inf.set_decode_tuning(t);
        double vb = 0;
        const double vs = time_decode(vb);
        const double frac = vb / (copy_gbs * 1e9) / vs;
        std::printf("%8.4f %9.3f\n", vs * 1e3, frac);
        row["decode_ms_per_step"] = vs * 1e3;
        row["roofline_fraction"] = frac;
      } catch (const std::exception& e) {
        std::printf("failed: %s\n", e.what());
        row["error"] = e.what();
      }
      std::fflush(stdout);
      variants.push_back(row);
    }
    inf.set_decode_tuning(cuda::DecodeTuning{});
  }
  // --ablate: the step without each op class in turn (a timing experiment: the tokens decoded
  // meanwhile are meaningless), so the difference is what the class costs inside the graph,
  // overlaps with its neighbours included. The full step is timed again first (the default
  // tuning is in effect here), next to the runs it is compared with.
  nlohmann::json ablation = nlohmann::json::object();
  if (a.ablate) {
    double base_bytes = 0;
    const double base_s = time_decode(base_bytes);
    std::printf("# decode step without each op class (timing only; %.4f ms with all):\n",
                base_s * 1e3);
    std::printf("  %-12s %12s %14s %14s\n", "without", "ms/step", "saved us/step", "us/layer");
    for (unsigned op = 0; op < unsigned(cuda::DecodeOp::Count); op++) {
      cuda::DecodeTuning t;
      t.skip = 1u << op;
      inf.set_decode_tuning(t);
      double vb = 0;
      const double vs = time_decode(vb);
      const bool per_layer = cuda::DecodeOp(op) != cuda::DecodeOp::LmHead;
      const double saved_us = (base_s - vs) * 1e6;
      const char* name = cuda::decode_op_name(cuda::DecodeOp(op));
      std::printf("  %-12s %12.4f %14.1f %14s\n", name, vs * 1e3, saved_us,
                  per_layer
                      ? fmt::format("{:.1f}", saved_us / double(cfg.num_hidden_layers)).c_str()
                      : "-");
      ablation[name] = {{"decode_ms_per_step", vs * 1e3}, {"saved_us_per_step", saved_us}};
    }
    ablation["all"] = {{"decode_ms_per_step", base_s * 1e3}};
    inf.set_decode_tuning(cuda::DecodeTuning{});
  }
  // --trace: the same greedy steps with every decode kernel stamping the global timer as it passes
  // its wait; the gaps between stamps are each kernel's cost on the critical path of the graph.
  nlohmann::json trace = nlohmann::json::object();
  if (a.trace) {
    inf.reset(a.batch);
    inf.prefill(ids, a.prompt);
    const auto warm = inf.decode_greedy(first, a.warmup);
    inf.prepare_decode_graphs();
    last.assign(warm.end() - a.batch, warm.end());
    const auto stamps = inf.trace_decode(last, a.decode, nullptr);
    std::vector<std::string> names;
    for (unsigned e = 0; e < unsigned(cuda::DecodeTraceEvent::Count); e++)
      names.push_back(cuda::decode_trace_event_name(cuda::DecodeTraceEvent(e)));
    const auto sum =
        bench::summarize_decode_trace(stamps, names, unsigned(cuda::DecodeTraceEvent::Advance));
    std::printf(
        "# decode trace: %lld steps, %.1f us from one step's last stamp to the next (the gap "
        "between graph replays included; untimed steps %.1f us): time from a kernel passing its "
        "wait to the next stamp\n",
        (long long)sum.steps, sum.step_us, decode_s * 1e6);
    std::printf("  %-16s %-16s %9s %9s %10s %7s\n", "from", "to", "per step", "mean us", "us/step",
                "share");
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : sum.rows) {
      std::printf("  %-16s %-16s %9.2f %9.2f %10.1f %6.1f%%\n", r.from.c_str(), r.to.c_str(),
                  r.per_step, r.mean_us, r.total_us, 100.0 * r.total_us / sum.step_us);
      rows.push_back({{"from", r.from},
                      {"to", r.to},
                      {"per_step", r.per_step},
                      {"mean_us", r.mean_us},
                      {"us_per_step", r.total_us}});
    }
    trace = {{"steps", sum.steps}, {"step_us", sum.step_us}, {"transitions", rows}};
  }
  if (!a.json.empty()) {
    nlohmann::json j = {{"preset", a.preset},
                        {"layers", cfg.num_hidden_layers},
                        {"batch", a.batch},
                        {"prompt", a.prompt},
                        {"decode_steps", a.decode},
                        {"graphs", !a.no_graphs},
                        {"prefill_tokens_per_s", prefill_tps},
                        {"prefill_ms", prefill_s * 1e3},
                        {"decode_ms_per_step", decode_s * 1e3},
                        {"decode_tokens_per_s", decode_tps},
                        {"decode_bytes_per_step", bytes},
                        {"copy_gbs", copy_gbs},
                        {"copy_gbs_measured", copy_measured},
                        {"roofline_ms_per_step", roofline_s * 1e3},
                        {"roofline_fraction", roofline_s / decode_s},
                        {"device_bytes", inf.device_bytes()},
                        {"eager_step_profile_ms", prof},
                        {"decode_variants", variants},
                        {"decode_ablation", ablation},
                        {"decode_trace", trace}};
    write_file_atomic(a.json, j.dump(1) + "\n");
  }
  return 0;
}
#endif

}  // namespace

int bench_infer_cli(int argc, char** argv) {
  CLI::App app{
      "GPU inference speed: prefill tokens/s, decode time per step vs the bandwidth roofline",
      "zaya bench infer"};
  BenchInferArgs a;
  app.add_option("--preset", a.preset, "model preset (tiny, zaya1-base, zaya1-8b)");
  app.add_option("--layers", a.layers, "layers (default: the preset's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", a.batch, "sequences (1..8)")->check(CLI::Range(1, 8));
  app.add_option("--prompt", a.prompt, "prompt tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("--decode", a.decode, "timed decode steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed decode steps first")->check(CLI::PositiveNumber);
  app.add_option("--repeats", a.repeats, "timed prefill passes (median)")
      ->check(CLI::PositiveNumber);
  app.add_option("--copy-gbs", a.copy_gbs,
                 "device copy bandwidth for the roofline (GB/s, read + written bytes); 0 (the "
                 "default): measured on the device at start with zaya bench mem's copy kernel")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-graphs", a.no_graphs, "launch decode kernels one by one (no CUDA graph)");
  app.add_flag("--profile", a.profile, "also time one eager decode step by op class");
  // A decode choice timed off (0), on (1) or both (0,1).
  auto on_off = [&app](const char* name, std::vector<int>& v, const std::string& help) {
    app.add_option(name, v, help)->delimiter(',')->check(CLI::IsMember({0, 1}));
  };
  app.add_option("--attn-chunks", a.attn_chunks,
                 "also time decode with these attention keys per chunk (multiples of 16 up to "
                 "256; 0: automatic)")
      ->delimiter(',')
      ->check(CLI::Range(0, 256));
  app.add_option("--attn-pipes", a.attn_pipes,
                 "also time decode with these attention passes in flight (1, 2, 4)")
      ->delimiter(',')
      ->check(CLI::IsMember({1, 2, 4}));
  on_off("--attn-stage", a.attn_stage,
         "also time decode with the attention combine staging the chunk partials in "
         "shared memory beside its (max, sum) pass (1), or loading them after it (0)");
  on_off("--attn-cluster", a.attn_cluster,
         "also time decode with the attention as one thread-block cluster per kv head, combined "
         "in shared memory (1), or split over chunks combined through global memory (0)");
  on_off("--fold-qkv-norm", a.fold_qkv_norm,
         "also time decode with the post-MLP residual norm computed by the next layer's "
         "q|k|v GEMV (1) or by a launch of its own (0)");
  on_off("--fuse-norms", a.fuse_norms,
         "also time decode with the residual norms fused into the o projection and the "
         "expert combine (1) and as launches of their own (0)");
  on_off("--norm-early", a.norm_early,
         "also time decode with the residual norm launches letting their successor start "
         "before they wait on their own predecessor (1), or after (0)");
  on_off("--mlp-norm-early", a.mlp_norm_early,
         "also time decode with the post-MLP residual norm triggering the next q|k|v GEMV before "
         "its own wait (1, as the other norms with --norm-early) or after it (0)");
  on_off("--oproj-early", a.oproj_early,
         "also time decode with the o projection letting its successor start before it waits "
         "on its own predecessor (1), or after (0)");
  on_off("--gemv-stage-x", a.gemv_stage_x,
         "also time decode with the q|k|v and o GEMVs copying their input rows into shared "
         "memory once per block (1), or every warp reading them from global memory (0)");
  on_off("--fused-ends", a.fused_ends,
         "also time decode with the step's ends in fewer launches (the embedding with the first "
         "norm; the LM head with its argmax and one launch committing the token) (1), or as "
         "separate launches (0)");
  on_off("--fuse-cca", a.fuse_cca,
         "also time decode with the CCA convolutions and finish as one launch per head (1), or "
         "as two launches (0)");
  on_off("--attn-exact", a.attn_exact,
         "also time decode with the attention kernel compiled for exactly 4 query heads per kv "
         "head (1), or for up to 8 (0)");
  on_off("--attn-finish", a.attn_finish,
         "also time decode with the CCA finish folded into the attention launch (1), or as a "
         "launch of its own (0)");
  app.add_option("--attn-trigger", a.attn_trigger,
                 "also time decode with the attention blocks letting the o projection start after "
                 "their wait (0), once their scores are computed (1) or once their partials are "
                 "stored (2)")
      ->delimiter(',')
      ->check(CLI::IsMember({0, 1, 2}));
  app.add_option("--down-rows", a.down_rows,
                 "also time decode with these output rows per block of the expert-down launch "
                 "(8, 4, 2; with staged input rows)")
      ->delimiter(',')
      ->check(CLI::IsMember({2, 4, 8}));
  app.add_option("--carveout", a.carveout,
                 "also time decode with every decode kernel asking for this shared-memory "
                 "carveout (percent of the largest; -1: the driver's choice per kernel)")
      ->delimiter(',')
      ->check(CLI::Range(-1, 100));
  on_off("--down-l2", a.down_l2,
         "also time decode with the SwiGLU launch hinting the chosen expert's down rows towards "
         "L2 (1), or not (0)");
  on_off("--down-smem", a.down_smem,
         "also time decode with the expert-down launch staging its weight rows in shared "
         "memory before its wait (1), or in registers (0)");
  on_off("--fuse-experts", a.fuse_experts,
         "also time decode with the expert SwiGLU and down products as one launch with a grid "
         "barrier (1), or as two launches (0)");
  on_off("--evict-first", a.evict_first,
         "also time decode with the weight streams loaded with L2 evict_first priority (1), or "
         "the default evict_normal (0)");
  on_off("--lm-head-pre", a.lm_head_pre,
         "also time decode with the LM head's rows loaded before its dependency wait (1), or "
         "after it (0)");
  on_off("--lm-head-persist", a.lm_head_persist,
         "also time decode with the LM head as one resident grid striding over its rows (1), or "
         "one block per 8 rows (0)");
  app.add_option("--lm-head-l2", a.lm_head_l2,
                 "also time decode with this many MiB of the LM head's first rows kept in L2 "
                 "across steps (0: none; clamped to the device's persisting set-aside)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1024));
  on_off("--router-stage", a.router_stage,
         "also time decode with the router's MLP rows staged in shared memory (1) or read "
         "where they are (0)");
  on_off("--router-regs", a.router_regs,
         "also time decode with the router's MLP rows loaded into registers before its wait (1) "
         "or staged in shared memory (0)");
  on_off("--router-async", a.router_async,
         "also time decode with the router's stages exchanging their results by st.async "
         "stores counted on mbarriers (1) or by stores and a cluster barrier per stage (0)");
  on_off("--expert-stage-x", a.expert_stage_x,
         "also time decode with the expert launches staging their input row in shared memory "
         "(1) or reading it from global memory in every warp (0)");
  on_off("--router-stage-x", a.router_stage_x,
         "also time decode with the router staging its row of x in shared memory (1) or "
         "reading it from global memory in every warp (0)");
  on_off("--router-down-in-norm", a.router_down_in_norm,
         "also time decode with the post-attention norm's launch computing the router's "
         "down-projection sums, the router starting from them (1), or the router computing them "
         "(0)");
  on_off("--qkv-norm-gemv", a.qkv_norm_gemv,
         "also time decode with the post-MLP norm computed by every block of the next q|k|v "
         "projection, its vectors in registers (1), or by a launch of its own (0)");
  on_off("--lm-head-stage-x", a.lm_head_stage_x,
         "also time decode with the LM head's blocks staging the input row in shared memory (1) "
         "or every warp reading it from global memory (0)");
  on_off("--lm-head-no-l1", a.lm_head_no_l1,
         "also time decode with the LM head's rows loaded without allocating in L1 (1) or "
         "normally (0)");
  on_off("--router-norm", a.router_norm,
         "also time decode with the post-attention residual norm computed by the router's "
         "cluster (1) or by a launch of its own before it (0)");
  on_off("--router-spread", a.router_spread,
         "also time decode with the router's shared memory padded so that each block of "
         "its cluster has an SM to itself (1), or not (0)");
  app.add_option("--router-clusters", a.router_clusters,
                 "also time decode with these router cluster size limits (1, 2, 4, 8, 16; 0: "
                 "automatic)")
      ->delimiter(',')
      ->check(CLI::IsMember({0, 1, 2, 4, 8, 16}));
  app.add_flag("--ablate", a.ablate,
               "also time the decode step without each op class in turn (what each costs in the "
               "graph; the tokens decoded meanwhile are meaningless)");
  app.add_flag("--trace", a.trace,
               "also trace the decode graph: each kernel stamps the global timer as it passes its "
               "wait, and the gaps are summed per kernel-to-kernel transition (needs a build "
               "configured with -DZAYA_DECODE_TRACE=ON)");
  app.add_option("--json", a.json, "write the results as JSON");
  app.add_option("--seed", a.seed, "weights and prompt seed");
  app.add_option("--write-config", a.write_config,
                 "only write the benchmarked model's config.json here (for the peer) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (int ch : a.attn_chunks)
    ZAYA_CHECK(ch % 16 == 0, "zaya bench infer: --attn-chunks: {} is not a multiple of 16", ch);
#if defined(ZAYA_HAVE_CUDA)
  return run(a);
#else
  fail("zaya bench infer: this zaya was built without CUDA");
#endif
}

}  // namespace zaya::cli
