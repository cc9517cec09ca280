// `zaya bench train`: throughput of the whole CUDA training step (forward + backward on CudaModel,
// global grad norm, AdamW + Muon on CudaOptimizer) for a preset with a chosen number of layers, on
// random weights and random tokens: tokens/s, model TFLOP/s (DESIGN.md §Performance: 6 × active
// matmul parameters incl. the LM head + 6·S·Hq·d attention per layer) and their fraction of the
// bf16 GEMM peak, device memory, the time split of one profiled step by op class, and JSON.
// tools/bench_train_peer.py measures the same step in PyTorch/transformers for comparison.
// Deliberately not here: data loading, gradient accumulation, checkpoints (the step only).
#pragma once
#include <cstdint>
#include <string>

namespace zaya::bench {

struct TrainBenchOptions {
  std::string preset = "zaya1-base", json, ns_precision = "bf16", optimizer = "adamw", hardware;
  int64_t layers = 8, batch = 4, seq = 4096, steps = 10, warmup = 3;
  uint64_t seed = 1234;
  double peak_tflops = 790.0, lr = 1e-4;
  bool recompute = false, no_profile = false;
  int device = 0;
};

// Runs the benchmark, printing its table to stdout (and the JSON to opts.json); returns 0. In a
// build without the CUDA backend it throws zaya::Error saying so.
int run_train_bench(const TrainBenchOptions& opts);

}  // namespace zaya::bench
