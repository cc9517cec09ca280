// The sharded checkpoint layout. See sharded.h.
#include "ckpt/sharded.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "io/atomic.h"
#include "io/safetensors.h"

namespace zaya {

namespace fs = std::filesystem;
using nlohmann::json;

std::string state_file_rel(int rank, int world) {
  return fmt::format("{}/rank-{:05d}-of-{:05d}.safetensors", kCheckpointStateDir, rank, world);
}

std::string model_file_rel(int rank, int world) {
  return fmt::format("{}/{}", kCheckpointModelDir,
                     shard_file_name(size_t(rank) + 1, size_t(world)));
}

uint64_t contribution_bytes(const RankContribution& c) {
  uint64_t n = 0;
  for (const WeightSource& w : c.weights) n += uint64_t(shape_numel(w.shape)) * sizeof(float);
  for (const NamedState& s : c.state) n += s.tensor.nbytes();
  return n;
}

std::vector<StreamFile> rank_checkpoint_files(const std::string& dir, const RankContribution& c) {
  ZAYA_CHECK(c.world >= 1 && c.rank >= 0 && c.rank < c.world,
             "checkpoint: rank {} of a world of {}", c.rank, c.world);
  for (const char* sub : {kCheckpointModelDir, kCheckpointStateDir}) {
    std::error_code ec;
    fs::create_directories(fs::path(dir) / sub, ec);
    if (ec) fail("cannot create {}/{}: {}", dir, sub, ec.message());
  }
  std::vector<StreamFile> out;
  // The weight shard: fp32 tensors in the given order.
  if (!c.weights.empty()) {
    StreamFile f;
    f.rel = model_file_rel(c.rank, c.world);
    f.path = dir + "/" + f.rel;
    std::vector<TensorSpec> specs;
    for (const WeightSource& w : c.weights) {
      specs.push_back({w.name, DType::F32, w.shape});
      f.sources.push_back({w.data, size_t(shape_numel(w.shape)) * sizeof(float)});
    }
    f.prefix = safetensors_header(specs, {{"format", "pt"}}, f.path);
    out.push_back(std::move(f));
  }
  // The state shard: every piece with its place in the global tensor.
  {
    StreamFile f;
    f.rel = state_file_rel(c.rank, c.world);
    f.path = dir + "/" + f.rel;
    std::vector<TensorSpec> specs;
    json pieces = json::object();
    for (const NamedState& s : c.state) {
      // Host memory, or GPU memory the staging copy reads (a GPU step's state).
      ZAYA_CHECK(s.tensor.dtype() == DType::F32 && s.tensor.is_contiguous(),
                 "checkpoint: state '{}' must be a contiguous fp32 tensor", s.name);
      specs.push_back({s.name, DType::F32, s.tensor.shape()});
      f.sources.push_back({s.tensor.raw(), s.tensor.nbytes()});
      pieces[s.name] = {{"global_shape", s.global_shape}, {"offset", s.offset}};
    }
    f.prefix = safetensors_header(specs,
                                  {{"format", "zaya-state"},
                                   {kStatePiecesKey, pieces.dump()},
                                   {"zaya.rank", std::to_string(c.rank)},
                                   {"zaya.world", std::to_string(c.world)}},
                                  f.path);
    out.push_back(std::move(f));
  }
  if (c.rank == 0) {
    // The index of the weight shards, as `transformers` reads it.
    std::map<std::string, std::string> map;
    uint64_t total = 0;
    for (const WeightPlacement& p : c.placements) {
      map[p.name] = fs::path(model_file_rel(p.rank, c.world)).filename().string();
      total += uint64_t(shape_numel(p.shape)) * sizeof(float);
    }
    const auto text = [&](std::string rel, std::string body) {
      StreamFile f;
      f.rel = std::move(rel);
      f.path = dir + "/" + f.rel;
      f.prefix = std::move(body);
      out.push_back(std::move(f));
    };
    text(std::string(kCheckpointModelDir) + "/" + kSafetensorsIndexName,
         shard_index_json(map, total));
    text(std::string(kCheckpointModelDir) + "/config.json", c.config_json);
    text(kCheckpointTrainerFile, c.trainer_json);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

ShardedState::~ShardedState() = default;

std::unique_ptr<ShardedState> ShardedState::open(const std::string& dir, const Manifest& manifest,
                                                 bool verify) {
  std::unique_ptr<ShardedState> s(new ShardedState());
  s->dir_ = dir;
  s->verify_ = verify;
  const std::string state_prefix = std::string(kCheckpointStateDir) + "/";
  for (const ManifestEntry& e : manifest.files)
    if ((e.path.rfind(state_prefix, 0) == 0 && e.path.size() > 12 &&
         e.path.substr(e.path.size() - 12) == ".safetensors") ||
        e.path == kCheckpointLegacyState) {
      s->files_.push_back(e.path);
      s->entries_.push_back(e);
    }
  ZAYA_CHECK(!s->files_.empty(), "{}: the manifest lists no state files ({}*.safetensors)", dir,
             state_prefix);
  const bool legacy = s->files_.size() == 1 && s->files_[0] == kCheckpointLegacyState;
  s->open_.resize(s->files_.size());
  s->verified_.assign(s->files_.size(), false);
  int world = -1;
  for (size_t i = 0; i < s->files_.size(); i++) {
    const std::string path = dir + "/" + s->files_[i];
    auto f = SafetensorsFile::open(path);
    s->open_[i] = f;
    json pieces = json::object();
    if (!legacy) {
      const auto& md = f->metadata();
      auto it = md.find(kStatePiecesKey);
      ZAYA_CHECK(it != md.end(), "{}: no \"{}\" in its metadata (not a zaya state file)", path,
                 kStatePiecesKey);
      pieces = parse_json(it->second, path + " metadata " + kStatePiecesKey);
      ZAYA_CHECK(pieces.is_object(), "{}: metadata {} is not a JSON object", path, kStatePiecesKey);
      auto w = md.find("zaya.world");
      ZAYA_CHECK(w != md.end(), "{}: no \"zaya.world\" in its metadata", path);
      const int64_t fw = json_int64(parse_json(w->second, path), path + " metadata zaya.world");
      ZAYA_CHECK(world < 0 || fw == world, "{}: written by a world of {}, the others by {}", path,
                 fw, world);
      world = int(fw);
      auto r = md.find("zaya.rank");
      ZAYA_CHECK(r != md.end(), "{}: no \"zaya.rank\" in its metadata", path);
      const int64_t fr = json_int64(parse_json(r->second, path), path + " metadata zaya.rank");
      ZAYA_CHECK(fr >= 0 && fr < fw, "{}: zaya.rank {} in a world of {}", path, fr, fw);
      s->ranks_.push_back(int(fr));
    } else {
      s->ranks_.push_back(0);
    }
    for (const TensorInfo& ti : f->tensors()) {
      ZAYA_CHECK(ti.dtype == DType::F32, "{}: state '{}' is {}, expected F32", path, ti.name,
                 dtype_name(ti.dtype));
      Piece p;
      p.file = i;
      p.shape = ti.shape;
      Shape global = ti.shape;
      p.offset.assign(ti.shape.size(), 0);
      if (!legacy) {
        ZAYA_CHECK(pieces.contains(ti.name), "{}: tensor '{}' has no entry in {}", path, ti.name,
                   kStatePiecesKey);
        const json& pj = pieces[ti.name];
        const std::string where = fmt::format("{}: {} of '{}'", path, kStatePiecesKey, ti.name);
        ZAYA_CHECK(pj.is_object() && pj.contains("global_shape") && pj.contains("offset") &&
                       pj["global_shape"].is_array() && pj["offset"].is_array(),
                   "{}: expected {{\"global_shape\": [...], \"offset\": [...]}}", where);
        global.clear();
        p.offset.clear();
        for (const json& v : pj["global_shape"]) global.push_back(json_int64(v, where));
        for (const json& v : pj["offset"]) p.offset.push_back(json_int64(v, where));
        ZAYA_CHECK(global.size() == ti.shape.size() && p.offset.size() == ti.shape.size(),
                   "{}: a piece of shape {} cannot sit at {} in {}", where, shape_str(ti.shape),
                   shape_str(p.offset), shape_str(global));
        for (size_t d = 0; d < global.size(); d++)
          ZAYA_CHECK(p.offset[d] >= 0 && global[d] >= 0 && p.offset[d] + ti.shape[d] <= global[d],
                     "{}: the piece of shape {} at {} is outside the global shape {}", where,
                     shape_str(ti.shape), shape_str(p.offset), shape_str(global));
      }
      Entry& e = s->by_name_[ti.name];
      if (e.pieces.empty()) e.global = global;
      ZAYA_CHECK(e.global == global, "{}: '{}' has global shape {} here and {} in {}", path,
                 ti.name, shape_str(global), shape_str(e.global), s->files_[e.pieces[0].file]);
      e.pieces.push_back(std::move(p));
    }
  }
  s->writer_world_ = legacy ? 1 : world;
  // Every name's pieces tile its global tensor: inside it (checked above), pairwise disjoint, and
  // together as many elements as it has.
  for (auto& [name, e] : s->by_name_) {
    int64_t sum = 0;
    for (size_t a = 0; a < e.pieces.size(); a++) {
      sum += shape_numel(e.pieces[a].shape);
      for (size_t b = 0; b < a; b++) {
        bool overlap = true;
        for (size_t d = 0; d < e.global.size(); d++) {
          const Piece &x = e.pieces[a], &y = e.pieces[b];
          if (std::max(x.offset[d], y.offset[d]) >=
              std::min(x.offset[d] + x.shape[d], y.offset[d] + y.shape[d]))
            overlap = false;
        }
        ZAYA_CHECK(!overlap || shape_numel(e.pieces[a].shape) == 0,
                   "{}: pieces of '{}' in {} and {} overlap", dir, name,
                   s->files_[e.pieces[a].file], s->files_[e.pieces[b].file]);
      }
    }
    ZAYA_CHECK(sum == shape_numel(e.global),
               "{}: the pieces of '{}' cover {} of its {} elements (a rank file is missing?)", dir,
               name, sum, shape_numel(e.global));
  }
  return s;
}

std::vector<std::string> ShardedState::names() const {
  std::vector<std::string> out;
  for (const auto& kv : by_name_) out.push_back(kv.first);
  return out;
}

bool ShardedState::has(const std::string& name) const {
  return by_name_.count(name) != 0;
}

const Shape& ShardedState::global_shape(const std::string& name) const {
  auto it = by_name_.find(name);
  ZAYA_CHECK(it != by_name_.end(), "{}: the checkpoint has no state '{}'", dir_, name);
  return it->second.global;
}

const std::vector<ShardedState::Piece>& ShardedState::pieces(const std::string& name) const {
  auto it = by_name_.find(name);
  ZAYA_CHECK(it != by_name_.end(), "{}: the checkpoint has no state '{}'", dir_, name);
  return it->second.pieces;
}

const SafetensorsFile& ShardedState::file(size_t i) const {
  if (verify_ && !verified_[i]) {
    const std::string path = dir_ + "/" + files_[i];
    const ManifestEntry& e = entries_[i];
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    ZAYA_CHECK(!ec, "{}: missing ({})", path, ec.message());
    ZAYA_CHECK(size == e.size, "{}: size {} expected {} (the manifest's)", path, size, e.size);
    const uint64_t h = xxh64_file(path);
    ZAYA_CHECK(h == e.xxh64, "{}: checksum {} expected {} (the manifest's): the file is corrupt",
               path, hex64(h), hex64(e.xxh64));
    verified_[i] = true;
    verified_bytes_ += size;
  }
  return *open_[i];
}

Tensor ShardedState::read(const std::string& name, const std::vector<int64_t>& offset,
                          const Shape& shape) const {
  const Shape& g = global_shape(name);
  ZAYA_CHECK(offset.size() == g.size() && shape.size() == g.size(),
             "{}: state '{}' has {} dimensions; a box of {} was asked for", dir_, name, g.size(),
             shape.size());
  for (size_t d = 0; d < g.size(); d++)
    ZAYA_CHECK(offset[d] >= 0 && shape[d] >= 0 && offset[d] + shape[d] <= g[d],
               "{}: state '{}': the box at {} of shape {} is outside its shape {}", dir_, name,
               shape_str(offset), shape_str(shape), shape_str(g));
  Tensor out = Tensor::zeros(shape);
  int64_t copied = 0;
  for (const Piece& p : pieces(name)) {
    // Only files with a part of the box are touched (and verified).
    bool touches = true;
    for (size_t d = 0; d < g.size(); d++)
      if (std::max(p.offset[d], offset[d]) >=
          std::min(p.offset[d] + p.shape[d], offset[d] + shape[d]))
        touches = false;
    if (!touches) continue;
    const Tensor piece = file(p.file).get(name);
    copied += copy_box_overlap(piece, p.offset, out, offset);
  }
  ZAYA_ASSERT(copied == shape_numel(shape));
  return out;
}

uint64_t verify_checkpoint_files(const std::string& dir, const Manifest& manifest,
                                 const std::string& prefix) {
  uint64_t bytes = 0;
  for (const ManifestEntry& e : manifest.files) {
    if (e.path.rfind(prefix, 0) != 0) continue;
    const std::string path = dir + "/" + e.path;
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    ZAYA_CHECK(!ec, "{}: missing ({})", path, ec.message());
    ZAYA_CHECK(size == e.size, "{}: size {} expected {} (the manifest's)", path, size, e.size);
    const uint64_t h = xxh64_file(path);
    ZAYA_CHECK(h == e.xxh64, "{}: checksum {} expected {} (the manifest's): the file is corrupt",
               path, hex64(h), hex64(e.xxh64));
    bytes += size;
  }
  return bytes;
}

}  // namespace zaya
