// Training checkpoints. See checkpoint.h.
#include "ckpt/checkpoint.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include "ckpt/model_io.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "dist/comm.h"
#include "io/atomic.h"
#include "io/manifest.h"

namespace zaya {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kStagingPrefix = ".tmp-step-";

}  // namespace

std::vector<std::string> checkpoint_dirs(const std::string& root) {
  std::vector<std::string> dirs;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return dirs;
  fs::directory_iterator it(root, ec), end;
  if (ec) fail("cannot list checkpoint directory {}: {}", root, ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail("cannot list checkpoint directory {}: {}", root, ec.message());
    if (it->is_directory(ec) && it->path().filename().string().rfind("step-", 0) == 0)
      dirs.push_back(it->path().string());
  }
  if (ec) fail("cannot list checkpoint directory {}: {}", root, ec.message());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

json checkpoint_manifest_extra(int64_t step, int64_t world, const std::string& save_id) {
  return {{"step", step}, {"kind", "zaya-train"}, {"world", world}, {"save_id", save_id}};
}

json TrainerState::to_json() const {
  return {{"step", step},
          {"tokens", tokens},
          {"phase", phase},
          {"skipped_steps", skipped_steps},
          {"optimizer_steps", optimizer_steps},
          {"balancing_steps", balancing_steps},
          {"data_cursor", data_cursor},
          {"config", config_toml},
          {"world", world},
          {"save_id", save_id}};
}

std::string TrainerState::to_file_text() const {
  return to_json().dump(1) + "\n";
}

TrainerState TrainerState::from_json(const json& j, const std::string& where) {
  TrainerState t;
  ZAYA_CHECK(j.is_object(), "{}: expected a JSON object, found {}", where, json_show(j));
  // Integers are checked before conversion (nlohmann casts any number; 1e300 would be undefined
  // behaviour).
  const auto integer = [&](const char* key, int64_t* out, bool required) {
    auto it = j.find(key);
    if (it == j.end()) {
      ZAYA_CHECK(!required, "{}: missing field '{}'", where, key);
      return;
    }
    *out = json_int64(*it, fmt::format("{}: {}", where, key));
  };
  integer("step", &t.step, true);
  integer("tokens", &t.tokens, true);
  integer("phase", &t.phase, true);
  integer("skipped_steps", &t.skipped_steps, false);
  integer("optimizer_steps", &t.optimizer_steps, true);
  integer("balancing_steps", &t.balancing_steps, true);
  integer("world", &t.world, false);
  ZAYA_CHECK(t.world >= 1, "{}: world: expected an integer >= 1, found {}", where, t.world);
  try {
    t.data_cursor = j.at("data_cursor");
    t.config_toml = j.value("config", std::string());
    t.save_id = j.value("save_id", std::string());
  } catch (const json::exception& e) {
    fail("{}: {}", where, e.what());
  }
  return t;
}

std::string checkpoint_dir_name(int64_t step) {
  return fmt::format("step-{:08d}", step);
}

double SaveStats::percentile_ms(double p) const {
  if (blocking_ms.empty()) return 0;
  std::vector<double> v = blocking_ms;
  std::sort(v.begin(), v.end());
  // Nearest rank.
  const double r = std::ceil(p / 100.0 * double(v.size()));
  const size_t i = size_t(std::clamp(r, 1.0, double(v.size()))) - 1;
  return v[i];
}

// ---------------------------------------------------------------------------------------------

Checkpointer::Checkpointer(std::string root, int64_t keep_last, size_t staging_bytes,
                           StagingMemory mem, Communicator* comm, std::string tag)
    : root_(std::move(root)),
      keep_last_(std::max<int64_t>(1, keep_last)),
      comm_(comm),
      tag_(std::move(tag)),
      writer_(std::make_unique<AsyncWriter>(staging_bytes, mem)) {
  ZAYA_CHECK(!tag_.empty(), "checkpoint: empty job tag");
  const bool lead = !comm_ || comm_->rank() == 0;
  std::string err;
  if (lead) {
    // Staging directories of earlier jobs (interrupted saves) are never checkpoints.
    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec) err = fmt::format("cannot create {}: {}", root_, ec.message());
    fs::directory_iterator it(root_, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(kStagingPrefix, 0) == 0) {
        std::error_code rm;
        fs::remove_all(it->path(), rm);
        if (!rm) ZAYA_INFO("checkpoint: removed {} (an interrupted save)", it->path().string());
      }
    }
  }
  if (comm_) {
    const auto errs = comm_->host_all_gather(err);
    err = errs[0];
  }
  if (!err.empty()) fail("{}", err);
}

Checkpointer::~Checkpointer() = default;  // the writer waits for its thread

std::string Checkpointer::new_save_id(int64_t step) {
  std::random_device rd;
  const uint64_t parts[4] = {uint64_t(::getpid()),
                             uint64_t(std::chrono::system_clock::now().time_since_epoch().count()),
                             uint64_t(step), (uint64_t(rd()) << 32) ^ uint64_t(rd())};
  return hex64(xxh64_bytes(parts, sizeof(parts)));
}

std::string Checkpointer::staging_for(int64_t step) const {
  return root_ + "/" + kStagingPrefix + checkpoint_dir_name(step).substr(5) + "-" + tag_;
}

void Checkpointer::begin(int64_t step, const RankContribution& c, const std::string& save_id) {
  finish();
  step_ = step;
  save_id_ = save_id;
  const std::string staging = staging_for(step);
  std::error_code ec;
  fs::create_directories(staging, ec);
  if (ec) fail("cannot create the staging directory {}: {}", staging, ec.message());
  std::vector<StreamFile> files = rank_checkpoint_files(staging, c);
  writer_->submit(std::move(files));
  in_flight_ = true;
}

std::string Checkpointer::poll() {
  if (!in_flight_) return "";
  double st = writer_->done() ? 1.0 : 0.0;
  if (comm_) comm_->host_all_reduce(&st, 1, RedOp::Min);
  if (st == 0) return "";
  return commit();
}

std::string Checkpointer::finish() {
  if (!in_flight_) return "";
  return commit();
}

std::string Checkpointer::commit() {
  // Every rank's writer is done (or this waits for it).
  std::string err;
  std::vector<WrittenFile> files;
  try {
    files = writer_->wait();
  } catch (const Error& e) {
    err = e.what();
  }
  in_flight_ = false;
  stats_.write_s.push_back(writer_->last_write_seconds());
  stats_.bytes.push_back(writer_->last_bytes());
  const int rank = comm_ ? comm_->rank() : 0;
  const std::string final_dir = root_ + "/" + checkpoint_dir_name(step_);
  const std::string staging = staging_for(step_);
  json mine = {{"error", err}, {"host", comm_ ? comm_->host_name() : std::string()}};
  json list = json::array();
  for (const WrittenFile& f : files) list.push_back({f.rel, f.size, hex64(f.xxh64)});
  mine["files"] = list;
  std::vector<std::string> all =
      comm_ ? comm_->host_all_gather(mine.dump()) : std::vector<std::string>{mine.dump()};
  // The first rank whose writer failed names the reason for every rank.
  std::string failure;
  for (size_t r = 0; r < all.size() && failure.empty(); r++) {
    const json j = json::parse(all[r]);
    const std::string e = j["error"].get<std::string>();
    if (!e.empty())
      failure = comm_ ? fmt::format("rank {} ({}): {}", r, j["host"].get<std::string>(), e) : e;
  }
  std::string lead_err;
  if (rank == 0) {
    try {
      if (!failure.empty()) {
        std::error_code ec;
        fs::remove_all(staging, ec);
      } else {
        std::vector<ManifestEntry> entries;
        for (const std::string& s : all) {
          const json j = json::parse(s);
          for (const json& f : j["files"])
            entries.push_back({f[0].get<std::string>(), f[1].get<uint64_t>(),
                               std::stoull(f[2].get<std::string>(), nullptr, 16)});
        }
        write_manifest_entries(staging, std::move(entries),
                               checkpoint_manifest_extra(step_, int64_t(all.size()), save_id_));
        AtomicDirCommit commit(final_dir, tag_);
        commit.commit(AtomicDirCommit::IfExists::Replace);
        // Keep the newest keep_last checkpoints (the one just committed among them).
        const auto dirs = checkpoint_dirs(root_);
        for (int64_t i = 0; i + keep_last_ < int64_t(dirs.size()); i++)
          fs::remove_all(dirs[size_t(i)]);
      }
    } catch (const Error& e) {
      lead_err = e.what();
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
  }
  if (comm_) lead_err = comm_->host_all_gather(lead_err)[0];
  if (failure.empty() && !lead_err.empty())
    failure = comm_ ? fmt::format("rank 0 ({}): {}", comm_->host_name(), lead_err) : lead_err;
  if (!failure.empty())
    fail("checkpoint {} was not saved (the earlier checkpoints are intact): {}", final_dir,
         failure);
  return final_dir;
}

// ---------------------------------------------------------------------------------------------

LoadedCheckpoint load_checkpoint(const std::string& dir, bool verify) {
  LoadedCheckpoint c;
  c.manifest = read_manifest(dir);
  if (verify) {
    verify_checkpoint_files(dir, c.manifest, std::string(kCheckpointModelDir) + "/");
    verify_checkpoint_files(dir, c.manifest, kCheckpointTrainerFile);
  }
  // Training writes the weights in place: owned fp32 copies.
  c.model = load_model_f32(dir + "/" + kCheckpointModelDir);
  c.state = ShardedState::open(dir, c.manifest, verify);
  const std::string tj_path = dir + "/" + kCheckpointTrainerFile;
  c.trainer = TrainerState::from_json(parse_json(read_file(tj_path), tj_path), tj_path);
  return c;
}

ManifestCheck check_checkpoint(const std::string& dir, bool check_hashes) {
  ManifestCheck c = verify_manifest(dir, check_hashes);
  if (!c.ok) return c;
  const auto refuse = [&](std::string why) {
    c.ok = false;
    c.reason = why;
    c.problems.insert(c.problems.begin(), std::move(why));
  };
  for (const std::string need :
       {std::string(kCheckpointTrainerFile), std::string(kCheckpointModelDir) + "/config.json"})
    if (std::none_of(c.manifest.files.begin(), c.manifest.files.end(),
                     [&](const ManifestEntry& e) { return e.path == need; })) {
      refuse(fmt::format("{}: does not list {} (not a training checkpoint, or cut short)",
                         kManifestName, need));
      return c;
    }
  const std::string tj_path = dir + "/" + kCheckpointTrainerFile;
  TrainerState t;
  try {
    t = TrainerState::from_json(parse_json(read_file(tj_path), tj_path), tj_path);
  } catch (const Error& e) {
    refuse(e.what());
    return c;
  }
  const json& x = c.manifest.extra;
  const std::string name = fs::path(dir).lexically_normal().filename().string();
  if (x.contains("step") && (!x["step"].is_number_integer() || x["step"].get<int64_t>() != t.step))
    refuse(fmt::format(
        "{}: the manifest is of step {}, but trainer.json of step {} (a manifest from another "
        "checkpoint)",
        kManifestName, x["step"].dump(), t.step));
  else if (x.value("save_id", std::string()) != t.save_id)
    refuse(fmt::format(
        "{}: the manifest is of save {}, but trainer.json of save {} (a manifest from another "
        "checkpoint)",
        kManifestName, x.value("save_id", std::string("(none)")), t.save_id));
  else if (!name.empty() && name.rfind("step-", 0) == 0 && name != checkpoint_dir_name(t.step))
    refuse(fmt::format("{} holds the checkpoint of step {} (renamed?)", name, t.step));
  return c;
}

std::string find_resumable_checkpoint(const std::string& root, std::vector<std::string>* skipped) {
  auto dirs = checkpoint_dirs(root);
  std::reverse(dirs.begin(), dirs.end());
  for (auto& d : dirs) {
    ManifestCheck c = check_checkpoint(d);
    if (c.ok) return d;
    if (skipped) skipped->push_back(d + ": " + c.reason);
  }
  return "";
}

std::string resolve_resume(const std::string& root, const std::string& resume) {
  if (resume == "auto") {
    std::vector<std::string> skipped;
    std::string dir = find_resumable_checkpoint(root, &skipped);
    for (auto& s : skipped) ZAYA_WARN("resume: skipping {}", s);
    if (dir.empty()) ZAYA_INFO("resume auto: no valid checkpoint in {}, starting fresh", root);
    return dir;
  }
  if (!resume.empty()) {
    ManifestCheck c = check_checkpoint(resume);
    ZAYA_CHECK(c.ok, "cannot resume from {}: {}", resume, c.reason);
    return resume;
  }
  if (!find_resumable_checkpoint(root).empty())
    fail(
        "{} already holds checkpoints: pass --resume auto to continue that run, or choose another "
        "--out",
        root);
  return "";
}

}  // namespace zaya
