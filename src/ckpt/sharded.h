// The sharded checkpoint layout: what each rank of a job writes into one checkpoint directory and
// how any number of ranks reads it back (docs/CHECKPOINT_FORMAT.md has it byte by byte).
//   model/config.json                        rank 0: the `transformers` config
//   model/model.safetensors.index.json       rank 0: the weight map of every shard
//   model/model-0000k-of-0000N.safetensors   rank k-1: the fp32 master weights it writes
//   state/rank-0000r-of-0000N.safetensors    rank r: the optimizer and balancing state it owns,
//                                            each piece placed in its global tensor by metadata
//   trainer.json                             rank 0: step, counters, data cursor, config
//   manifest.json                            rank 0, last (ckpt/checkpoint.h commits it)
// model/ is a `transformers` checkpoint as it stands (sharded with an index). A state file's
// "__metadata__" holds "zaya.pieces": a JSON object {tensor name: {"global_shape": [...],
// "offset": [...]}}, so the pieces of a name across all rank files tile its global tensor, and a
// reader at any world size takes the boxes it now owns (ShardedState::read).
//
// Deliberately not here: which rank owns what (dist/zero1.h, through the TrainStep), when to save
// or commit (ckpt/checkpoint.h), and the background writing itself (ckpt/async_writer.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/async_writer.h"
#include "ckpt/named_state.h"
#include "core/tensor.h"
#include "io/manifest.h"

namespace zaya {

class SafetensorsFile;

constexpr const char* kCheckpointModelDir = "model";
constexpr const char* kCheckpointStateDir = "state";
constexpr const char* kCheckpointTrainerFile = "trainer.json";
// The state of checkpoints written before the sharded layout: whole tensors in one file.
constexpr const char* kCheckpointLegacyState = "optimizer.safetensors";
constexpr const char* kStatePiecesKey = "zaya.pieces";

std::string state_file_rel(int rank, int world);  // "state/rank-00002-of-00004.safetensors"
std::string model_file_rel(int rank, int world);  // "model/model-00003-of-00004.safetensors"

// A weight to write: fp32 masters in memory the writer's copy can read (host, or the step's GPU).
struct WeightSource {
  std::string name;
  Shape shape;
  const float* data = nullptr;
};

// Which rank writes each weight: the index rank 0 writes lists them all.
struct WeightPlacement {
  std::string name;
  Shape shape;
  int rank = 0;
};

// What one rank puts into a checkpoint. The sources must stay valid until AsyncWriter::submit
// returns (the snapshot).
struct RankContribution {
  int rank = 0, world = 1;
  std::vector<WeightSource> weights;  // the weights this rank writes (its placements)
  std::vector<NamedState> state;      // its state pieces (fp32; host, or GPU memory on a GPU step)
  // Rank 0 only: every weight's placement (for the index), the model's config.json and
  // trainer.json.
  std::vector<WeightPlacement> placements;
  std::string config_json, trainer_json;
};

// The bytes of weights and state a contribution copies into the staging ring.
uint64_t contribution_bytes(const RankContribution& c);

// The files of `c` under the staging directory `dir`, for AsyncWriter::submit. Creates the model/
// and state/ subdirectories. A rank without weights writes no model shard.
std::vector<StreamFile> rank_checkpoint_files(const std::string& dir, const RankContribution& c);

// The state pieces of a checkpoint directory, read lazily: the rank files' headers are parsed at
// open (every name's pieces must tile its global shape, no gaps, no overlaps, all fp32); a file's
// data is mapped, and with verify its XXH64 checked against the manifest, the first time a read
// needs it. Reads checkpoints of the one-file layout (optimizer.safetensors, whole tensors) too.
class ShardedState : public StateSource {
 public:
  static std::unique_ptr<ShardedState> open(const std::string& dir, const Manifest& manifest,
                                            bool verify);
  ~ShardedState() override;

  std::vector<std::string> names() const override;
  bool has(const std::string& name) const override;
  const Shape& global_shape(const std::string& name) const override;
  Tensor read(const std::string& name, const std::vector<int64_t>& offset,
              const Shape& shape) const override;

  // The rank files (relative paths) and the world size that wrote them (1 for the one-file
  // layout).
  const std::vector<std::string>& files() const { return files_; }
  int writer_world() const { return writer_world_; }
  // The rank that wrote file i ("zaya.rank" of its metadata; 0 for the one-file layout).
  int file_rank(size_t i) const { return ranks_.at(i); }
  // The pieces of `name`: (file index, offset, shape).
  struct Piece {
    size_t file = 0;
    std::vector<int64_t> offset;
    Shape shape;
  };
  const std::vector<Piece>& pieces(const std::string& name) const;
  // Bytes of file data verified so far.
  uint64_t verified_bytes() const { return verified_bytes_; }

 private:
  ShardedState() = default;
  const SafetensorsFile& file(size_t i) const;

  std::string dir_;
  bool verify_ = true;
  std::vector<std::string> files_;
  std::vector<ManifestEntry> entries_;  // per file, from the manifest
  mutable std::vector<std::shared_ptr<SafetensorsFile>> open_;
  mutable std::vector<bool> verified_;
  mutable uint64_t verified_bytes_ = 0;
  struct Entry {
    Shape global;
    std::vector<Piece> pieces;
  };
  std::map<std::string, Entry> by_name_;
  std::vector<int> ranks_;  // per file
  int writer_world_ = 1;
};

// Checks the files under `prefix` ("model/") of checkpoint `dir` against the manifest (sizes and
// XXH64); an Error names the first file that does not match. Returns the bytes checked.
uint64_t verify_checkpoint_files(const std::string& dir, const Manifest& manifest,
                                 const std::string& prefix);

}  // namespace zaya
