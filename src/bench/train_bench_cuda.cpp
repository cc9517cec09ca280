// The CUDA training-step benchmark (bench/train_bench.h): CudaModel forward + backward, the global
// gradient norm and CudaOptimizer's AdamW/Muon on random weights and tokens, timed, profiled by op
// class, and compared with the sizing cost model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "bench/bench_model.h"
#include "bench/profile.h"
#include "bench/train_bench.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/plot.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "engine/cuda/model_cuda.h"
#include "engine/cuda/optim_cuda.h"
#include "engine/data_parallel_step.h"
#include "model/config.h"
#include "model/zaya.h"
#include "sizing/cost_model.h"
#include "sizing/hardware.h"
#include "sizing/model_shape.h"

namespace zaya::bench {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

nlohmann::json profile_json(const cuda::OpClassTimes& p) {
  return {{"gemm", p.gemm},   {"attention", p.attention}, {"moe_dispatch", p.moe_dispatch},
          {"norms", p.norms}, {"loss", p.loss},           {"cca", p.cca},
          {"other", p.other}};
}

// The sizing cost model's prediction for the benchmarked step (issue: sizing rules), by the op
// classes of the profile: the pure roofline of `hw` (non-GEMM kernels at the peak and the copy
// bandwidth), the calibrated model (the profile's kernel efficiencies: `zaya bench kernels`, or the
// built-in defaults) and what the step took.
nlohmann::json cost_model_check(const ZayaConfig& cfg, const TrainBenchOptions& a,
                                const std::string& hw_name, const cuda::OpClassTimes* prof,
                                double optimizer_ms, double step_ms) {
  const sizing::HardwareProfile hw = sizing::load_hardware(hw_name);
  sizing::TrainSetup ts;
  ts.micro_batch = a.batch;
  ts.seq = a.seq;
  ts.ranks = 1;
  ts.recompute = a.recompute;
  ts.optimizer = a.optimizer == "muon" ? sizing::OptimizerKind::Muon : sizing::OptimizerKind::AdamW;
  const sizing::TrainEstimate cal = sizing::estimate_training(cfg, hw, ts);
  const sizing::TrainEstimate roof = sizing::estimate_training(cfg, hw.roofline(), ts);
  // Cost-model ops grouped as the CUDA profile groups its kernels.
  auto cls = [](const std::string& op) -> std::string {
    if (op == "attention" || op == "attention_sliding") return "attention";
    if (op == "cca_conv" || op == "qk_norm_rope") return "cca";
    if (op == "norms_residual") return "norms";
    if (op == "final_norm_loss") return "loss";
    if (op == "dispatch_combine" || op == "swiglu" || op == "router_softmax")
      return "dispatch+other";
    return "gemm";
  };
  std::map<std::string, double> pred, pred_r;
  for (const auto& o : cal.ops) pred[cls(o.name)] += o.seconds * 1e3;
  for (const auto& o : roof.ops) pred_r[cls(o.name)] += o.seconds * 1e3;
  std::map<std::string, double> meas;
  if (prof) {
    meas["gemm"] = prof->gemm, meas["attention"] = prof->attention, meas["cca"] = prof->cca;
    meas["norms"] = prof->norms, meas["loss"] = prof->loss;
    meas["dispatch+other"] = prof->moe_dispatch + prof->other;
  }
  pred["optimizer"] = cal.optimizer_s * 1e3;
  pred_r["optimizer"] = roof.optimizer_s * 1e3;
  meas["optimizer"] = optimizer_ms;
  fmt::print(
      "\n# cost model ({}) against this step, ms: class, roofline, calibrated, measured, "
      "measured/calibrated\n",
      hw_name);
  nlohmann::json rows = nlohmann::json::array();
  for (const char* c :
       {"gemm", "attention", "cca", "norms", "dispatch+other", "loss", "optimizer"}) {
    const double r = pred_r[c], p = pred[c], m = meas.count(c) ? meas[c] : 0.0;
    fmt::print("  {:<16} {:9.2f} {:10.2f} {:9.2f} {:7.2f}\n", c, r, p, m,
               p > 0 && m > 0 ? m / p : 0.0);
    rows.push_back({{"class", c}, {"roofline_ms", r}, {"model_ms", p}, {"measured_ms", m}});
  }
  const double model_step = cal.step_s * 1e3, roof_step = roof.step_s * 1e3;
  fmt::print("  {:<16} {:9.2f} {:10.2f} {:9.2f} {:7.2f}\n", "step", roof_step, model_step, step_ms,
             model_step > 0 ? step_ms / model_step : 0.0);
  fmt::print(
      "# calibrated: {}; the gap that remains is what no kernel benchmark sees (launch gaps "
      "between kernels, host synchronisation for the expert counts, profiling events)\n",
      hw.kernels.empty() ? "no kernel efficiencies in this profile (= roofline)"
                         : "kernel efficiencies of the profile (docs/SIZING.md)");
  nlohmann::json eff = nlohmann::json::array();
  for (const auto& k : hw.kernels) {
    nlohmann::json r = sizing::kernel_measurement_json(k);
    r["fraction"] = hw.kernel_fraction(k.cls, k.work);
    eff.push_back(r);
  }
  return {{"hardware", hw_name},         {"classes", rows},
          {"model_step_ms", model_step}, {"roofline_step_ms", roof_step},
          {"measured_step_ms", step_ms}, {"kernel_efficiency", eff}};
}

}  // namespace

int run_train_bench(const TrainBenchOptions& a_in) {
  TrainBenchOptions a = a_in;
  // The data-parallel path: communicators first (every rank), so the device follows the rank.
  std::unique_ptr<Communicator> host_comm, nccl_comm;
  int rank = 0, world = 1;
  if (!a.dp.empty()) {
    ZAYA_CHECK(communicator_available("mpi"),
               "zaya bench train --dp: this zaya was built without MPI (the host communicator)");
    ZAYA_CHECK(a.dp == "mpi" || communicator_available("nccl"),
               "zaya bench train --dp nccl: this zaya was built without NCCL");
    const LaunchInfo li = detect_launch();
    host_comm = make_world_communicator("mpi");
    rank = host_comm->rank();
    world = host_comm->size();
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    ZAYA_CHECK(n > 0, "zaya bench train: rank {} on {} sees no CUDA device", rank,
               local_host_name());
    if (li.launched() && world > 1) {
      // GPU = local rank; over MPI several ranks may share one GPU (local rank modulo the GPUs).
      ZAYA_CHECK(a.dp == "mpi" || li.local_rank < n,
                 "zaya bench train --dp nccl: local rank {} has no GPU of its own ({} visible; "
                 "--dp mpi lets ranks share one)",
                 li.local_rank, n);
      a.device = li.local_rank % n;
    }
    ZAYA_CUDA_CHECK(cudaSetDevice(a.device));
    if (a.dp == "nccl") nccl_comm = make_world_communicator("nccl");
    ZAYA_CHECK(world % a.cp == 0, "zaya bench train --cp {}: does not divide the {} ranks", a.cp,
               world);
  }
  if (a.cp > 1) a.no_profile = true;  // the profiled step runs whole sequences on one rank
  ZayaConfig cfg = ZayaConfig::preset(a.preset).with_layers(a.layers);
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, a.seq);
  cfg.validate("bench train config");
  const int64_t tokens = a.batch * a.seq;
  const double flops_per_token = sizing::train_flops_per_token(cfg, a.seq);

  int ndev = 0;
  const cudaError_t derr = cudaGetDeviceCount(&ndev);
  ZAYA_CHECK(derr == cudaSuccess && ndev > a.device, "zaya bench train: no CUDA device {} ({})",
             a.device,
             derr == cudaSuccess ? std::to_string(ndev) + " found" : cudaGetErrorString(derr));
  ZAYA_CUDA_CHECK(cudaSetDevice(a.device));
  cudaDeviceProp prop{};
  ZAYA_CUDA_CHECK(cudaGetDeviceProperties(&prop, a.device));
  fmt::print("# zaya bench train: {} on {} ({} SMs)\n", a.preset, prop.name,
             prop.multiProcessorCount);
  if (!a.dp.empty())
    fmt::print(
        "# data parallel: {} rank(s) over {} (ZeRO-1, buckets of {} fp32 elements per rank); "
        "each rank runs batch {}, rank 0 prints its own times\n",
        world, a.dp, a.bucket_elems, a.batch);
  fmt::print(
      "# {} layers, batch {} x seq {} = {} tokens/step; {:.2f}M params ({:.2f}M active); "
      "{:.3f} GFLOP/token (model FLOPs)\n",
      a.layers, a.batch, a.seq, tokens, double(cfg.params_total(true)) / 1e6,
      double(cfg.params_active(true)) / 1e6, flops_per_token / 1e9);

  double t0 = now_s();
  ZayaModel host = bench::random_model(cfg, a.seed);
  const double init_s = now_s() - t0;

  // Random tokens (uniform over the vocabulary; targets are the next token, last one ignored).
  std::vector<int32_t> ids(static_cast<size_t>(tokens)), tgt(static_cast<size_t>(tokens));
  Rng rng(a.seed + 1 + uint64_t(rank / a.cp));  // each sequence group its own tokens
  for (auto& x : ids) x = int32_t(rng.next_u32() % uint32_t(cfg.vocab_size));
  for (int64_t b = 0; b < a.batch; b++)
    for (int64_t t = 0; t < a.seq; t++)
      tgt[size_t(b * a.seq + t)] = t + 1 < a.seq ? ids[size_t(b * a.seq + t + 1)] : -1;

  cuda::CudaModelOptions mo;
  mo.max_tokens = tokens;
  mo.max_seq = a.seq;
  mo.recompute = a.recompute;
  mo.device = a.device;
  cuda::CudaOptimizerOptions oo;
  oo.ns_bf16 = a.ns_precision == "bf16";

  struct StepTimes {
    double fwd_bwd = 0, norm = 0, optim = 0, total = 0;
    DataParallelTimes dp;
  };
  std::vector<StepTimes> times;
  std::vector<double> losses, gnorms;
  cuda::OptimizerStepTimes opt_times;
  size_t in_use = 0, arena = 0, opt_bytes = 0;
  OptimizerSettings os;
  if (a.optimizer == "adamw") {  // the peer's optimizer: every parameter on AdamW
    os.default_rules = false;
    os.rules = {ParamRule{"*", OptimizerKind::AdamW, 1.0, std::nullopt}};
  }
  // Prints one step's line and keeps the timed ones.
  auto record = [&](int64_t i, const StepStats& ss, double gnorm, const StepTimes& st) {
    if (i >= a.warmup) {
      times.push_back(st);
      losses.push_back(ss.loss);
      gnorms.push_back(gnorm);
    }
    fmt::print(
        "{} {:>3}: loss {:.4f}  gnorm {:.3f}  fwd+bwd {:8.2f} ms  norm {:6.2f} ms  "
        "optimizer {:8.2f} ms  step {:8.2f} ms",
        i < a.warmup ? "warmup" : "step  ", i < a.warmup ? i : i - a.warmup, ss.loss, gnorm,
        st.fwd_bwd, st.norm, st.optim, st.total);
    if (!a.dp.empty())
      fmt::print(
          "  [reduce-scatter {:.2f}, update {:.2f}, all-gather {:.2f} (+{:.2f} waited in the "
          "forward) ms; {} bucket(s) started in the backward]",
          st.dp.reduce_scatter, st.dp.update, st.dp.all_gather, st.dp.all_gather_wait,
          st.dp.buckets_in_backward);
    fmt::print("\n");
  };
  DataParallelMemory dp_mem;
  int64_t dp_owned = 0;
  t0 = now_s();
  if (a.dp.empty()) {
    cuda::CudaModel cm(host, mo);
    cuda::CudaOptimizer opt(cm.params(), os, cm.gemm(), cm.stream(), oo);
    const double setup_s = now_s() - t0;
    fmt::print("# host init {:.1f} s, device setup (upload, arena, optimizer state) {:.1f} s\n",
               init_s, setup_s);
    for (int64_t i = 0; i < a.warmup + a.steps; i++) {
      StepTimes st;
      const double s0 = now_s();
      cm.zero_grads();
      StepStats ss = cm.forward_backward(ids.data(), tgt.data(), a.batch, a.seq, 1.0f);
      const double s1 = now_s();
      const double gnorm = std::sqrt(opt.grad_sq_norm());
      const double s2 = now_s();
      opt.step(a.lr, gnorm > 1.0 ? float(1.0 / (gnorm + 1e-6)) : 1.0f);
      const double s3 = now_s();
      st.fwd_bwd = (s1 - s0) * 1e3, st.norm = (s2 - s1) * 1e3, st.optim = (s3 - s2) * 1e3;
      st.total = (s3 - s0) * 1e3;
      record(i, ss, gnorm, st);
    }
    opt_times = opt.last_times();
    size_t free_b = 0, total_b = 0;
    ZAYA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    in_use = total_b - free_b;  // a step allocates nothing: after one step this is the peak
    arena = cm.arena_bytes();
    opt_bytes = opt.state_bytes();
  } else {
    // The same step through TrainStep and DataParallelStep: loss scale 1/world (the caller
    // averages over the global batch), the global norm and the update as the trainer does them.
    TrainStepOptions so;
    so.device = "cuda";
    so.device_index = a.device;
    so.max_tokens = tokens / a.cp;  // this rank's chunks of the sequences
    so.max_seq = a.seq;
    so.recompute = a.recompute;
    so.ns_bf16 = oo.ns_bf16;
    Communicator& gc = nccl_comm ? *nccl_comm : *host_comm;
    auto step = make_data_parallel_step(host, os, BalancingSettings{}, so, gc, *host_comm,
                                        a.bucket_elems, !a.no_overlap);
    std::unique_ptr<Communicator> cp_comm;
    if (a.cp > 1) {
      cp_comm = gc.split(rank / int(a.cp), rank);
      step->set_context_parallel(cp_comm.get());
      fmt::print("# context parallel: {} group(s) of {} ranks, {} tokens per rank and step\n",
                 world / a.cp, a.cp, tokens / a.cp);
    }
    const double setup_s = now_s() - t0;
    fmt::print("# host init {:.1f} s, device setup (upload, arena, optimizer state) {:.1f} s\n",
               init_s, setup_s);
    fmt::print("# ownership:\n{}", step->plan().describe(step->items()));
    const int64_t groups = world / a.cp;
    const float scale = 1.0f / float(groups);  // each group's gradient is of its mean
    for (int64_t i = 0; i < a.warmup + a.steps; i++) {
      StepTimes st;
      const double s0 = now_s();
      step->zero_grads();
      step->begin_accumulation(1);
      StepStats ss = step->forward_backward(ids.data(), tgt.data(), a.batch, a.seq, scale);
      ZAYA_CUDA_CHECK(cudaDeviceSynchronize());  // the plain path's forward_backward ends synced
      const double s1 = now_s();
      const double gnorm = std::sqrt(step->grad_sq_norm());
      const double s2 = now_s();
      step->optimizer_step(a.lr, gnorm > 1.0 ? float(1.0 / (gnorm + 1e-6)) : 1.0f);
      const double s3 = now_s();
      // The global mean (equal batches per group; a group's ranks hold shares of its mean).
      double loss = ss.loss;
      host_comm->host_all_reduce(&loss, 1, RedOp::Sum);
      ss.loss = loss / double(groups);
      st.fwd_bwd = (s1 - s0) * 1e3, st.norm = (s2 - s1) * 1e3, st.optim = (s3 - s2) * 1e3;
      st.total = (s3 - s0) * 1e3;
      st.dp = step->last_times();
      record(i, ss, gnorm, st);
    }
    size_t free_b = 0, total_b = 0;
    ZAYA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    in_use = total_b - free_b;
    dp_mem = step->memory();
    opt_bytes = size_t(dp_mem.optimizer_state);
    for (bool b : step->plan().mask(rank)) dp_owned += b;
  }

  // One profiled step (op-class timing adds synchronisation, so it is kept out of the timed ones).
  cuda::OpClassTimes prof;
  bool have_prof = false;
  if (!a.no_profile) {
    mo.profile = true;
    cuda::CudaModel cm(host, mo);
    for (int i = 0; i < 2; i++) {  // the first warms up cuBLASLt's algorithm cache
      cm.zero_grads();
      cm.forward_backward(ids.data(), tgt.data(), a.batch, a.seq, 1.0f);
    }
    prof = cm.last_profile();
    have_prof = true;
  }

  auto col = [&](double StepTimes::*f) {
    std::vector<double> v;
    for (const auto& t : times) v.push_back(t.*f);
    return v;
  };
  const double step_ms = median(col(&StepTimes::total));
  const double fb_ms = median(col(&StepTimes::fwd_bwd)), norm_ms = median(col(&StepTimes::norm)),
               opt_ms = median(col(&StepTimes::optim));
  auto dp_col = [&](double DataParallelTimes::*f) {
    std::vector<double> v;
    for (const auto& t : times) v.push_back(t.dp.*f);
    return median(v);
  };
  const double rs_ms = dp_col(&DataParallelTimes::reduce_scatter),
               upd_ms = dp_col(&DataParallelTimes::update),
               ag_ms = dp_col(&DataParallelTimes::all_gather) +
                       dp_col(&DataParallelTimes::all_gather_wait);
  const double tps = double(tokens / a.cp) / (step_ms * 1e-3);  // this rank's tokens
  const double tflops = tps * flops_per_token / 1e12;
  const double fb_tflops = double(tokens / a.cp) * flops_per_token / (fb_ms * 1e-3) / 1e12;
  fmt::print(
      "\n# median of {} steps: step {:.2f} ms = fwd+bwd {:.2f} + grad norm {:.2f} + optimizer "
      "{:.2f} ms\n",
      times.size(), step_ms, fb_ms, norm_ms, opt_ms);
  if (!a.dp.empty())
    fmt::print(
        "# data parallel ({} x {}): reduce-scatter {:.2f} + update {:.2f} + all-gather {:.2f} ms "
        "(host time, overlapped parts included); the machinery (reduce-scatter + all-gather) is "
        "{:.2f} ms = {:.2f}% of the step\n",
        world, a.dp, rs_ms, upd_ms, ag_ms, rs_ms + ag_ms, 100.0 * (rs_ms + ag_ms) / step_ms);
  fmt::print("tokens/s            {:>12.0f}{}\n", tps, a.dp.empty() ? "" : "   (this rank)");
  fmt::print("model TFLOP/s       {:>12.1f}   ({:.1f}% of {:.0f} TFLOP/s bf16 GEMM peak)\n", tflops,
             100.0 * tflops / a.peak_tflops, a.peak_tflops);
  fmt::print("fwd+bwd TFLOP/s     {:>12.1f}   ({:.1f}% of peak; optimizer excluded)\n", fb_tflops,
             100.0 * fb_tflops / a.peak_tflops);
  if (a.dp.empty()) {
    fmt::print("optimizer (last)    adamw {:.2f} ms, newton-schulz {:.2f} ms, rest {:.2f} ms\n",
               opt_times.adamw, opt_times.newton_schulz, opt_times.muon_elementwise);
    fmt::print("device memory       {:.2f} GiB in use (arena {:.2f} GiB, optimizer {:.2f} GiB)\n",
               double(in_use) / double(1 << 30), double(arena) / double(1 << 30),
               double(opt_bytes) / double(1 << 30));
  } else {
    fmt::print(
        "device memory       {:.2f} GiB in use on this GPU; rank 0 owns {} tensors: optimizer "
        "state {:.2f} GiB, bucket padding {:.2f} GiB (masters and gradients each), host staging "
        "{:.2f} GiB\n",
        double(in_use) / double(1 << 30), dp_owned,
        double(dp_mem.optimizer_state) / double(1 << 30), double(dp_mem.padding) / double(1 << 30),
        double(dp_mem.staging) / double(1 << 30));
  }
  if (have_prof) {
    const double sum = prof.gemm + prof.attention + prof.moe_dispatch + prof.norms + prof.loss +
                       prof.cca + prof.other;
    fmt::print("profiled fwd+bwd    {:.2f} ms by op class:\n", sum);
    for (auto [name, ms] : {std::pair{"gemm", prof.gemm},
                            {"attention", prof.attention},
                            {"moe_dispatch", prof.moe_dispatch},
                            {"norms", prof.norms},
                            {"loss", prof.loss},
                            {"cca conv/norm/rope", prof.cca},
                            {"other", prof.other}})
      fmt::print("  {:<14} {:9.2f} ms  {:5.1f}%\n", name, ms, sum > 0 ? 100.0 * ms / sum : 0.0);
  }

  nlohmann::json cost = nullptr;
  {
    std::string hw = a.hardware.empty() ? sizing::match_builtin_device(prop.name) : a.hardware;
    if (!hw.empty()) {
      try {
        cost = cost_model_check(cfg, a, hw, have_prof ? &prof : nullptr, opt_ms + norm_ms, step_ms);
      } catch (const std::exception& e) {
        fmt::print("# cost model: not compared ({})\n", e.what());
      }
    }
  }

  if (!a.json.empty()) {
    nlohmann::json j = {{"kind", "zaya.bench.train/1"},
                        {"impl", "zaya"},
                        {"device", prop.name},
                        {"preset", a.preset},
                        {"optimizer", a.optimizer},
                        {"layers", a.layers},
                        {"batch", a.batch},
                        {"seq", a.seq},
                        {"tokens_per_step", tokens},
                        {"steps", a.steps},
                        {"warmup", a.warmup},
                        {"recompute", a.recompute},
                        {"ns_precision", a.ns_precision},
                        {"params_total", cfg.params_total(true)},
                        {"params_active", cfg.params_active(true)},
                        {"flops_per_token", flops_per_token},
                        {"step_ms_median", step_ms},
                        {"fwd_bwd_ms_median", fb_ms},
                        {"grad_norm_ms_median", norm_ms},
                        {"optimizer_ms_median", opt_ms},
                        {"tokens_per_s", tps},
                        {"model_tflops", tflops},
                        {"fwd_bwd_tflops", fb_tflops},
                        {"peak_tflops", a.peak_tflops},
                        {"fraction_of_peak", tflops / a.peak_tflops},
                        {"optimizer_last",
                         {{"adamw_ms", opt_times.adamw},
                          {"newton_schulz_ms", opt_times.newton_schulz},
                          {"rest_ms", opt_times.muon_elementwise},
                          {"total_ms", opt_times.total}}},
                        {"device_bytes_in_use", in_use},
                        {"arena_bytes", arena},
                        {"optimizer_bytes", opt_bytes},
                        {"losses", losses},
                        {"grad_norms", gnorms}};
    if (!a.dp.empty())
      j["data_parallel"] = {{"backend", a.dp},
                            {"ranks", world},
                            {"cp", a.cp},
                            {"bucket_elems", a.bucket_elems},
                            {"overlap", !a.no_overlap},
                            {"reduce_scatter_ms_median", rs_ms},
                            {"update_ms_median", upd_ms},
                            {"all_gather_ms_median", ag_ms},
                            {"overhead_fraction", (rs_ms + ag_ms) / step_ms},
                            {"optimizer_state_bytes", dp_mem.optimizer_state},
                            {"padding_bytes", dp_mem.padding}};
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& t : times)
      steps.push_back({{"fwd_bwd_ms", t.fwd_bwd},
                       {"norm_ms", t.norm},
                       {"optim_ms", t.optim},
                       {"ms", t.total},
                       {"reduce_scatter_ms", t.dp.reduce_scatter},
                       {"update_ms", t.dp.update},
                       {"all_gather_ms", t.dp.all_gather},
                       {"all_gather_wait_ms", t.dp.all_gather_wait}});
    j["step_times"] = steps;
    if (have_prof) j["profile_ms"] = profile_json(prof);
    if (!cost.is_null()) j["cost_model"] = cost;
    write_text_file_atomic(a.json, j.dump(1) + "\n");
    fmt::print("# wrote {}\n", a.json);
  }
  return 0;
}

}  // namespace zaya::bench
