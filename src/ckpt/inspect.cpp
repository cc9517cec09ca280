// Inspecting and verifying training checkpoints. See inspect.h.
#include "ckpt/inspect.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "ckpt/model_io.h"
#include "ckpt/sharded.h"
#include "core/error.h"
#include "core/json.h"
#include "io/atomic.h"
#include "io/safetensors.h"

namespace zaya {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string digest_of(const Tensor& t) {
  const Tensor f = t.dtype() == DType::F32 && t.is_contiguous() ? t : t.to(DType::F32);
  return hex64(xxh64_bytes(f.raw(), f.nbytes()));
}

std::string mib(uint64_t bytes) {
  return fmt::format("{:.2f} MiB", double(bytes) / double(1 << 20));
}

std::string rel_to(const std::string& path, const std::string& dir) {
  return fs::path(path).lexically_relative(dir).generic_string();
}

}  // namespace

CheckpointSummary inspect_checkpoint(const std::string& path, bool digests) {
  // One spelling of the directory, so the file names below are relative to it.
  fs::path norm = fs::path(path).lexically_normal();
  if (!norm.has_filename() && norm.has_parent_path()) norm = norm.parent_path();
  const std::string dir = norm.string();
  CheckpointSummary s;
  s.dir = dir;
  s.digests = digests;
  const Manifest manifest = read_manifest(dir);
  s.files = manifest.files;
  s.manifest_extra = manifest.extra;
  const std::string tj_path = dir + "/" + kCheckpointTrainerFile;
  s.trainer = TrainerState::from_json(parse_json(read_file(tj_path), tj_path), tj_path);
  const std::string model_dir = dir + "/" + kCheckpointModelDir;
  // The bytes digested are the manifest's: the model files are checked first, the state files
  // when a read first touches them.
  if (digests) verify_checkpoint_files(dir, manifest, std::string(kCheckpointModelDir) + "/");
  const std::string cfg_path = model_dir + "/config.json";
  s.config = ZayaConfig::from_json(parse_json(read_file(cfg_path), cfg_path), cfg_path);
  const auto store = TensorStore::open(model_dir);
  std::map<std::string, size_t> shard_of;
  for (const std::string& name : store->names()) {
    const TensorInfo& ti = store->info(name);
    CheckpointSummary::Weight w;
    w.name = name;
    w.file = rel_to(store->file_of(name), dir);
    w.shape = ti.shape;
    w.dtype = ti.dtype;
    if (digests) w.digest = digest_of(store->get(name));
    const uint64_t bytes = ti.end - ti.begin;
    s.params += shape_numel(ti.shape);
    s.weight_bytes += bytes;
    auto [it, fresh] = shard_of.emplace(w.file, s.shards.size());
    if (fresh) s.shards.push_back({w.file, 0, 0});
    s.shards[it->second].tensors++;
    s.shards[it->second].bytes += bytes;
    s.weights.push_back(std::move(w));
  }
  std::sort(s.shards.begin(), s.shards.end(),
            [](const auto& a, const auto& b) { return a.file < b.file; });
  const auto state = ShardedState::open(dir, manifest, /*verify=*/digests);
  s.state_world = state->writer_world();
  s.state_files = state->files();
  for (const std::string& name : state->names()) {
    CheckpointSummary::State t;
    t.name = name;
    t.global_shape = state->global_shape(name);
    std::set<int> ranks;
    for (const ShardedState::Piece& p : state->pieces(name)) {
      t.pieces++;
      ranks.insert(state->file_rank(p.file));
    }
    t.ranks.assign(ranks.begin(), ranks.end());
    if (digests) t.digest = digest_of(state->read_whole(name));
    s.state.push_back(std::move(t));
  }
  return s;
}

json CheckpointSummary::to_json() const {
  json files_j = json::array();
  uint64_t total = 0;
  for (const ManifestEntry& e : files) {
    files_j.push_back({{"path", e.path}, {"size", e.size}});
    total += e.size;
  }
  json shards_j = json::array();
  for (const Shard& sh : shards)
    shards_j.push_back({{"file", sh.file}, {"tensors", sh.tensors}, {"bytes", sh.bytes}});
  json state_j = json::array();
  for (const State& t : state)
    state_j.push_back({{"name", t.name},
                       {"global_shape", t.global_shape},
                       {"pieces", t.pieces},
                       {"ranks", t.ranks}});
  json j = {{"dir", dir},
            {"step", trainer.step},
            {"tokens", trainer.tokens},
            {"phase", trainer.phase},
            {"optimizer_steps", trainer.optimizer_steps},
            {"balancing_steps", trainer.balancing_steps},
            {"skipped_steps", trainer.skipped_steps},
            {"world", trainer.world},
            {"save_id", trainer.save_id},
            {"manifest_extra", manifest_extra},
            {"files", files_j},
            {"total_bytes", total},
            {"model",
             {{"layers", config.num_hidden_layers},
              {"hidden_size", config.hidden_size},
              {"experts", config.num_experts},
              {"vocab_size", config.vocab_size},
              {"tensors", weights.size()},
              {"params", params},
              {"weight_bytes", weight_bytes},
              {"shards", shards_j}}},
            {"state", {{"world", state_world}, {"files", state_files}, {"tensors", state_j}}}};
  if (digests) {
    json d = json::object();
    for (const Weight& w : weights) d[w.name] = w.digest;
    for (const State& t : state) d[t.name] = t.digest;
    j["digests"] = d;
  }
  return j;
}

std::string CheckpointSummary::to_text() const {
  std::string o;
  o += fmt::format("checkpoint {}\n", dir);
  o += fmt::format(
      "  step {}, {} tokens, phase {}, {} optimizer steps, {} balancing steps, {} skipped\n",
      trainer.step, trainer.tokens, trainer.phase, trainer.optimizer_steps, trainer.balancing_steps,
      trainer.skipped_steps);
  o += fmt::format("  written by {} rank{}, save id {}\n", trainer.world,
                   trainer.world == 1 ? "" : "s",
                   trainer.save_id.empty() ? "(none)" : trainer.save_id);
  uint64_t total = 0;
  size_t width = 0;
  for (const ManifestEntry& e : files) {
    total += e.size;
    width = std::max(width, e.path.size());
  }
  o += fmt::format("files: {} in the manifest, {} ({} bytes)\n", files.size(), mib(total), total);
  for (const ManifestEntry& e : files)
    o += fmt::format("  {:<{}}  {:>12} bytes\n", e.path, width, e.size);
  o += fmt::format(
      "model: {} layers, hidden {}, {} experts, vocab {}; {} tensors, {} parameters, {} of "
      "weights in {} shard{}\n",
      config.num_hidden_layers, config.hidden_size, config.num_experts, config.vocab_size,
      weights.size(), params, mib(weight_bytes), shards.size(), shards.size() == 1 ? "" : "s");
  for (const Shard& sh : shards)
    o += fmt::format("  {:<{}}  {:>4} tensors  {}\n", sh.file, width, sh.tensors, mib(sh.bytes));
  o += fmt::format("state: {} tensors in {} file{} (written by {} rank{})\n", state.size(),
                   state_files.size(), state_files.size() == 1 ? "" : "s", state_world,
                   state_world == 1 ? "" : "s");
  size_t nw = 0;
  for (const State& t : state) nw = std::max(nw, t.name.size());
  for (const State& t : state)
    o += fmt::format("  {:<{}}  {:<16}  {} piece{}, rank{} {}\n", t.name, nw,
                     shape_str(t.global_shape), t.pieces, t.pieces == 1 ? "" : "s",
                     t.ranks.size() == 1 ? "" : "s", fmt::join(t.ranks, ","));
  if (digests) {
    o += "digests (XXH64 of each global tensor's fp32 bytes, row-major):\n";
    for (const Weight& w : weights) o += fmt::format("  {}  {}\n", w.digest, w.name);
    for (const State& t : state) o += fmt::format("  {}  {}\n", t.digest, t.name);
  }
  return o;
}

CheckpointVerdict verify_checkpoint(const std::string& dir, bool check_hashes) {
  CheckpointVerdict v;
  v.dir = dir;
  const ManifestCheck c = check_checkpoint(dir, check_hashes);
  if (!c.ok) {
    v.problems = c.problems.empty() ? std::vector<std::string>{c.reason} : c.problems;
    return v;
  }
  // The bytes are the manifest's; the structure is then what the writers made of it.
  try {
    ShardedState::open(dir, c.manifest, /*verify=*/false);
  } catch (const Error& e) {
    v.problems.push_back(e.what());
  }
  try {
    load_model(dir + "/" + kCheckpointModelDir);
  } catch (const Error& e) {
    v.problems.push_back(e.what());
  }
  v.ok = v.problems.empty();
  return v;
}

CheckpointPath classify_checkpoint_path(const std::string& path) {
  std::error_code ec;
  ZAYA_CHECK(fs::is_directory(path, ec), "{}: no such directory", path);
  const fs::path p(path);
  if (fs::exists(p / kManifestName, ec) || fs::exists(p / kCheckpointTrainerFile, ec) ||
      fs::is_directory(p / kCheckpointStateDir, ec))
    return {CheckpointPath::Kind::Checkpoint, path};
  if (!checkpoint_dirs(path).empty()) return {CheckpointPath::Kind::Root, path};
  const std::string sub = (p / "checkpoints").string();
  if (!checkpoint_dirs(sub).empty()) return {CheckpointPath::Kind::Root, sub};
  fail(
      "{}: not a checkpoint (no {}, {} or {}/) and no step-* checkpoints in it or in its "
      "checkpoints/",
      path, kManifestName, kCheckpointTrainerFile, kCheckpointStateDir);
}

std::string resolve_checkpoint_dir(const std::string& path) {
  const CheckpointPath p = classify_checkpoint_path(path);
  if (p.kind == CheckpointPath::Kind::Checkpoint) return p.path;
  std::vector<std::string> skipped;
  const std::string dir = find_resumable_checkpoint(p.path, &skipped);
  ZAYA_CHECK(!dir.empty(), "{}: no valid checkpoint among its step-* directories:\n  {}", p.path,
             fmt::join(skipped, "\n  "));
  return dir;
}

}  // namespace zaya
