// Training checkpoints. See checkpoint.h.
#include "ckpt/checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "ckpt/model_io.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "io/atomic.h"
#include "io/manifest.h"
#include "io/safetensors.h"

namespace zaya {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The step-* directories under root, oldest first (the names sort by step).
std::vector<std::string> step_dirs(const std::string& root) {
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

}  // namespace

json TrainerState::to_json() const {
  return {{"step", step},
          {"tokens", tokens},
          {"phase", phase},
          {"skipped_steps", skipped_steps},
          {"optimizer_steps", optimizer_steps},
          {"balancing_steps", balancing_steps},
          {"data_cursor", data_cursor},
          {"config", config_toml}};
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
  try {
    t.data_cursor = j.at("data_cursor");
    t.config_toml = j.value("config", std::string());
  } catch (const json::exception& e) {
    fail("{}: {}", where, e.what());
  }
  return t;
}

std::string checkpoint_dir_name(int64_t step) {
  return fmt::format("step-{:08d}", step);
}

std::string save_checkpoint(const std::string& root, const ZayaModel& model,
                            const std::vector<NamedState>& state, const TrainerState& trainer,
                            int64_t keep_last) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& s : state) {
    // One process holds every tensor whole; slices come with sharded checkpoints.
    ZAYA_CHECK(s.is_whole(), "checkpoint: state '{}' is a slice of a {} tensor", s.name,
               shape_str(s.global_shape));
    tensors.emplace_back(s.name, s.tensor);
  }
  fs::create_directories(root);
  const std::string final_dir = root + "/" + checkpoint_dir_name(trainer.step);
  AtomicDirCommit commit(final_dir);
  const std::string s = commit.staging();
  save_model(model, s + "/model", DType::F32);
  save_safetensors(s + "/optimizer.safetensors", tensors);
  write_file_atomic(s + "/trainer.json", trainer.to_json().dump(1) + "\n");
  write_manifest(s, {{"step", trainer.step}, {"kind", "zaya-train"}});
  commit.commit(AtomicDirCommit::IfExists::Replace);
  // Keep the newest keep_last checkpoints (the one just written among them).
  const auto all = step_dirs(root);
  const int64_t keep = std::max<int64_t>(1, keep_last);
  for (int64_t i = 0; i + keep < int64_t(all.size()); i++) fs::remove_all(all[size_t(i)]);
  return final_dir;
}

LoadedCheckpoint load_checkpoint(const std::string& dir) {
  LoadedCheckpoint c;
  c.model = load_model_f32(dir + "/model");  // training writes the weights in place
  auto f = SafetensorsFile::open(dir + "/optimizer.safetensors");
  for (auto& ti : f->tensors()) c.state.emplace_back(ti.name, f->get(ti.name));
  const std::string tj_path = dir + "/trainer.json";
  c.trainer = TrainerState::from_json(parse_json(read_file(tj_path), tj_path), tj_path);
  return c;
}

std::string find_resumable_checkpoint(const std::string& root, std::vector<std::string>* skipped) {
  auto dirs = step_dirs(root);
  std::reverse(dirs.begin(), dirs.end());
  for (auto& d : dirs) {
    ManifestCheck c = verify_manifest(d);
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
    ManifestCheck c = verify_manifest(resume);
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
