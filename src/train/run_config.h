// RunConfig: everything a training run needs besides the model weights (model.init may name a
// checkpoint to start from; the trainer reads it), as a typed struct with defaults, read from a
// TOML file (toml++) plus `--section.key=value` command-line overrides, and written back as TOML
// (printed at start, stored in checkpoints; to_toml/from_toml round-trip). Unknown keys at any
// level are errors naming the key path and the file; bad values are errors naming the field. The
// key reference is docs/TRAINING.md. Deliberately not here: running anything (the loop is train/),
// loading data, or deciding the data-parallel size (passed in).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "optim/balancing.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace zaya {

struct BlendEntry {
  std::string prefix;  // path prefix of an indexed dataset (prefix.bin / prefix.idx)
  double weight = 1.0;
  bool operator==(const BlendEntry&) const = default;
};

struct ModelSection {
  std::string config = "tiny";  // a preset name, or a config.json (or a directory holding one)
  // Continued pretraining: a Hugging Face checkpoint directory (either ZAYA layout) whose weights
  // start a fresh run and whose config.json is the architecture. With init set, config may be ""
  // (the TOML reader sets it so when the file leaves it out); a non-empty config must agree with
  // the checkpoint on every shape-determining field. A resumed run ignores init.
  std::string init;
  // > 0: the architecture with this many layers (the first ones of its layer_types), e.g. an
  // 8-layer ZAYA1-base for a bench-sized run; 0: as the config says. With init it must agree.
  int64_t layers = 0;
};

struct OptimSection {
  double lr = 6e-4, min_lr = 2e-4;  // peak and final learning rate of the schedule
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;  // TOML: betas = [b1, b2]
  double eps = 1e-8;
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;
  double clip = 1.0;  // max global gradient norm; 0 turns clipping off
  bool default_rules = true;
  std::vector<ParamRule> rules;  // [[optim.rules]], tried before the defaults
  BalancingSettings balancing;   // [optim.balancing]

  OptimizerSettings optimizer_settings() const;
};

struct DataSection {
  std::string corpus = "brown";     // built-in corpus used when no blend is given
  std::string tokenizer = "bytes";  // "bytes" or a tokenizer.json path
  std::vector<BlendEntry> blend;    // [[data.blend]]
};

struct EvalSection {
  int64_t every = 100;  // steps; 0 turns evaluation off
  int64_t batches = 8;
};

struct CheckpointSection {
  int64_t every = 500;  // steps; 0: only at the end
  int64_t keep_last = 3;
  std::string dir = "checkpoints";
  bool async = true;       // write in the background after the snapshot (false: wait for it)
  int64_t staging_mb = 0;  // staging memory for the snapshot per rank, MiB; 0: one save's size
  // Where the snapshot of a GPU step's state goes: "device" (a ring in GPU memory: the loop
  // stalls for a device copy), "host" (page-locked host memory), "auto" (device when the GPU has
  // the ring plus 2 GiB free, else host). CPU steps always stage in host memory.
  std::string snapshot = "auto";
};

struct TrainSection {
  int64_t seed = 1234;
  int64_t micro_batch = 8;  // sequences per rank per forward/backward
  int64_t grad_accum = 1;   // micro-batches per optimizer step
  int64_t steps = 1000;     // optimizer steps in the run
  int64_t seq_len = 256;    // default for phases that do not set one
  std::string device = "cpu";
  int64_t log_every = 10;
  bool recompute = false;  // CUDA: keep only layer inputs, recompute each layer in the backward
};

// [parallel]: data parallelism across the ranks of a launched job (mpirun, srun), and context
// parallelism: cp ranks share every sequence (model/backward.h), dp = world / cp groups.
struct ParallelSection {
  int64_t dp = 0;                // data-parallel ranks; 0: the world size over cp
  int64_t cp = 1;                // context-parallel ranks per sequence (phases may override)
  std::string backend = "auto";  // "auto" (nccl on cuda, mpi on cpu), "nccl" or "mpi"
  double bucket_mb = 25.0;       // MiB of fp32 gradients per rank per reduce-scatter bucket
  bool overlap = true;  // buckets during the backward, the gather during the next forward (NCCL)
};

// [fault_tolerance]: what a rank does about hung collectives and bad numerics
// (docs/FAULT_TOLERANCE.md, "Inside each rank"; the supervisor is `zaya supervise`).
struct FaultToleranceSection {
  // Seconds a collective may make no progress before the rank's watchdog ends the job with exit
  // code 5 (0: off; ZAYA_COLLECTIVE_TIMEOUT, when set, wins).
  double collective_timeout = 0;
  // A non-finite loss or gradient norm (or a loss spike): "skip" the update (stopping after 5 in a
  // row), "restart" (every rank exits with code 3 without the update, for the supervisor to
  // relaunch from the last checkpoint), or "auto": restart when supervised (ZAYA_SUPERVISOR set),
  // else skip.
  std::string nonfinite = "auto";
  // A loss above loss_spike × the mean of the previous loss_spike_window steps is treated as a
  // non-finite step (0: off). The rule starts once the window is full (after each (re)start).
  double loss_spike = 0;
  int64_t loss_spike_window = 20;
};

struct PhaseSection {
  std::string name;
  int64_t tokens = 0;  // budget in tokens, or
  int64_t steps = 0;   // budget in optimizer steps (exactly one; the last phase may have none)
  std::optional<int64_t> seq_len;    // unset: train.seq_len
  std::optional<double> rope_theta;  // unset: the model's
  std::vector<BlendEntry> blend;     // empty: data.blend (or the built-in corpus)
  std::optional<int64_t> batch_size;  // global sequences per step; unset: micro_batch·grad_accum·dp
  int64_t batch_start = 0;            // batch ramp: sequences per step at the phase start, growing
  int64_t batch_ramp_tokens = 0;      // linearly to batch_size over this many tokens; 0: no ramp
  std::optional<int64_t> cp;          // context-parallel ranks in this phase; unset: parallel.cp
  std::optional<bool> recompute;      // activation recomputation in this phase; unset: train's
};

// What the loop needs to know about the phase a (step, tokens) position falls in.
struct PhaseState {
  size_t index = 0;  // into RunConfig::phases (0 for the implicit single phase)
  std::string name;
  int64_t seq_len = 0;
  double rope_theta = 0;    // the phase's, else the model_rope_theta passed in
  int64_t batch_size = 0;   // global sequences for this step (after the ramp)
  int64_t micro_steps = 0;  // forward/backward passes per rank: batch_size / (micro_batch·dp)
  int64_t cp = 1;           // context-parallel ranks per sequence group
  int64_t dp = 1;           // sequence groups: world / cp
  bool recompute = false;   // activation recomputation (CUDA step)
  std::vector<BlendEntry> blend;  // empty: the built-in corpus data.corpus
  bool past_end = false;          // beyond the last phase's budget (the last phase continues)
};

struct RunConfig {
  ModelSection model;
  OptimSection optim;
  ScheduleSettings schedule{ScheduleKind::Cosine, 100, 0, 0.2,
                            DecayShape::Linear};  // total 0: train.steps
  DataSection data;
  EvalSection eval;
  CheckpointSection checkpoint;
  TrainSection train;
  ParallelSection parallel;
  FaultToleranceSection fault_tolerance;
  std::vector<PhaseSection> phases;   // [[phase]]
  std::string source = "<defaults>";  // the file it came from, for messages

  // Reads a TOML file, applies overrides ("--optim.lr=3e-4" or "optim.lr=3e-4") and validates.
  // load, from_toml and defaults throw ConfigError (core/error.h) for every problem they find.
  static RunConfig load(const std::string& path, const std::vector<std::string>& overrides = {});
  // The same from TOML text; `where` names the source in errors.
  static RunConfig from_toml(const std::string& text, const std::string& where = "<string>",
                             const std::vector<std::string>& overrides = {});
  // Defaults plus overrides (no file).
  static RunConfig defaults(const std::vector<std::string>& overrides = {});
  // Every key (optional phase fields only when set), loadable by from_toml.
  std::string to_toml() const;

  // Throws zaya::Error naming the field; called by load/from_toml/defaults.
  void validate() const;
  // The [parallel] settings against a job of `world` ranks: returns the data-parallel size and
  // the resolved backend; throws zaya::Error (naming the field) when dp does not divide the world
  // size or any phase's global batch is not a multiple of micro_batch × dp.
  struct ResolvedParallel {
    int64_t dp = 1;
    std::string backend = "mpi";
    int64_t bucket_elems = 1;
  };
  ResolvedParallel resolve_parallel(int64_t world) const;

  // The model architecture: the preset or config.json of model.config, or with model.init the
  // checkpoint's (a model.config that disagrees on a shape-determining field is an error naming
  // the fields and both values). `notes`, when given, receives one line per other field in which a
  // given model.config differs from the checkpoint (the checkpoint's value is used).
  ZayaConfig resolve_model(std::vector<std::string>* notes = nullptr) const;
  ScheduleSettings resolved_schedule() const;  // total_steps 0 → train.steps
  // Phase of the step about to run, given the tokens consumed before it, in a job of `world`
  // ranks (the phase's dp is world / its cp; throws zaya::Error when cp does not divide it).
  PhaseState phase_at(int64_t step, int64_t tokens, int64_t world = 1,
                      double model_rope_theta = 0) const;
  // The context-parallel size of phase i (parallel.cp unless the phase sets its own).
  int64_t phase_cp(size_t i) const;
  // Every valid key path ("phase.N.seq_len" for list entries), for help and suggestions.
  static std::vector<std::string> key_paths();
};

// True for a command-line argument that looks like a config override ("--a.b=c").
bool is_config_override(const std::string& arg);

}  // namespace zaya
