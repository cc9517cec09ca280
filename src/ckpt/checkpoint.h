// Training checkpoints: one directory per saved step under a root (step-00000100, ...), committed
// atomically (staged, fsynced, renamed) with a manifest of every file's size and XXH64 written
// last, so a directory that verifies is complete. Contents (docs/CHECKPOINT_FORMAT.md):
//   model/                  the weights in the `transformers` layout (fp32 masters)
//   optimizer.safetensors   the named state of the optimizer and the balancing update
//   trainer.json            step, tokens, phase, counters, the data cursor, the resolved config
//   manifest.json
// Older checkpoints beyond keep_last are deleted after a new one is committed; resuming picks the
// newest one whose manifest verifies and reports the ones it skips.
//
// Deliberately not here: what the state means (the TrainStep's) and when to save (the loop's).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/named_state.h"
#include "model/zaya.h"

namespace zaya {

// The loop's own state, stored in trainer.json.
struct TrainerState {
  int64_t step = 0, tokens = 0, phase = -1, skipped_steps = 0;
  int64_t optimizer_steps = 0, balancing_steps = 0;
  nlohmann::json data_cursor;  // the current phase's loader cursor (null before the first step)
  std::string config_toml;     // the resolved run config

  nlohmann::json to_json() const;
  // Throws zaya::Error naming `where` and the missing or malformed field.
  static TrainerState from_json(const nlohmann::json& j, const std::string& where);
};

std::string checkpoint_dir_name(int64_t step);  // "step-00000100"

// Writes root/step-XXXXXXXX (replacing one of that name), then deletes the oldest checkpoints so
// that keep_last (at least 1) remain. Returns the directory. A failed save removes its staging
// directory and leaves the committed checkpoints alone.
std::string save_checkpoint(const std::string& root, const ZayaModel& model,
                            const std::vector<NamedState>& state, const TrainerState& trainer,
                            int64_t keep_last);

struct LoadedCheckpoint {
  ZayaModel model;  // owned fp32 tensors (training writes them in place)
  std::vector<std::pair<std::string, Tensor>> state;
  TrainerState trainer;
};

// Reads a checkpoint directory (after its manifest verified).
LoadedCheckpoint load_checkpoint(const std::string& dir);

// The newest checkpoint under `root` whose manifest verifies; each one skipped is reported (with
// the reason) through `skipped`. Returns "" when there is none.
std::string find_resumable_checkpoint(const std::string& root,
                                      std::vector<std::string>* skipped = nullptr);

// What a run's --resume means for checkpoints under `root`: "auto" is the newest valid one (or ""
// when there is none, with the skipped ones logged), a path must verify, and "" (a fresh run)
// refuses a root that already holds checkpoints. Returns the directory to resume from, or "".
std::string resolve_resume(const std::string& root, const std::string& resume);

}  // namespace zaya
