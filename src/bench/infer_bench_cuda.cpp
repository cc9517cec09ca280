// run_infer_bench (infer_bench.h) on the CUDA inference engine.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/cuda/decode/decode_kernels.h"
#include "bench/bench_model.h"
#include "bench/decode_trace.h"
#include "bench/infer_bench.h"
#include "bench/mem_bench.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/cuda/infer_cuda.h"
#include "io/atomic.h"
#include "model/config.h"

namespace zaya::bench {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int run_infer_bench(const InferBenchOptions& a) {
  ZAYA_CHECK(!a.trace || cuda::decode_trace_built(),
             "--trace: this zaya was built without decode tracing (configure with "
             "-DZAYA_DECODE_TRACE=ON)");
  ZayaConfig cfg = ZayaConfig::preset(a.preset);
  if (a.layers > 0) cfg = cfg.with_layers(a.layers);
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
    MemBenchOptions mo;
    mo.tests = {"copy"};
    mo.sizes = {uint64_t(1) << 30};
    mo.iters = 10;
    mo.warmup = 2;
    copy_gbs = mem_best_gbs(run_mem_bench(mo, 0.0), "copy", uint64_t(1) << 30);
    ZAYA_CHECK(copy_gbs > 0, "zaya bench infer: the device copy bandwidth could not be measured");
  }
  std::fprintf(stderr, "# building a random %s model with %lld layers ...\n", a.preset.c_str(),
               (long long)cfg.num_hidden_layers);
  ZayaModel m = random_model(cfg, a.seed);
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
      inf.set_decode_skip(1u << op);
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
    inf.set_decode_skip(0);
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
        summarize_decode_trace(stamps, names, unsigned(cuda::DecodeTraceEvent::Advance));
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
                        {"decode_ablation", ablation},
                        {"decode_trace", trace}};
    write_file_atomic(a.json, j.dump(1) + "\n");
  }
  return 0;
}

}  // namespace zaya::bench
