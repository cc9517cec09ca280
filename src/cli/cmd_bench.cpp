// `zaya bench comm|gemm|mem|profile|kernels`: cluster characterization (ZAYA1.md §5). This file
// only parses flags and writes reports; the measurements live in src/bench/. gemm and mem need the
// CUDA build, comm needs MPI (and NCCL for --backend nccl); each says so when it is missing.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "bench/comm_bench.h"
#include "bench/gemm_bench.h"
#include "bench/kernel_bench.h"
#include "bench/mem_bench.h"
#include "bench/profile.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/plot.h"
#include "dist/comm.h"
#include "model/config.h"
#include "sizing/hardware.h"

using namespace zaya;
using namespace zaya::bench;

namespace zaya::cli {
int bench_train_cli(int argc, char** argv);  // cmd_bench_train.cpp
int bench_infer_cli(int argc, char** argv);  // cmd_bench_infer.cpp
int bench_ckpt_cli(int argc, char** argv);   // cmd_bench_ckpt.cpp
}  // namespace zaya::cli

namespace {

struct Outputs {
  std::string json, csv, svg, profile;
  void add(CLI::App& app) {
    app.add_option("--json", json, "write results as JSON to this file");
    app.add_option("--csv", csv, "write results as CSV to this file");
    app.add_option("--svg", svg, "write a plot of the results (SVG) to this file");
    app.add_option("--profile", profile, "merge results into this zaya.hardware/1 profile JSON");
  }
  void check() const {
    check_output_path("--json", json);
    check_output_path("--csv", csv);
    check_output_path("--svg", svg);
    check_output_path("--profile", profile);
  }
};

// Parses argv with CLI11; returns false (after printing help) for --help.
bool parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  }
  return true;
}

int bench_comm(int argc, char** argv) {
  CLI::App app{
      "zaya bench comm: collective bandwidth (nccl-tests definitions); launch with mpirun, "
      "one rank per GPU",
      "zaya bench comm"};
  std::string backend = "mpi", minb = "8", maxb = "128M", stepb = "0", ops = "all",
              dtypes = "float", redops = "sum", inplace = "out";
  double factor = 2;
  int iters = 20, warmup = 5;
  bool sweep = false, nocheck = false;
  Outputs out;
  app.add_option("--backend", backend, "mpi or nccl")->capture_default_str();
  app.add_option("-b,--minbytes", minb, "smallest size (8, 1K, 128M, ...)")->capture_default_str();
  app.add_option("-e,--maxbytes", maxb, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "size multiplier between steps")->capture_default_str();
  app.add_option("-i,--stepbytes", stepb, "additive size step (overrides -f when non-zero)");
  app.add_option("--ops", ops,
                 "comma-separated: all_reduce,reduce_scatter,all_gather,broadcast,all_to_all,"
                 "sendrecv or all")
      ->capture_default_str();
  app.add_option("-d,--dtype", dtypes, "comma-separated: float,bfloat16,half,double,int32,...")
      ->capture_default_str();
  app.add_option("-o,--redop", redops, "comma-separated: sum,prod,max,min")->capture_default_str();
  app.add_option("-n,--iters", iters, "timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup", warmup, "untimed iterations per size")->capture_default_str();
  app.add_option("--inplace", inplace, "out, in or both")->capture_default_str();
  app.add_flag("--sweep-ranks", sweep, "also run on sub-communicators of 2, 4, ... ranks");
  app.add_flag("--no-check", nocheck, "skip the correctness check");
  out.add(app);
  if (!parse(app, argc, argv)) return 0;

  // Validate everything before any rank starts communicating.
  CommBenchOptions opt;
  opt.ops = parse_comm_ops(ops);
  opt.sizes = size_sweep(parse_size(minb, "-b/--minbytes"), parse_size(maxb, "-e/--maxbytes"),
                         factor, parse_size(stepb, "-i/--stepbytes"));
  for (const auto& d : split_list(dtypes)) opt.dtypes.push_back(parse_bench_dtype(d, "--dtype"));
  ZAYA_CHECK(!opt.dtypes.empty(), "--dtype: no dtype given");
  opt.redops.clear();
  for (const auto& r : split_list(redops)) opt.redops.push_back(redop_from_name(r, "--redop"));
  ZAYA_CHECK(!opt.redops.empty(), "--redop: no reduction given");
  ZAYA_CHECK(inplace == "out" || inplace == "in" || inplace == "both",
             "--inplace: expected out, in or both, got '{}'", inplace);
  opt.out_of_place = inplace != "in";
  opt.in_place = inplace != "out";
  ZAYA_CHECK(iters > 0, "--iters must be positive (got {})", iters);
  ZAYA_CHECK(warmup >= 0, "--warmup must not be negative (got {})", warmup);
  opt.iters = iters;
  opt.warmup = warmup;
  opt.sweep_ranks = sweep;
  opt.check = !nocheck;
  ZAYA_CHECK(backend == "mpi" || backend == "nccl", "--backend: expected mpi or nccl, got '{}'",
             backend);
  ZAYA_CHECK(communicator_available(backend),
             "--backend {}: this build of zaya has no {} support (rebuild with {})", backend,
             backend == "mpi" ? "MPI" : "NCCL", backend == "mpi" ? "MPI" : "CUDA, NCCL and MPI");
  out.check();

  auto world = make_world_communicator(backend);
  const auto rows = run_comm_bench(*world, opt, world->rank() == 0);
  const auto hosts = world->host_all_gather(world->host_name());
  if (world->rank() != 0) return 0;

  int64_t wrong = 0;
  for (const auto& r : rows) wrong += std::max<int64_t>(0, r.wrong);
  if (!out.json.empty())
    write_text_file_atomic(out.json, comm_rows_json(rows, backend, world->size(), hosts));
  if (!out.csv.empty()) write_text_file_atomic(out.csv, comm_rows_csv(rows));
  if (!out.svg.empty()) write_text_file_atomic(out.svg, comm_rows_svg(rows));
  if (!out.profile.empty()) {
    merge_profile_file(out.profile, profile_from_comm(rows));
  }
  fmt::print("# {} rows, {} wrong element(s)\n", rows.size(), wrong);
  if (wrong > 0) {
    std::fprintf(stderr, "zaya bench comm: error: %lld wrong element(s) in the results\n",
                 static_cast<long long>(wrong));
    return 1;
  }
  return 0;
}

// ---- gemm ----

struct GemmCli {
  std::string dtypes = "bf16", ms, ns, ks, model, waves, algos_from, cuda_graph;
  std::vector<std::string> shapes;
  int64_t tokens = 8192, knee_max = 16384, wave_k = 4096;
  bool knee = false, list = false, nocheck = false, nogrouped = false, cublas = false;
  double peak_bf16 = 0, peak_fp8 = 0, min_time_ms = 25, warm_ms = 20;
  int iters = 20, max_iters = 200, warmup = 5, autotune = 32, search_algos = 4, device = 0;
  int64_t workspace_mib = 32;

  void add(CLI::App& app) {
    app.add_option("--dtype", dtypes, "comma-separated: bf16, fp8 (e4m3; sm_89+)")
        ->capture_default_str();
    app.add_option("--m", ms, "m range: 4096 | 1024,2048 | 256:8192:x2 | 1024:4096:+256");
    app.add_option("--n", ns, "n range (as --m)");
    app.add_option("--k", ks, "k range (as --m)");
    app.add_option("--shape", shapes,
                   "explicit shapes MxNxK or MxNxKxGROUPS, optionally NAME=..., comma-separated "
                   "or repeated (e.g. the rows a comparison left below target)")
        ->delimiter(',');
    app.add_option("--model", model,
                   "a ZAYA preset or config.json: its forward+backward GEMMs, experts grouped");
    app.add_option("--tokens", tokens, "tokens per micro-batch for --model")->capture_default_str();
    app.add_flag("--knee", knee, "square sweep 256..--knee-max for the knee (80%/90% of peak)");
    app.add_option("--knee-max", knee_max, "largest square dimension")->capture_default_str();
    app.add_option("--waves", waves,
                   "wave-quantization sweep of m=n, LO:HI:+STEP (e.g. 1024:8192:+128)");
    app.add_option("--wave-k", wave_k, "k of the wave sweep")->capture_default_str();
    app.add_option("--peak-bf16", peak_bf16,
                   "bf16 peak TFLOP/s (default: device spec, else measured)");
    app.add_option("--peak-fp8", peak_fp8,
                   "fp8 peak TFLOP/s (default: device spec, else measured)");
    app.add_option("-n,--iters", iters, "timed iterations, at least")->capture_default_str();
    app.add_option("--max-iters", max_iters, "timed iterations, at most")->capture_default_str();
    app.add_option("--min-time-ms", min_time_ms, "timed iterations cover at least this GPU time")
        ->capture_default_str();
    app.add_option("-w,--warmup", warmup, "untimed iterations before the estimate")
        ->capture_default_str();
    app.add_option("--warm-ms", warm_ms, "then untimed iterations for this much GPU time")
        ->capture_default_str();
    app.add_option("--autotune", autotune, "cuBLASLt heuristic candidates timed per shape")
        ->capture_default_str();
    app.add_option("--search-algos", search_algos,
                   "also time, per cuBLASLt algorithm id, its N best configurations (0: only "
                   "the heuristic's --autotune list)")
        ->capture_default_str()
        ->check(CLI::Range(0, 64));
    app.add_option("--algos-from", algos_from,
                   "time the algorithms an earlier --json run kept instead of autotuning "
                   "(shapes it lacks are autotuned)");
    app.add_option("--cuda-graph", cuda_graph,
                   "comma-separated dtypes (bf16, fp8) whose cuBLASLt rows are timed as CUDA "
                   "graph replays, one graph per operand set (as tools/bench_peer.py times "
                   "torch._scaled_mm)");
    app.add_option("--workspace-mib", workspace_mib, "cuBLASLt/cuBLAS workspace (MiB)")
        ->capture_default_str();
    app.add_option("--device", device, "CUDA device")->capture_default_str();
    app.add_flag("--cublas", cublas,
                 "bf16: also time cuBLAS's default GEMM (what torch.matmul/bmm call)");
    app.add_flag("--no-check", nocheck, "skip the sampled CPU reference check");
    app.add_flag("--no-grouped", nogrouped, "expert GEMMs: only the batched cuBLASLt call");
    app.add_flag("--list", list, "print the shapes and exit (no GPU needed)");
  }

  GemmBenchOptions options() const {
    GemmBenchOptions o;
    o.dtypes = split_list(dtypes);
    ZAYA_CHECK(!o.dtypes.empty(), "--dtype: no dtype given");
    for (const auto& d : o.dtypes)
      ZAYA_CHECK(d == "bf16" || d == "fp8", "--dtype: expected bf16 or fp8, got '{}'", d);
    const int given = int(!ms.empty()) + int(!ns.empty()) + int(!ks.empty());
    ZAYA_CHECK(given == 0 || given == 3, "--m, --n and --k go together (got {} of them)", given);
    if (given == 3)
      o.shapes = cartesian_shapes(parse_dim_range(ms, "--m"), parse_dim_range(ns, "--n"),
                                  parse_dim_range(ks, "--k"));
    for (const auto& sh : shapes) o.shapes.push_back(parse_gemm_shape(sh, "--shape"));
    if (!model.empty()) {
      ZayaConfig cfg;
      const auto names = ZayaConfig::preset_names();
      if (std::find(names.begin(), names.end(), model) != names.end())
        cfg = ZayaConfig::preset(model);
      else
        cfg = ZayaConfig::load(model);
      for (auto& s : model_gemm_shapes(cfg, tokens)) o.shapes.push_back(s);
    }
    ZAYA_CHECK(knee_max >= 256, "--knee-max must be at least 256 (got {})", knee_max);
    if (knee || (o.shapes.empty() && waves.empty()))
      for (auto& s : knee_shapes(knee_max)) o.shapes.push_back(s);
    if (!waves.empty()) {
      const auto v = split_list(waves, ':');
      ZAYA_CHECK(v.size() == 3 && v[2].size() > 1 && v[2][0] == '+',
                 "--waves: expected LO:HI:+STEP (e.g. 1024:8192:+128), got '{}'", waves);
      for (auto& s :
           wave_shapes(int64_t(parse_size(v[0], "--waves")), int64_t(parse_size(v[1], "--waves")),
                       int64_t(parse_size(v[2].substr(1), "--waves")), wave_k))
        o.shapes.push_back(s);
    }
    ZAYA_CHECK(iters > 0, "--iters must be positive (got {})", iters);
    ZAYA_CHECK(max_iters >= iters, "--max-iters ({}) must be at least --iters ({})", max_iters,
               iters);
    ZAYA_CHECK(warmup >= 0, "--warmup must not be negative (got {})", warmup);
    ZAYA_CHECK(min_time_ms >= 0 && warm_ms >= 0, "--min-time-ms/--warm-ms must not be negative");
    ZAYA_CHECK(autotune >= 1, "--autotune must be at least 1 (got {})", autotune);
    ZAYA_CHECK(workspace_mib >= 0 && workspace_mib <= 4096,
               "--workspace-mib must be in 0..4096 (got {})", workspace_mib);
    ZAYA_CHECK(peak_bf16 >= 0 && peak_fp8 >= 0, "--peak-bf16/--peak-fp8 must not be negative");
    o.timing.min_iters = iters;
    o.timing.max_iters = max_iters;
    o.timing.min_time_ms = min_time_ms;
    o.timing.warmup = warmup;
    o.timing.warm_ms = warm_ms;
    o.autotune = autotune;
    o.search_per_algo = search_algos;
    if (!algos_from.empty()) o.fixed_algos = load_gemm_algos(algos_from);
    if (!cuda_graph.empty()) {
      o.graph_dtypes = split_list(cuda_graph);
      for (const auto& d : o.graph_dtypes)
        ZAYA_CHECK(d == "bf16" || d == "fp8", "--cuda-graph: expected bf16 or fp8, got '{}'", d);
    }
    o.workspace_bytes = size_t(workspace_mib) << 20;
    o.cublas_rows = cublas;
    o.check = !nocheck;
    o.grouped_methods = !nogrouped;
    o.device = device;
    return o;
  }
};

void print_shapes(const std::vector<GemmShape>& shapes) {
  fmt::print("{:<24} {:>7} {:>7} {:>7} {:>6} {:>6} {:>10}\n", "#name", "m", "n", "k", "groups",
             "count", "GFLOP");
  double step = 0;
  for (const auto& s : shapes) {
    fmt::print("{:<24} {:>7} {:>7} {:>7} {:>6} {:>6} {:>10.3f}\n", s.name, s.m, s.n, s.k, s.groups,
               s.count, s.gflop());
    step += s.gflop() * double(s.count);
  }
  fmt::print("# {} shapes, {:.1f} GFLOP per training step (counts applied)\n", shapes.size(), step);
}

// Fills fractions and returns the peaks used (given > device spec > best measured).
std::pair<double, double> apply_peaks(std::vector<GemmResult>& rs, const DeviceInfo& dev,
                                      double given_bf16, double given_fp8) {
  double best_bf16 = 0, best_fp8 = 0;
  for (const auto& r : rs)
    (r.dtype == "fp8" ? best_fp8 : best_bf16) =
        std::max(r.dtype == "fp8" ? best_fp8 : best_bf16, r.tflops);
  const double pb = given_bf16 > 0             ? given_bf16
                    : dev.peak_bf16_tflops > 0 ? dev.peak_bf16_tflops
                                               : best_bf16;
  const double pf = given_fp8 > 0             ? given_fp8
                    : dev.peak_fp8_tflops > 0 ? dev.peak_fp8_tflops
                                              : best_fp8;
  for (auto& r : rs) {
    const double p = r.dtype == "fp8" ? pf : pb;
    r.fraction = p > 0 ? r.tflops / p : 0;
  }
  return {pb, pf};
}

std::string gemm_svg(const std::vector<GemmResult>& rs, const std::string& device, bool by_size) {
  PlotSpec p;
  p.title = fmt::format("bench gemm: throughput vs {} ({})", by_size ? "size" : "work", device);
  p.xlabel = by_size ? "m = n (k fixed for waves, = m for squares)" : "work (GFLOP)";
  p.ylabel = "TFLOP/s";
  p.logx = true;
  for (const auto& r : rs) {
    if (by_size && r.shape.name != "square" && r.shape.name != "wave") continue;
    const bool sweep =
        r.shape.name == "square" || r.shape.name == "wave" || r.shape.name == "sweep";
    const std::string label =
        fmt::format("{} {}{}", r.dtype, sweep ? r.shape.name : std::string("model"),
                    r.method == "lt" || r.method == "lt-batched" ? "" : " " + r.method);
    auto it = std::find_if(p.series.begin(), p.series.end(),
                           [&](const PlotSeries& s) { return s.label == label; });
    if (it == p.series.end()) {
      p.series.push_back({label, {}, {}, sweep});
      it = p.series.end() - 1;
    }
    it->x.push_back(by_size ? double(r.shape.m) : r.shape.gflop());
    it->y.push_back(r.tflops);
  }
  if (by_size) p.logx = false;
  return render_svg(p);
}

int bench_gemm_cli(int argc, char** argv) {
  CLI::App app{"zaya bench gemm: cuBLASLt GEMM throughput (bf16, fp8)", "zaya bench gemm"};
  GemmCli g;
  Outputs out;
  g.add(app);
  out.add(app);
  if (!parse(app, argc, argv)) return 0;
  const GemmBenchOptions opt = g.options();
  if (g.list) {
    print_shapes(opt.shapes);
    return 0;
  }
  out.check();
  const DeviceInfo dev = query_device(opt.device);
  fmt::print("# zaya bench gemm: {} (sm_{}{}, {} SMs, L2 {} MiB), {} shapes\n", dev.name,
             dev.cc_major, dev.cc_minor, dev.sm_count, dev.l2_bytes >> 20, opt.shapes.size());
  auto rs = run_gemm_bench(opt);
  const auto [pb, pf] = apply_peaks(rs, dev, g.peak_bf16, g.peak_fp8);
  fmt::print("# peak TFLOP/s: bf16 {:.1f}, fp8 {:.1f} ({})\n{}\n", pb, pf,
             g.peak_bf16 > 0 ? "given" : dev.peak_source, gemm_table_header());
  int64_t wrong = 0;
  for (const auto& r : rs) {
    fmt::print("{}\n", gemm_table_row(r));
    wrong += r.wrong;
  }
  const auto prof = profile_from_gemm(rs, dev, pb, pf);
  fmt::print(
      "# knee (bf16): 80% of the measured peak ({:.1f} TFLOP/s) at {} GFLOP, 90% at {} GFLOP; "
      "of the spec peak ({:.1f}): {} / {} GFLOP\n",
      measured_peak_tflops(rs, "bf16"), prof["knee_gflop"]["p80"].dump(),
      prof["knee_gflop"]["p90"].dump(), pb, prof["knee_gflop_spec"]["p80"].dump(),
      prof["knee_gflop_spec"]["p90"].dump());
  if (!out.json.empty()) write_text_file_atomic(out.json, gemm_results_json(rs, dev, pb, pf, opt));
  if (!out.csv.empty()) write_text_file_atomic(out.csv, gemm_results_csv(rs));
  if (!out.svg.empty()) {
    write_text_file_atomic(out.svg, gemm_svg(rs, dev.name, false));
    std::string size_path = out.svg;
    const auto dot = size_path.rfind(".svg");
    size_path = (dot == std::string::npos ? size_path : size_path.substr(0, dot)) + ".size.svg";
    write_text_file_atomic(size_path, gemm_svg(rs, dev.name, true));
  }
  if (!out.profile.empty()) merge_profile_file(out.profile, prof);
  if (wrong > 0) {
    std::fprintf(stderr,
                 "zaya bench gemm: error: %lld sampled output(s) differ from the reference\n",
                 static_cast<long long>(wrong));
    return 1;
  }
  return 0;
}

// ---- mem ----

struct MemCli {
  std::string tests = "all", minb = "256K", maxb = "4G";
  double factor = 2, peak = 0;
  int iters = 20, warmup = 3, device = 0;
  void add(CLI::App& app) {
    app.add_option("--tests", tests,
                   "comma-separated: read,write,copy,triad,memcpy_d2d,h2d_pinned,d2h_pinned,"
                   "h2d_pageable,d2h_pageable or all")
        ->capture_default_str();
    app.add_option("-b,--minbytes", minb, "smallest buffer")->capture_default_str();
    app.add_option("-e,--maxbytes", maxb, "largest buffer")->capture_default_str();
    app.add_option("-f,--stepfactor", factor, "size multiplier")->capture_default_str();
    app.add_option("--peak-gbs", peak, "HBM peak GB/s (default: from the device's clocks)");
    app.add_option("-n,--iters", iters, "timed iterations")->capture_default_str();
    app.add_option("-w,--warmup", warmup, "untimed iterations")->capture_default_str();
    app.add_option("--device", device, "CUDA device")->capture_default_str();
  }
  MemBenchOptions options() const {
    MemBenchOptions o;
    o.tests = parse_mem_tests(tests);
    o.sizes =
        size_sweep(parse_size(minb, "-b/--minbytes"), parse_size(maxb, "-e/--maxbytes"), factor, 0);
    ZAYA_CHECK(iters > 0, "--iters must be positive (got {})", iters);
    ZAYA_CHECK(warmup >= 0, "--warmup must not be negative (got {})", warmup);
    ZAYA_CHECK(peak >= 0, "--peak-gbs must not be negative");
    o.iters = iters;
    o.warmup = warmup;
    o.device = device;
    return o;
  }
};

int bench_mem_cli(int argc, char** argv) {
  CLI::App app{"zaya bench mem: device memory and host<->device bandwidth", "zaya bench mem"};
  MemCli m;
  Outputs out;
  m.add(app);
  out.add(app);
  if (!parse(app, argc, argv)) return 0;
  const MemBenchOptions opt = m.options();
  out.check();
  const DeviceInfo dev = query_device(opt.device);
  const double peak = m.peak > 0 ? m.peak : dev.peak_hbm_gbs;
  fmt::print("# zaya bench mem: {} (L2 {} MiB, HBM {:.1f} GiB, peak {:.0f} GB/s{})\n{}\n", dev.name,
             dev.l2_bytes >> 20, double(dev.global_bytes) / double(1 << 30), peak,
             m.peak > 0 ? ", given" : "", mem_table_header());
  const auto rs = run_mem_bench(opt, peak);
  int64_t wrong = 0;
  for (const auto& r : rs) wrong += std::max<int64_t>(0, r.wrong);
  if (!out.json.empty()) write_text_file_atomic(out.json, mem_results_json(rs, dev, peak));
  if (!out.csv.empty()) write_text_file_atomic(out.csv, mem_results_csv(rs));
  if (!out.svg.empty()) write_text_file_atomic(out.svg, mem_results_svg(rs, dev.name));
  if (!out.profile.empty()) merge_profile_file(out.profile, profile_from_mem(rs, dev));
  if (wrong > 0) {
    std::fprintf(stderr, "zaya bench mem: error: %lld wrong word(s) after copies\n",
                 static_cast<long long>(wrong));
    return 1;
  }
  return 0;
}

// ---- kernels ----

int bench_kernels_cli(int argc, char** argv) {
  CLI::App app{
      "zaya bench kernels: the model's own CUDA kernels (attention, CCA, norms, SwiGLU and "
      "dispatch, loss, AdamW) at a config's training shapes, and the efficiencies the sizing "
      "cost model uses for them",
      "zaya bench kernels"};
  std::string preset, config, json;
  std::string profile;
  int64_t batch = 4, seq = 4096, opt_elems = int64_t(1) << 28;
  double peak = 0, copy = 0;
  int iters = 20, warmup = 5, device = 0;
  auto* p = app.add_option("--preset", preset, "model preset (default zaya1-base)");
  auto* c = app.add_option("--config", config, "model config.json (or a folder holding one)");
  p->excludes(c);
  c->excludes(p);
  app.add_option("--batch", batch, "sequences per micro-batch")->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence")->capture_default_str();
  app.add_option("--optimizer-elems", opt_elems, "parameters the AdamW update runs over")
      ->capture_default_str();
  app.add_option("--peak-tflops", peak,
                 "bf16 peak the attention fractions are taken of (default: the profile's, else "
                 "the built-in profile's, else the device's)");
  app.add_option("--copy-gbs", copy,
                 "copy bandwidth the memory-bound fractions are taken of (default as above)");
  app.add_option("-n,--iters", iters, "timed launches per kernel (at least)")
      ->capture_default_str();
  app.add_option("-w,--warmup", warmup, "untimed launches first")->capture_default_str();
  app.add_option("--device", device, "CUDA device")->capture_default_str();
  app.add_option("--json", json, "write the timings and efficiencies as JSON to this file");
  app.add_option("--profile", profile,
                 "merge the efficiencies into this zaya.hardware/1 profile (created if missing)");
  if (!parse(app, argc, argv)) return 0;
  ZAYA_CHECK(batch > 0 && seq > 1, "--batch must be positive and --seq above 1");
  ZAYA_CHECK(opt_elems > 0, "--optimizer-elems must be positive");
  ZAYA_CHECK(iters > 0 && warmup >= 0, "--iters must be positive and --warmup not negative");
  ZAYA_CHECK(peak >= 0 && copy >= 0, "--peak-tflops and --copy-gbs must not be negative");
  check_output_path("--json", json);
  check_output_path("--profile", profile);
  ZayaConfig cfg = !config.empty() ? ZayaConfig::load(config)
                                   : ZayaConfig::preset(preset.empty() ? "zaya1-base" : preset);
  const DeviceInfo dev = query_device(device);
  // The references the fractions are taken of: the flags, else the profile being extended (its
  // measured copy bandwidth), else the built-in profile of this GPU, else the device's figures.
  double ref_peak = dev.peak_bf16_tflops, ref_copy = dev.peak_hbm_gbs;
  std::string ref = "device";
  if (const std::string key = sizing::match_builtin_device(dev.name); !key.empty()) {
    const auto h = sizing::builtin_hardware(key);
    ref_peak = h.peak_bf16_tflops, ref_copy = h.copy_gbs, ref = "built-in " + key;
  }
  if (!profile.empty() && std::filesystem::exists(profile)) {
    const auto h = sizing::load_hardware(profile);
    ref_peak = h.peak_bf16_tflops, ref_copy = h.copy_gbs, ref = profile;
  }
  if (peak > 0) ref_peak = peak, ref = "--peak-tflops";
  if (copy > 0) ref_copy = copy, ref += " / --copy-gbs";
  ZAYA_CHECK(ref_peak > 0 && ref_copy > 0,
             "zaya bench kernels: no bf16 peak or copy bandwidth known for '{}' (give "
             "--peak-tflops and --copy-gbs)",
             dev.name);
  KernelBenchOptions o;
  o.cfg = cfg;
  o.batch = batch, o.seq = seq, o.optimizer_elems = opt_elems, o.device = device;
  o.timing.min_iters = iters;
  o.timing.warmup = warmup;
  fmt::print(
      "# zaya bench kernels: {} on {} ({} SMs, L2 {} MiB); B {} x S {}; fractions of {:.1f} "
      "TFLOP/s bf16 and {:.0f} GB/s copy ({})\n",
      config.empty() ? (preset.empty() ? "zaya1-base" : preset) : config, dev.name, dev.sm_count,
      dev.l2_bytes >> 20, batch, seq, ref_peak, ref_copy, ref);
  const auto rows = run_kernel_bench(o, dev);
  fmt::print("{}", kernel_table(rows, ref_peak, ref_copy));
  const auto eff = kernel_efficiencies(cfg, batch, seq, rows, opt_elems, ref_peak, ref_copy);
  fmt::print(
      "\n# efficiencies for the cost model (attention: FLOPs as FlashAttention counts them; "
      "memory classes: the bytes the cost model counts, forward + backward, per layer)\n{}",
      efficiency_table(eff));
  const std::string model = config.empty() ? (preset.empty() ? "zaya1-base" : preset) : config;
  if (!json.empty())
    write_text_file_atomic(
        json, kernel_results_json(rows, eff, dev, model, batch, seq, ref_peak, ref_copy));
  if (!profile.empty()) {
    merge_profile_file(profile, profile_from_kernels(eff, dev));
    // Read back so a profile the cost model cannot use fails here, not in `zaya size`.
    sizing::load_hardware(profile);
    fmt::print("# merged {} kernel efficiency rows into {}\n", eff.size(), profile);
  }
  return 0;
}

// ---- profile ----

int bench_profile_cli(int argc, char** argv) {
  CLI::App app{
      "zaya bench profile: run mem and gemm (knee, waves, optional model) and write a "
      "zaya.hardware/1 profile; add collectives with `mpirun ... zaya bench comm "
      "--profile F`",
      "zaya bench profile"};
  std::string outp;
  GemmCli g;
  g.knee = true;
  g.waves = "1024:8192:+256";
  MemCli m;
  m.maxb = "2G";
  app.add_option("--out", outp, "the profile JSON to write")->required();
  app.add_option("--model", g.model, "also measure this ZAYA config's GEMMs");
  app.add_option("--tokens", g.tokens, "tokens per micro-batch for --model")->capture_default_str();
  app.add_option("--dtype", g.dtypes, "GEMM dtypes")->capture_default_str();
  app.add_option("--waves", g.waves, "wave sweep LO:HI:+STEP")->capture_default_str();
  app.add_option("--device", g.device, "CUDA device")->capture_default_str();
  if (!parse(app, argc, argv)) return 0;
  m.device = g.device;
  const GemmBenchOptions gopt = g.options();
  const MemBenchOptions mopt = m.options();
  check_output_path("--out", outp);
  const DeviceInfo dev = query_device(gopt.device);
  fmt::print("# zaya bench profile: {}\n{}\n", dev.name, mem_table_header());
  const auto mrs = run_mem_bench(mopt, dev.peak_hbm_gbs);
  auto grs = run_gemm_bench(gopt);
  const auto [pb, pf] = apply_peaks(grs, dev, 0, 0);
  fmt::print("{}\n", gemm_table_header());
  for (const auto& r : grs) fmt::print("{}\n", gemm_table_row(r));
  nlohmann::json prof = nlohmann::json::object();
  merge_profile(prof, profile_from_mem(mrs, dev));
  merge_profile(prof, profile_from_gemm(grs, dev, pb, pf));
  write_text_file_atomic(outp, prof.dump(1) + "\n");
  fmt::print("# wrote {}\n", outp);
  return 0;
}

int run_bench(int argc, char** argv) {
  const std::string usage =
      "usage: zaya bench SUB [options]   (zaya bench SUB --help)\n"
      "  comm     collective bandwidth over MPI or NCCL (launch with mpirun)\n"
      "  gemm     cuBLASLt GEMM throughput: shape sweeps, model GEMMs, knee, tile quantization\n"
      "  mem      device memory and host<->device copy bandwidth\n"
      "  profile  run gemm and mem and write a zaya.hardware/1 profile\n"
      "  train    the CUDA training step: tokens/s, model TFLOP/s, memory, time by op class\n"
      "  infer    GPU inference: prefill tokens/s, decode step vs the bandwidth roofline\n"
      "  ckpt     training checkpoints: the loop's stall per save, write vs disk bandwidth\n"
      "  kernels  the model's attention/CCA/norm/loss/optimizer kernels: efficiencies for the "
      "cost model\n";
  if (argc < 2) {
    std::fprintf(stderr, "zaya bench: missing sub-command\n%s", usage.c_str());
    return 2;
  }
  const std::string sub = argv[1];
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::printf("%s", usage.c_str());
    return 0;
  }
  if (sub == "comm") return bench_comm(argc - 1, argv + 1);
  if (sub == "gemm") return bench_gemm_cli(argc - 1, argv + 1);
  if (sub == "mem") return bench_mem_cli(argc - 1, argv + 1);
  if (sub == "profile") return bench_profile_cli(argc - 1, argv + 1);
  if (sub == "train") return zaya::cli::bench_train_cli(argc - 1, argv + 1);
  if (sub == "infer") return zaya::cli::bench_infer_cli(argc - 1, argv + 1);
  if (sub == "ckpt") return zaya::cli::bench_ckpt_cli(argc - 1, argv + 1);
  if (sub == "kernels") return bench_kernels_cli(argc - 1, argv + 1);
  std::fprintf(stderr, "zaya bench: unknown sub-command '%s'\n%s", sub.c_str(), usage.c_str());
  return 2;
}

}  // namespace

ZAYA_COMMAND("bench",
             "characterize the cluster: comm, gemm, mem, profile, kernels, train, infer, ckpt",
             run_bench);
