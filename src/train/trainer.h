// The training loop: phases (sequence length, RoPE theta, data blend, batch ramp), gradient
// accumulation, clipping, Muon + AdamW, the balancing-bias update, NaN/Inf guard, periodic held-out
// evaluation, progress and a JSONL metrics file, and resumable checkpoints (model in the
// `transformers` layout, optimizer and balancing state, trainer state with the data cursor, and a
// checksummed manifest written last; each checkpoint directory is committed atomically).
//
// One process, on the CPU reference backend or (train.device = "cuda") on one GPU, through one
// TrainStep (engine/train_step.h): the same loop, data, schedule, balancing update and checkpoint
// files (ckpt/checkpoint.h) whatever the device. Under a launcher (mpirun, srun) every rank runs
// train(): data parallel with ZeRO-1 (engine/data_parallel_step.h), rank 0 the only writer
// (docs/TRAINING.md, "Several processes").
#pragma once
#include <string>
#include <vector>

#include "train/run_config.h"

namespace zaya {

struct TrainOptions {
  RunConfig config;
  std::string out_dir = "runs/tiny-brown";
  std::string resume;  // "" (fresh, refuses a directory holding checkpoints), "auto", or a path
  bool quiet = false;  // no per-step progress lines
  // bf16 dense peak (TFLOP/s) that MFU is quoted against on the GPU path: the measured H200
  // cuBLASLt figure by default (docs/BENCHMARKS.md).
  double peak_tflops = 790.0;
};

struct TrainResult {
  int64_t steps = 0, tokens = 0;
  double first_loss = 0, last_loss = 0, eval_loss = 0;
  double unigram_entropy = 0;  // nats per token of the training data (0 when not computed)
  double seconds = 0;
  int64_t skipped_steps = 0;
  std::string final_checkpoint, model_dir;
  double save_blocking_p50_ms = 0, save_blocking_p99_ms = 0;  // the loop's stall per checkpoint
};

TrainResult train(const TrainOptions& opts);

}  // namespace zaya
