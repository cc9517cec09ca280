// `zaya bench infer`: GPU inference speed of a preset at a chosen depth on random weights: prefill
// tokens/s for a batch of prompts, and cached decode time per step with its fraction of the
// memory-bandwidth roofline (bytes a step must read — active weights, LM head, K/V cache — over
// the measured device copy bandwidth), optionally one eager step by op class, the step without
// each op class, and the decode trace. tools/bench_infer_peer.py measures transformers' generate
// on the same model shape for comparison. Deliberately not here: sampling (greedy on the device),
// tokenization, mixed-length batches.
#pragma once
#include <cstdint>
#include <string>

namespace zaya::bench {

struct InferBenchOptions {
  std::string preset = "zaya1-base";
  std::string json;          // write the results here as JSON (empty: none)
  std::string write_config;  // only write the benchmarked model's config.json here and return
  int64_t layers = 0;        // 0: the preset's
  int64_t batch = 1, prompt = 4096, decode = 128, warmup = 8, repeats = 3;
  double copy_gbs = 0.0;  // the roofline's bandwidth; 0: measured on the device at start
  bool no_graphs = false, profile = false, ablate = false, trace = false;
  uint64_t seed = 1234;
};

// Runs the benchmark on CUDA device 0, printing its table to stdout; returns 0. In a build without
// the CUDA backend it throws zaya::Error saying so.
int run_infer_bench(const InferBenchOptions& o);

}  // namespace zaya::bench
