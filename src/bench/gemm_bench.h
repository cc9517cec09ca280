// `zaya bench gemm`: cuBLASLt GEMM throughput. The shape bookkeeping here (ranges, a ZAYA config's
// forward+backward GEMMs, tile/wave counts, the knee) is plain C++ and unit-tested; the
// measurement (run_gemm_bench) is in gemm_bench_cuda.cpp and exists only in CUDA builds.
//
// Convention: every GEMM is Y[m,n] = X[m,k] * W[n,k]^T in row-major terms (a linear layer with
// m tokens), which cuBLASLt runs as the column-major "TN" problem, the layout Hopper FP8 needs.
// FLOPs are 2*m*n*k per problem.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace zaya::bench {

struct GemmShape {
  std::string name;  // "q_proj.fwd", "experts.gate_up.wgrad", "square", ...
  int64_t m = 0, n = 0, k = 0;
  int64_t groups = 1;  // > 1: a grouped GEMM of this many equal problems (the experts)
  int64_t count = 1;   // how many times a training step runs it (layers x micro-batch)
  double gflop() const { return 2.0 * double(m) * double(n) * double(k) * double(groups) / 1e9; }
};

// A range of GEMM dimensions: "4096", "1024,2048,4096", "256:8192:x2" (geometric) or
// "1024:4096:+256" (linear). Values accept K/M suffixes (1024-based). Throws zaya::Error naming
// `flag`.
std::vector<int64_t> parse_dim_range(const std::string& s, const std::string& flag);
// One shape "MxNxK" or "MxNxKxGROUPS", optionally named "NAME=MxNxK..." (default name "shape").
// Throws zaya::Error naming `flag`.
GemmShape parse_gemm_shape(const std::string& s, const std::string& flag);
// The cartesian product of the three ranges, named "sweep".
std::vector<GemmShape> cartesian_shapes(const std::vector<int64_t>& ms,
                                        const std::vector<int64_t>& ns,
                                        const std::vector<int64_t>& ks);
// Square GEMMs m=n=k from 256 up to `max_dim`, in steps of sqrt(2): the knee sweep.
std::vector<GemmShape> knee_shapes(int64_t max_dim);
// Wave-quantization sweep: m = n from `lo` to `hi` in steps of `step`, k fixed.
std::vector<GemmShape> wave_shapes(int64_t lo, int64_t hi, int64_t step, int64_t k);

// The linear-layer GEMMs of one training step of a ZAYA model on `tokens` tokens per micro-batch:
// forward (fwd), input gradient (dgrad: m=tokens, n=in, k=out) and weight gradient (wgrad: m=out,
// n=in, k=tokens) of q/k/v/o projections, the router MLP, the experts (as grouped GEMMs of E
// problems with tokens/E rows each, assuming balanced routing) and the tied LM head. Identical
// shapes are merged with their counts summed. Attention's score/value products and the CCA
// convolutions are not GEMMs of the weights and are not listed.
std::vector<GemmShape> model_gemm_shapes(const ZayaConfig& cfg, int64_t tokens);

// Output tiles of a tile_m x tile_n tiling and the waves they take on `sms` multiprocessors.
inline int64_t tile_count(int64_t m, int64_t n, int64_t tile_m, int64_t tile_n) {
  return ((m + tile_m - 1) / tile_m) * ((n + tile_n - 1) / tile_n);
}
inline double wave_count(int64_t tiles, int64_t sms) {
  return sms > 0 ? double(tiles) / sms : 0;
}

// When a row's timed launches ran and what the GPU's clock did meanwhile, for attributing a
// difference between two measurements (zaya's rounds and the peer's, tools/bench_peer_compare.py)
// to the clock. t_start/t_end: Unix time in seconds (system clock) at which the host saw the first
// and the last timed event complete (polled about every millisecond); 0 when not recorded. The
// sampled means come from NVML (dlopen'd libnvidia-ml.so.1) about every millisecond in between;
// samples = 0 when NVML is unavailable. clock_reasons: NVML's clock event (throttle) reason bits
// seen in any sample (0x4 software power cap, 0x8 hardware slowdown, 0x20/0x40 thermal, ...).
struct GpuWindow {
  double t_start = 0, t_end = 0;
  int samples = 0;
  double sm_clock_mhz = 0, sm_clock_min_mhz = 0, power_w = 0, temp_c = 0;
  unsigned long long clock_reasons = 0;
};

struct GemmResult {
  GemmShape shape;
  std::string dtype;   // "bf16" or "fp8"
  std::string method;  // "lt" (one cuBLASLt call), "lt-batched", "loop", "grouped", "cublas"
  double time_us = 0, tflops = 0, fraction = 0;  // fraction of the peak
  int64_t tiles = 0;                             // 128x128 output tiles (an assumed tile size)
  double waves = 0;
  int64_t checked = 0, wrong = 0;  // sampled outputs compared to the CPU fp64 reference
  double max_rel_err = 0;
  int sets = 1;        // operand sets rotated (together past 3x L2)
  int iters = 0;       // timed launches (the median of their times is time_us)
  int warm = 0;        // time-based warm-up launches before them (TimingPolicy)
  int algo = -1;       // "lt"/"lt-batched": index of the kept algorithm in the heuristic's list
  int candidates = 0;  // how many candidates the heuristic returned (and autotuning timed)
  // "lt"/"lt-batched": the kept cuBLASLt algorithm (cublasLtMatmulAlgo_t) as hex, so a later run
  // can time the same algorithm without autotuning again (--algos-from); algo_reused when this
  // row took it from such a file.
  std::string algo_config;
  bool algo_reused = false;
  // The same algorithm as cuBLASLt describes it (cublasLtMatmulAlgoConfigGetAttribute: "id",
  // "tile", "stages", "splitk", "reduction", "swizzle", "custom", "inner_shape", "cluster_shape";
  // the enum values of cublasLt.h), to compare with the kernel another library runs.
  std::vector<std::pair<std::string, int64_t>> algo_fields;
  // How the timed launches were issued: "direct" (one cuBLASLt call each) or "cuda-graph" (each a
  // replay of a graph holding that call; --cuda-graph), as tools/bench_peer.py labels its rows.
  std::string launch = "direct";
  GpuWindow gpu;  // the timed launches' window and clock samples (JSON: when recorded)
};

// How every GEMM row is timed, by zaya and, identically, by the PyTorch peer
// (tools/bench_peer.py reads these numbers and each row's sets/warm/iters from the gemm JSON):
//   1. `warmup` launches;
//   2. an estimate: the stream is held by a spin kernel for block_us(3) while the host enqueues
//      3 launches between two events (so the estimate is GPU time, not launch cost);
//   3. warm_launches(estimate) more launches (at least `warm_ms` of GPU work, so clocks and power
//      settle at the level the shape itself sets, not the previous shape's);
//   4. timed_iters(estimate) launches, enqueued while a spin kernel holds the stream for
//      block_us(iters), each bracketed by consecutive CUDA events; the median is reported.
// Launch i uses operand set i mod sets throughout. Holding the stream matters for launches shorter
// than the host's launch cost (a few us in C++, ~20 us from Python): without it per-launch events
// time the host, not the GPU.
struct TimingPolicy {
  int warmup = 5;           // untimed launches first
  int min_iters = 20;       // timed launches: at least this many ...
  int max_iters = 200;      // ... at most this many (the launch queue holds ~1000 entries)
  double warm_ms = 20;      // time-based warm-up: this much GPU time of the shape itself
  double min_time_ms = 25;  // timed launches cover at least this much GPU time
  double block_base_us = 1000, block_per_iter_us = 50, block_max_us = 50000;
};
// ceil(warm_ms / estimate) launches, in [0, 1000]; 0 for a non-positive estimate.
int warm_launches(const TimingPolicy& p, double est_us);
// ceil(min_time_ms / estimate) launches, clamped to [min_iters, max(min_iters, max_iters)].
int timed_iters(const TimingPolicy& p, double est_us);
// How long the spin kernel holds the stream while `iters` launches are enqueued.
double block_us(const TimingPolicy& p, int iters);

// The best TFLOP/s of the single-call cuBLASLt rows ("lt", "lt-batched") of `dtype`: the
// measured peak. 0 when there is none.
double measured_peak_tflops(const std::vector<GemmResult>& results, const std::string& dtype);

// The work (GFLOP) at which throughput first reaches `fraction` of `peak_tflops`: results are
// ordered by work; if the first one at or above the threshold is not the smallest, the knee is
// interpolated linearly in log(work) between it and the result before it (the sweep's steps are
// 2.8x in work, too coarse to report a measured point alone). Negative when no result reaches the
// threshold or the peak is not positive.
double knee_gflop(const std::vector<GemmResult>& results, double peak_tflops, double fraction);

struct GemmBenchOptions {
  std::vector<std::string> dtypes{"bf16"};  // "bf16", "fp8"
  std::vector<GemmShape> shapes;
  TimingPolicy timing;  // timing.warmup / timing.min_iters are --warmup / --iters
  // cuBLASLt heuristic candidates requested per shape; all are timed on the real operands and
  // the fastest kept (see run_gemm_bench).
  int autotune = 32;
  // > 0: also, per cuBLASLt algorithm id, that id's best search_per_algo configurations as
  // candidates (a wider search than the heuristic's list; LtProblem::widen). On the H200 it found
  // 7–10% over the heuristic's best on 7168²–7680² × 4096 (docs/bench/h200-2026-12-03e).
  int search_per_algo = 4;
  // Algorithms to time instead of autotuning, by gemm_algo_key (from an earlier run's JSON,
  // load_gemm_algos); a key that is missing or an algorithm cuBLASLt rejects is autotuned.
  std::map<std::string, std::string> fixed_algos;
  // dtypes whose "lt"/"lt-batched" rows are timed from CUDA graph replays (GraphLaunches), the
  // way the peer times torch._scaled_mm; a shape whose capture fails is timed directly.
  std::vector<std::string> graph_dtypes;
  size_t workspace_bytes = size_t(32) << 20;  // PyTorch's cuBLAS workspace on Hopper, and ours
  bool check = true;
  bool grouped_methods = true;  // for groups > 1: also the per-expert loop and cuBLAS grouped
  bool cublas_rows = false;     // bf16: also cuBLAS's default GEMM, the call torch.matmul makes
  int device = 0;
};

struct DeviceInfo {
  std::string name;
  int sm_count = 0, cc_major = 0, cc_minor = 0;
  int64_t l2_bytes = 0, global_bytes = 0;
  double peak_hbm_gbs = 0;      // 2 x memory clock x bus width
  double peak_bf16_tflops = 0;  // from a spec table or clocks; 0 when unknown
  double peak_fp8_tflops = 0;   // 0 when the device has no FP8 tensor cores (before sm_89)
  std::string peak_source;      // "spec table", "clock x SMs", "unknown"
};

// Defined in the *_cuda.cpp files; in a build without CUDA, bench/cpu_only_standins.cpp has stand-ins that throw.
DeviceInfo query_device(int device);
// Runs every (shape, dtype); fp8 shapes are skipped (with a note on stderr) on devices without
// FP8. Per shape the "lt"/"lt-batched" row is autotuned: up to opt.autotune heuristic candidates
// (with opt.workspace_bytes of workspace) are each launched once, the GPU is warmed with the first,
// every candidate is timed briefly and the best three again in interleaved rounds; the fastest is
// then measured with opt.timing. Results carry no `fraction` (the caller knows the peak).
std::vector<GemmResult> run_gemm_bench(const GemmBenchOptions& opt);

std::string gemm_table_header();
std::string gemm_table_row(const GemmResult& r);
// JSON {"schema":"zaya.bench.gemm/1","device","sm_count","peak_tflops","peak_source",
// "measured_peak_tflops","workspace_bytes","timing":{TimingPolicy fields},"results":[...]}.
// A row has "t_start"/"t_end" when its window was recorded and "clock_samples", "sm_clock_mhz",
// "sm_clock_min_mhz", "power_w", "temp_c", "clock_reasons" when NVML sampled it (fields added to
// schema 1; readers of the older rows are unaffected).
std::string gemm_results_json(const std::vector<GemmResult>& rs, const DeviceInfo& dev,
                              double peak_bf16, double peak_fp8,
                              const GemmBenchOptions& opt = GemmBenchOptions{});
std::string gemm_results_csv(const std::vector<GemmResult>& rs);

// "dtype m n k groups": the key of one autotuned GEMM in fixed_algos.
std::string gemm_algo_key(const std::string& dtype, const GemmShape& s);
// The kept algorithms ("algo_config") of the "lt"/"lt-batched" rows of a `zaya bench gemm --json`
// file, by gemm_algo_key. Throws zaya::Error naming the file when it cannot be read, is not that
// JSON, or a row's algo_config is not hex.
std::map<std::string, std::string> load_gemm_algos(const std::string& path);

}  // namespace zaya::bench
