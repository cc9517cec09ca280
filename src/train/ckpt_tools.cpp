// Offline checkpoint tools over the run config. See ckpt_tools.h.
#include "train/ckpt_tools.h"

#include <filesystem>
#include <set>

#include "ckpt/checkpoint.h"
#include "ckpt/model_io.h"
#include "ckpt/sharded.h"
#include "core/error.h"
#include "core/json.h"
#include "dist/zero1.h"
#include "engine/data_parallel_step.h"
#include "io/atomic.h"
#include "io/manifest.h"
#include "train/run_config.h"

namespace zaya {

namespace fs = std::filesystem;

namespace {

constexpr size_t kRingBytes = size_t(64) << 20;  // the writer's staging ring
constexpr int64_t kMaxRanks = 99999;             // rank-XXXXX-of-XXXXX file names

TrainerState read_trainer(const std::string& dir) {
  const std::string tj = dir + "/" + kCheckpointTrainerFile;
  return TrainerState::from_json(parse_json(read_file(tj), tj), tj);
}

// The run config stored in trainer.json. model.config is replaced by a preset: the checkpoint
// carries its own model config (model/config.json), and the file the run named may be gone.
RunConfig stored_run_config(const std::string& dir, const TrainerState& ts) {
  const std::string where = dir + "/" + kCheckpointTrainerFile + " (its \"config\")";
  ZAYA_CHECK(!ts.config_toml.empty(), "{}: no run config stored", where);
  return RunConfig::from_toml(ts.config_toml, where, {"--model.config=tiny"});
}

}  // namespace

ReshardResult reshard_checkpoint(const std::string& src, const std::string& out,
                                 const ReshardOptions& options) {
  const int64_t M = options.ranks;
  ZAYA_CHECK(M >= 1 && M <= kMaxRanks, "--ranks {}: expected a number of ranks from 1 to {}", M,
             kMaxRanks);
  check_output_dir(src, out, options.force);
  const ManifestCheck check = check_checkpoint(src, /*check_hashes=*/true);
  ZAYA_CHECK(check.ok, "{}: not a valid checkpoint: {}", src, check.reason);
  TrainerState ts = read_trainer(src);
  {
    // check_checkpoint refuses a step-* directory that holds another step's checkpoint.
    const std::string name = fs::path(out).lexically_normal().filename().string();
    ZAYA_CHECK(name.rfind("step-", 0) != 0 || name == checkpoint_dir_name(ts.step),
               "--out {}: a directory named step-* must hold that step; this checkpoint is of step "
               "{} ({})",
               out, ts.step, checkpoint_dir_name(ts.step));
  }
  const RunConfig rc = stored_run_config(src, ts);
  for (size_t i = 0; i < rc.phases.size(); i++) {
    const auto& b = rc.phases[i].batch_size;
    ZAYA_CHECK(!b || *b % M == 0,
               "--ranks {}: the run's phase.{}.batch_size = {} global sequences per step cannot be "
               "split over {} ranks, so the run could not resume at that size",
               M, i, b.value_or(0), M);
  }

  ZayaModel model = load_model(src + "/" + kCheckpointModelDir);
  const auto state = ShardedState::open(src, check.manifest, /*verify=*/false);
  const std::vector<Zero1Item> items = zero1_items(model, rc.optim.optimizer_settings());
  const Zero1Plan plan = plan_zero1(items, int(M), 1, /*split_slices=*/true);
  const std::vector<int> writers = weight_writers(plan);
  // The weights as the writer reads them: fp32 and contiguous (the checkpoint's are, as views of
  // the mapped files).
  std::vector<Tensor> weights;
  for (auto& [name, t] : model.tensor_slots())
    weights.push_back(t->dtype() == DType::F32 && t->is_contiguous() ? *t : t->to(DType::F32));
  // The source's state must be exactly the items' state and the balancing state.
  std::set<std::string> known;
  for (const Zero1Item& it : items)
    for (const std::string& nm : state_names(it)) {
      ZAYA_CHECK(state->has(nm), "{}: the state has no '{}' (for '{}' under the run's optimizer)",
                 src, nm, it.name);
      ZAYA_CHECK(state->global_shape(nm) == it.shape, "{}: state '{}' has shape {}, expected {}",
                 src, nm, shape_str(state->global_shape(nm)), shape_str(it.shape));
      known.insert(nm);
    }
  std::vector<std::string> balance;
  for (const std::string& n : state->names()) {
    if (n.rfind("balance.", 0) == 0)
      balance.push_back(n);
    else
      ZAYA_CHECK(known.count(n), "{}: state '{}' belongs to no tensor of the model", src, n);
  }

  ReshardResult r;
  r.step = ts.step;
  r.from_world = ts.world;
  r.to_world = M;
  r.save_id = Checkpointer::new_save_id(ts.step);
  TrainerState nt = ts;
  nt.world = M;
  nt.save_id = r.save_id;

  AtomicDirCommit commit(out);
  AsyncWriter writer(kRingBytes);
  std::vector<ManifestEntry> entries;
  for (int rank = 0; rank < int(M); rank++) {
    RankContribution c;
    c.rank = rank;
    c.world = int(M);
    for (size_t i = 0; i < items.size(); i++)
      if (writers[i] == rank)
        c.weights.push_back(
            {items[i].name, items[i].shape, static_cast<const float*>(weights[i].raw())});
    for (const OwnedStatePiece& p : owned_state_pieces(plan, items, rank))
      c.state.push_back(
          {p.name, state->read(p.name, p.offset, p.shape), items[p.item].shape, p.offset});
    if (rank == 0) {
      for (const std::string& n : balance) {
        const Shape& g = state->global_shape(n);
        c.state.push_back({n, state->read_whole(n), g, std::vector<int64_t>(g.size(), 0)});
      }
      for (size_t i = 0; i < items.size(); i++)
        c.placements.push_back({items[i].name, items[i].shape, writers[i]});
      c.config_json = read_file(src + "/" + kCheckpointModelDir + "/config.json");
      c.trainer_json = nt.to_file_text();
    }
    writer.submit(rank_checkpoint_files(commit.staging(), c));
    for (const WrittenFile& f : writer.wait()) {
      entries.push_back({f.rel, f.size, f.xxh64});
      r.bytes += f.size;
      r.files.push_back(f);
    }
  }
  nlohmann::json extra = checkpoint_manifest_extra(ts.step, M, r.save_id);
  extra["resharded_from"] = {{"world", ts.world}, {"save_id", ts.save_id}};
  write_manifest_entries(commit.staging(), std::move(entries), extra);
  commit.commit(options.force ? AtomicDirCommit::IfExists::Replace
                              : AtomicDirCommit::IfExists::Fail);
  r.dir = commit.final_dir();
  return r;
}

std::string checkpoint_tokenizer(const std::string& dir, std::string* why) {
  const TrainerState ts = read_trainer(dir);
  const std::string t = stored_run_config(dir, ts).data.tokenizer;
  std::error_code ec;
  if (t == "bytes" || fs::exists(t, ec)) return t;
  if (why) *why = fmt::format("the run's data.tokenizer {} no longer exists", t);
  return "";
}

}  // namespace zaya
