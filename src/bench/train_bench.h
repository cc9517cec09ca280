// `zaya bench train`: throughput of the whole CUDA training step (forward + backward on CudaModel,
// global grad norm, AdamW + Muon on CudaOptimizer) for a preset with a chosen number of layers, on
// random weights and random tokens: tokens/s, model TFLOP/s (DESIGN.md §Performance: 6 × active
// matmul parameters incl. the LM head + 6·S·Hq·d attention per layer) and their fraction of the
// bf16 GEMM peak, device memory, the time split of one profiled step by op class, and JSON.
// tools/bench_train_peer.py measures the same step in PyTorch/transformers for comparison.
// With `dp` set ("nccl" or "mpi") the step runs through engine/data_parallel_step.h's
// DataParallelStep (ZeRO-1: gradient reduce-scatter, owned update, weight all-gather) over that
// communicator: under mpirun every rank runs the benchmark on `batch` sequences of its own (GPU =
// local rank, or local rank modulo the GPUs for "mpi"), rank 0 prints, and the table adds the
// time split of the data-parallel stages, so the cost of the machinery against the plain step
// (the same command without --dp) is visible. With one rank and NCCL it measures exactly that
// cost; with several ranks on one GPU over "mpi" it checks the path, not the speed. With `cp` > 1
// groups of cp adjacent ranks share each sequence (context parallelism, model/backward.h): the
// ranks of a group get the same tokens, each computes its two chunks of every sequence, and the
// printed loss and gradient norm are the global ones, comparable with the cp = 1 run of the same
// seed (the first group's tokens are the one-rank run's).
// Deliberately not here: data loading, gradient accumulation, checkpoints (the step only).
#pragma once
#include <cstdint>
#include <string>

namespace zaya::bench {

struct TrainBenchOptions {
  std::string preset = "zaya1-base", json, ns_precision = "bf16", optimizer = "adamw", hardware;
  std::string dp;                  // "" (the plain step), "nccl" or "mpi"
  int64_t bucket_elems = 1 << 24;  // data-parallel bucket, fp32 elements per rank
  int64_t layers = 8, batch = 4, seq = 4096, steps = 10, warmup = 3;
  uint64_t seed = 1234;
  double peak_tflops = 790.0, lr = 1e-4;
  bool recompute = false, no_profile = false;
  bool no_overlap = false;  // with dp: reduce every bucket after the backward
  int64_t cp = 1;           // with dp: context-parallel ranks per sequence
  int device = 0;
};

// Runs the benchmark, printing its table to stdout (and the JSON to opts.json); returns 0. In a
// build without the CUDA backend it throws zaya::Error saying so.
int run_train_bench(const TrainBenchOptions& opts);

}  // namespace zaya::bench
