// `zaya bench ckpt`: what a training checkpoint costs on this machine's disk, through the same
// code as `zaya train` (engine/train_step.h's checkpoint_contribution, ckpt/checkpoint.h's
// Checkpointer): a random-weight model of a preset and depth on the CPU or the GPU with its full
// optimizer state (one Muon + AdamW update taken), then SAVES saves, each timed for the training
// loop's stall (the snapshot) and for the background writer (bytes / seconds, fsyncs included),
// against the disk's own sequential write bandwidth measured in the same run with plain
// write + fsync of as many bytes into the same directory. Prints a table and optionally JSON.
// Deliberately not here: several ranks (each rank writes its own share, so per-rank figures are
// these), reading checkpoints back.
#pragma once
#include <cstdint>
#include <string>

namespace zaya::bench {

struct CkptBenchOptions {
  std::string preset = "zaya1-base", device = "cpu", dir = "zaya-bench-ckpt", json;
  std::string snapshot = "auto";  // checkpoint.snapshot: auto, device or host (GPU state)
  int64_t layers = 8, saves = 3, staging_mb = 0;
  uint64_t seed = 1234;
};

// Runs the benchmark (the checkpoints go under opts.dir, removed afterwards); returns 0.
int run_ckpt_bench(const CkptBenchOptions& opts);

}  // namespace zaya::bench
