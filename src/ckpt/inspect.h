// Looking at training checkpoints without training: what `zaya ckpt inspect` and `zaya ckpt verify`
// report. inspect_checkpoint summarises one checkpoint directory (trainer state, files, the model's
// weights and shards, every state tensor with its global shape and the ranks holding its pieces)
// and, with digests, hashes each assembled global tensor (XXH64 of its fp32 bytes, row-major), so
// two checkpoints written by any world sizes can be compared name by name. verify_checkpoint checks
// every byte against the manifest (check_checkpoint) and then the structure (the state pieces tile
// their tensors, the model loads). A path may also be a checkpoints root (step-* directories) or a
// run directory holding one (checkpoints/): classify_checkpoint_path tells which.
//
// Deliberately not here: changing a checkpoint (ckpt/export_hf.h writes an HF copy, train/
// reshapes one), and anything that needs the run config (train/ckpt_tools.h).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/dtype.h"
#include "io/manifest.h"
#include "model/config.h"

namespace zaya {

struct CheckpointSummary {
  std::string dir;
  TrainerState trainer;
  nlohmann::json manifest_extra = nlohmann::json::object();
  std::vector<ManifestEntry> files;  // as the manifest lists them
  ZayaConfig config;
  int64_t params = 0;         // elements over all weights
  uint64_t weight_bytes = 0;  // their stored bytes
  struct Shard {
    std::string file;  // relative to the checkpoint
    int64_t tensors = 0;
    uint64_t bytes = 0;  // tensor bytes in it
  };
  std::vector<Shard> shards;
  struct Weight {
    std::string name, file;
    Shape shape;
    DType dtype = DType::F32;
    std::string digest;  // XXH64 of its fp32 bytes (hex), with digests
  };
  std::vector<Weight> weights;  // by name
  int state_world = 1;          // ranks that wrote the state files
  std::vector<std::string> state_files;
  struct State {
    std::string name;
    Shape global_shape;
    int64_t pieces = 0;
    std::vector<int> ranks;  // that hold a piece, ascending
    std::string digest;
  };
  std::vector<State> state;  // by name
  bool digests = false;

  nlohmann::json to_json() const;
  std::string to_text() const;
};

// Reads the manifest, trainer.json, the model's headers and the state files' headers of a
// checkpoint directory (an Error names the file that is missing or malformed). With digests, every
// tensor is read, and every file it comes from is first checked against the manifest's checksum.
CheckpointSummary inspect_checkpoint(const std::string& dir, bool digests);

// One checkpoint's verdict: ok, or every problem found, each naming its file.
struct CheckpointVerdict {
  std::string dir;
  bool ok = false;
  std::vector<std::string> problems;
};
// check_checkpoint with every checksum; when the bytes are the manifest's, also the structure:
// the state pieces tile their global tensors and model/ loads (names and shapes of the config).
// With check_hashes false, sizes only (fast; what inspect reports for a root). Never throws for a
// bad checkpoint.
CheckpointVerdict verify_checkpoint(const std::string& dir, bool check_hashes = true);

// What a path given to the tools is: one checkpoint (it holds manifest.json, trainer.json or
// state/), or a root of step-* checkpoints (the path itself, or its checkpoints/ subdirectory:
// a run's --out). An Error says why it is neither.
struct CheckpointPath {
  enum class Kind { Checkpoint, Root } kind = Kind::Checkpoint;
  std::string path;  // the checkpoint, or the root
};
CheckpointPath classify_checkpoint_path(const std::string& path);
// The checkpoint a tool works on: `path` itself, or under a root the newest checkpoint that
// check_checkpoint accepts (an Error lists why each was skipped when none is).
std::string resolve_checkpoint_dir(const std::string& path);

}  // namespace zaya
