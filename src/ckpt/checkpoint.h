// Training checkpoints: one directory per saved step under a root (step-00000100, ...), in the
// sharded layout of ckpt/sharded.h (each rank writes its own files in parallel), saved
// asynchronously and committed atomically:
//   1. every rank snapshots its part into its AsyncWriter's staging ring (the only time the step
//      blocks) and a background thread writes it under <root>/.tmp-step-XXXXXXXX-<job tag>/,
//      hashing and fsyncing each file;
//   2. at later step boundaries poll() asks (one small all-reduce) whether every rank's files are
//      durable; when they are, rank 0 gathers every file's size and XXH64, writes manifest.json
//      last, renames the directory into place and fsyncs its parent. Only then is it the latest
//      checkpoint, and only then are checkpoints beyond keep_last deleted;
//   3. a job that dies before the commit leaves a staging directory that no reader looks at (the
//      next run's Checkpointer removes it) and the previous checkpoints untouched.
// Resuming picks the newest checkpoint whose manifest verifies and whose trainer.json belongs to
// that manifest (step and save id agree), reporting the ones it skips.
//
// Deliberately not here: what the state means (the TrainStep's) and when to save (the loop's).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/async_writer.h"
#include "ckpt/named_state.h"
#include "ckpt/sharded.h"
#include "io/manifest.h"
#include "model/zaya.h"

namespace zaya {

class Communicator;

// The loop's own state, stored in trainer.json.
struct TrainerState {
  int64_t step = 0, tokens = 0, phase = -1, skipped_steps = 0;
  int64_t optimizer_steps = 0, balancing_steps = 0;
  nlohmann::json data_cursor;  // the current phase's loader cursor (null before the first step)
  std::string config_toml;     // the resolved run config
  int64_t world = 1;           // ranks that wrote the checkpoint
  std::string save_id;         // unique per save; the manifest carries the same (empty: older)

  nlohmann::json to_json() const;
  std::string to_file_text() const;  // trainer.json as written (to_json, one-space indent)
  // Throws zaya::Error naming `where` and the missing or malformed field.
  static TrainerState from_json(const nlohmann::json& j, const std::string& where);
};

std::string checkpoint_dir_name(int64_t step);  // "step-00000100"
// The step-* directories under `root`, oldest first (the names sort by step); none when `root`
// is not a directory.
std::vector<std::string> checkpoint_dirs(const std::string& root);
// The manifest's `extra` of a training checkpoint (docs/CHECKPOINT_FORMAT.md §5).
nlohmann::json checkpoint_manifest_extra(int64_t step, int64_t world, const std::string& save_id);

// Blocking times and write figures of the saves of a run.
struct SaveStats {
  std::vector<double> blocking_ms;       // per save: the time the training loop was stopped
  std::vector<double> write_s;           // per save: this rank's writer, first byte to last fsync
  std::vector<uint64_t> bytes;           // per save: bytes this rank wrote
  double percentile_ms(double p) const;  // of blocking_ms (0 when empty)
};

class Checkpointer {
 public:
  // comm: the job's host communicator (nullptr: one process); every rank constructs one with the
  // same root and tag (a token unique to the job). Rank 0 removes staging leftovers of earlier
  // jobs under root (collective). staging_bytes: the host-memory budget of the staging ring (0:
  // one save's size).
  Checkpointer(std::string root, int64_t keep_last, size_t staging_bytes, StagingMemory mem,
               Communicator* comm, std::string tag);
  // A save still in flight is waited for but not committed (an interrupted run).
  ~Checkpointer();

  // Starts the save of `step` with this rank's part (every rank calls it at the same step): a
  // save still in flight is committed first (finish()); then the snapshot. When it returns the
  // sources in `c` may change. On rank 0, `save_id` is the one written into c.trainer_json (see
  // new_save_id); the manifest carries it too.
  void begin(int64_t step, const RankContribution& c, const std::string& save_id);
  // Collective while a save is in flight (all ranks call it at the same points; free otherwise):
  // commits the save when every rank's files are durable. Returns the committed directory, or "".
  // A failed write on any rank is an Error on every rank, naming the rank, host and reason.
  std::string poll();
  // Waits for the save in flight and commits it (collective). Returns its directory ("" when
  // nothing was in flight).
  std::string finish();
  bool in_flight() const { return in_flight_; }
  // Prepares the staging memory for saves of `bytes` (this rank's part), outside the loop.
  void reserve(uint64_t bytes) { writer_->reserve(size_t(bytes)); }

  // A fresh save id (rank 0 draws it; begin() carries it into the manifest).
  static std::string new_save_id(int64_t step);
  const SaveStats& stats() const { return stats_; }
  void record_blocking(double ms) { stats_.blocking_ms.push_back(ms); }
  const std::string& root() const { return root_; }

 private:
  std::string commit();
  std::string staging_for(int64_t step) const;

  std::string root_;
  int64_t keep_last_;
  Communicator* comm_;
  std::string tag_;
  std::unique_ptr<AsyncWriter> writer_;
  bool in_flight_ = false;
  int64_t step_ = 0;
  std::string save_id_;
  SaveStats stats_;
};

struct LoadedCheckpoint {
  ZayaModel model;  // owned fp32 tensors (training writes them in place)
  std::unique_ptr<ShardedState> state;
  TrainerState trainer;
  Manifest manifest;
};

// Reads a checkpoint directory whose manifest verified. verify: check the checksum of every file
// this process reads (model shards now, state files when a read first touches them) against the
// manifest; pass false only when the whole checkpoint was just verified.
LoadedCheckpoint load_checkpoint(const std::string& dir, bool verify = true);

// Whether `dir` is a complete checkpoint: its manifest verifies (with check_hashes, every byte),
// and trainer.json matches it (the same step, the directory's name, the same save id).
ManifestCheck check_checkpoint(const std::string& dir, bool check_hashes = true);

// The newest checkpoint under `root` that check_checkpoint accepts; each one skipped is reported
// (with the reason) through `skipped`. Returns "" when there is none.
std::string find_resumable_checkpoint(const std::string& root,
                                      std::vector<std::string>* skipped = nullptr);

// What a run's --resume means for checkpoints under `root`: "auto" is the newest valid one (or ""
// when there is none, with the skipped ones logged), a path must verify, and "" (a fresh run)
// refuses a root that already holds checkpoints. Returns the directory to resume from, or "".
std::string resolve_resume(const std::string& root, const std::string& resume);

}  // namespace zaya
