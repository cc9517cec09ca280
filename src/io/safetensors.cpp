// safetensors reader/writer and sharded TensorStore (see safetensors.h). The reader follows the
// reference implementation's rules (huggingface/safetensors, tensor.rs) and is stricter in two
// places, both documented in docs/CHECKPOINT_FORMAT.md: duplicate JSON keys and unknown fields
// of a tensor entry are errors (the reference silently keeps the last duplicate and ignores
// unknown fields; either is more likely a corrupt or foreign file than a valid one).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/json.h"
#include "io/atomic.h"

namespace zaya {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Returns the offset of the first byte that is not part of valid UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or npos when all of it is valid.
size_t first_invalid_utf8(const unsigned char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
      len = 2;
    else if (c == 0xe0)
      len = 3, lo = 0xa0;
    else if (c >= 0xe1 && c <= 0xec)
      len = 3;
    else if (c == 0xed)
      len = 3, hi = 0x9f;
    else if (c >= 0xee && c <= 0xef)
      len = 3;
    else if (c == 0xf0)
      len = 4, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3)
      len = 4;
    else if (c == 0xf4)
      len = 4, hi = 0x8f;
    else
      return i;
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
    i += len;
  }
  return std::string::npos;
}

const char* json_type(const json& j) {
  if (j.is_number_unsigned()) return "a non-negative integer";
  if (j.is_number_integer()) return "a negative integer";
  if (j.is_number_float()) return "a non-integer number";
  return j.type_name();
}

// Short rendering of a JSON value for error messages.
std::string show(const json& j) {
  std::string s = j.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Detects duplicate keys, which nlohmann::json (like most parsers) would silently collapse.
struct DuplicateKeyCheck {
  struct Level {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Level> stack;
  std::string error;

  bool operator()(int /*depth*/, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: stack.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        if (stack.empty()) break;
        std::string k = parsed.get<std::string>();
        if (!stack.back().keys.insert(k).second && error.empty()) {
          if (stack.size() == 1)
            error = fmt::format("duplicate tensor name '{}'", k);
          else
            error = fmt::format("'{}': duplicate field '{}'", stack[stack.size() - 2].last_key, k);
        }
        stack.back().last_key = k;
        break;
      }
      default: break;
    }
    return true;
  }
};

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

// A non-negative integer that fits in size_t, or an Error naming `what`.
size_t as_size(const json& j, const std::string& file, const std::string& what) {
  if (!j.is_number_unsigned())
    fail("{}: {}: expected a non-negative integer, found {} ({})", file, what, json_type(j),
         show(j));
  return j.get<uint64_t>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
SafetensorsFile::~SafetensorsFile() = default;

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open safetensors file {}: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  const size_t size = size_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail(
        "{}: file is {} bytes, shorter than the 8-byte header length that starts a safetensors "
        "file",
        path, size);
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED)
    fail("cannot map {} ({} bytes): {}", path, size, std::strerror(map_errno));
  // From here the mapping is owned by `whole`; tensors hold it through their Storage.
  auto whole = Storage::wrap(base, size, Device::CPU, /*read_only=*/true,
                             [size](void* p) { ::munmap(p, size); });
  const auto* bytes = static_cast<const unsigned char*>(base);

  const uint64_t n = read_u64_le(bytes);
  if (n > kSafetensorsMaxHeader)
    fail("{}: header length {} is larger than the {}-byte limit (not a safetensors file?)", path, n,
         kSafetensorsMaxHeader);
  if (n > size - 8)
    fail(
        "{}: header length {} runs past the end of the file ({} bytes, so at most {} bytes of "
        "header)",
        path, n, size, size - 8);
  const unsigned char* hdr = bytes + 8;
  if (size_t bad = first_invalid_utf8(hdr, n); bad != std::string::npos)
    fail("{}: header is not valid UTF-8 (byte {} of the header, 0x{:02x})", path, bad, hdr[bad]);
  if (n == 0 || hdr[0] != '{')
    fail("{}: header must be a JSON object starting with '{{', found {}", path,
         n == 0 ? std::string("an empty header") : fmt::format("'{}'", char(hdr[0])));

  DuplicateKeyCheck dup;
  const json root = parse_json(std::string_view(reinterpret_cast<const char*>(hdr), n),
                               path + ": header", std::ref(dup));
  if (!dup.error.empty()) fail("{}: header: {}", path, dup.error);
  if (!root.is_object()) fail("{}: header must be a JSON object, found {}", path, json_type(root));

  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = path;
  f->data_start_ = 8 + size_t(n);
  const size_t data_len = size - f->data_start_;

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      if (!v.is_object())
        fail("{}: __metadata__: expected an object of string values, found {}", path, json_type(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail("{}: __metadata__ key '{}': expected a string value, found {} ({})", path, m.key(),
               json_type(m.value()), show(m.value()));
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (!v.is_object())
      fail("{}: {}: expected an object with dtype, shape and data_offsets, found {}", path, where,
           json_type(v));
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        fail("{}: {}: unexpected field '{}' (expected only dtype, shape, data_offsets)", path,
             where, k.key());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) fail("{}: {}: missing field '{}'", path, where, field);

    TensorInfo ti;
    ti.name = name;
    const json& jd = v["dtype"];
    if (!jd.is_string())
      fail("{}: {}: dtype: expected a string, found {} ({})", path, where, json_type(jd), show(jd));
    if (!dtype_from_name(jd.get<std::string>(), &ti.dtype))
      fail(
          "{}: {}: unknown dtype \"{}\" (expected one of F64, F32, F16, BF16, I64, I32, U32, I16, "
          "U16, I8, U8, BOOL)",
          path, where, jd.get<std::string>());

    const json& js = v["shape"];
    if (!js.is_array())
      fail("{}: {}: shape: expected a list of non-negative integers, found {} ({})", path, where,
           json_type(js), show(js));
    // The product of the non-zero dimensions must fit too: strides are products of trailing
    // dimensions, so a zero in front would otherwise hide an overflow from this check.
    uint64_t nonzero = 1;
    bool overflow = false, empty = false;
    for (size_t d = 0; d < js.size(); d++) {
      if (!js[d].is_number_unsigned())
        fail("{}: {}: shape[{}]: expected a non-negative integer, found {} ({})", path, where, d,
             json_type(js[d]), show(js[d]));
      uint64_t dim = js[d].get<uint64_t>();
      if (dim > uint64_t(INT64_MAX)) overflow = true;
      ti.shape.push_back(int64_t(dim));
      empty |= dim == 0;
      if (dim != 0) overflow |= __builtin_mul_overflow(nonzero, dim, &nonzero);
    }
    uint64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(nonzero, uint64_t(dtype_size(ti.dtype)), &nbytes);
    overflow |= nbytes > uint64_t(INT64_MAX);
    if (empty) nbytes = 0;
    if (overflow)
      fail("{}: {}: shape {} of {} overflows 64-bit byte counts", path, where, show(js),
           dtype_name(ti.dtype));

    const json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      fail("{}: {}: data_offsets: expected [begin, end], two non-negative integers, found {}", path,
           where, show(jo));
    ti.begin = as_size(jo[0], path, where + ": data_offsets[0] (begin)");
    ti.end = as_size(jo[1], path, where + ": data_offsets[1] (end)");
    if (ti.begin > ti.end)
      fail("{}: {}: data_offsets [{}, {}]: begin is after end", path, where, ti.begin, ti.end);
    if (ti.end > data_len)
      fail("{}: {}: data_offsets [{}, {}] run past the end of the data section ({} bytes)", path,
           where, ti.begin, ti.end, data_len);
    if (ti.end - ti.begin != nbytes)
      fail("{}: {}: shape {} of {} needs {} bytes, but data_offsets [{}, {}] hold {} bytes", path,
           where, shape_str(ti.shape), dtype_name(ti.dtype), nbytes, ti.begin, ti.end,
           ti.end - ti.begin);
    f->tensors_.push_back(std::move(ti));
  }

  // The data section must be tiled exactly: sorted by offsets, each tensor starts where the
  // previous one ended, and the last one ends at the end of the file.
  std::sort(f->tensors_.begin(), f->tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  size_t expect = 0;
  for (size_t i = 0; i < f->tensors_.size(); i++) {
    const TensorInfo& t = f->tensors_[i];
    if (t.begin < expect)
      fail("{}: tensor '{}' at data_offsets [{}, {}] overlaps tensor '{}' at [{}, {}]", path,
           t.name, t.begin, t.end, f->tensors_[i - 1].name, f->tensors_[i - 1].begin,
           f->tensors_[i - 1].end);
    if (t.begin > expect)
      fail(
          "{}: bytes [{}, {}) of the data section belong to no tensor (a hole before tensor "
          "'{}'); the tensors must cover the data section contiguously",
          path, expect, t.begin, t.name);
    expect = t.end;
  }
  if (expect != data_len)
    fail(
        "{}: the tensors cover {} bytes of the data section, but the file holds {} bytes after "
        "the header ({} trailing bytes belong to no tensor)",
        path, expect, data_len, data_len - expect);

  for (size_t i = 0; i < f->tensors_.size(); i++) f->index_[f->tensors_[i].name] = i;
  f->data_ = std::move(whole);
  return f;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("{}: no tensor named '{}'", path_, name);
  return tensors_[it->second];
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const size_t off = data_start_ + ti.begin;
  const size_t es = dtype_size(ti.dtype);
  const char* p = static_cast<const char*>(data_->data()) + off;
  if (reinterpret_cast<uintptr_t>(p) % es == 0)
    return Tensor::from_storage(data_, off, ti.shape, ti.dtype);
  // Misaligned element access is undefined behaviour in C++ (and slow or faulting on some
  // targets), so such a tensor is copied once into aligned memory.
  const size_t n = ti.end - ti.begin;
  void* q = std::aligned_alloc(64, (std::max<size_t>(n, 1) + 63) / 64 * 64);
  if (!q) fail("{}: out of host memory copying misaligned tensor '{}' ({} bytes)", path_, name, n);
  std::memcpy(q, p, n);
  auto copy = Storage::wrap(q, n, Device::CPU, /*read_only=*/true, [](void* r) { std::free(r); });
  return Tensor::from_storage(copy, 0, ti.shape, ti.dtype);
}

// ---------------------------------------------------------------------------------------------
std::string safetensors_header(const std::vector<TensorSpec>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::string& what) {
  std::set<std::string> seen;
  nlohmann::ordered_json hdr = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = hdr["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  size_t offset = 0;
  for (const TensorSpec& t : tensors) {
    ZAYA_CHECK(t.name != "__metadata__",
               "writing {}: '__metadata__' is reserved and cannot name a tensor", what);
    ZAYA_CHECK(seen.insert(t.name).second, "writing {}: tensor name '{}' appears twice", what,
               t.name);
    const size_t bytes = size_t(shape_numel(t.shape)) * dtype_size(t.dtype);
    nlohmann::ordered_json e;
    e["dtype"] = std::string(dtype_name(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + bytes};
    offset += bytes;
    hdr[t.name] = std::move(e);
  }
  std::string text;
  try {
    text = hdr.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("writing {}: a tensor name or metadata string is not valid UTF-8 ({})", what, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[size_t(i)] = char(uint8_t(uint64_t(text.size()) >> (8 * i)));
  return out + text;
}

std::vector<size_t> safetensors_data_order(const std::vector<DType>& dtypes) {
  std::vector<size_t> order(dtypes.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(dtypes[a]) > dtype_size(dtypes[b]);
  });
  return order;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) {
    ZAYA_CHECK(t.defined(), "writing {}: tensor '{}' is undefined", path, name);
    ZAYA_CHECK(t.device() == Device::CPU,
               "writing {}: tensor '{}' is on a device; copy it to the host first", path, name);
  }
  std::vector<DType> dtypes;
  for (const auto& kv : tensors) dtypes.push_back(kv.second.dtype());
  const std::vector<size_t> order = safetensors_data_order(dtypes);
  std::vector<TensorSpec> specs;
  size_t data_bytes = 0;
  for (size_t i : order) {
    specs.push_back({tensors[i].first, tensors[i].second.dtype(), tensors[i].second.shape()});
    data_bytes += tensors[i].second.nbytes();
  }
  const std::string head = safetensors_header(specs, metadata, path);

  AtomicFileWriter w(path);
  w.write(head);
  for (size_t i : order) {
    const Tensor& t = tensors[i].second;
    if (t.numel() == 0) continue;
    if (t.is_contiguous()) {
      w.write(t.raw(), t.nbytes());
    } else {
      Tensor c = t.clone();
      w.write(c.raw(), c.nbytes());
    }
  }
  ZAYA_ASSERT(w.bytes_written() == head.size() + data_bytes);
  w.commit();
}

// ---------------------------------------------------------------------------------------------
std::shared_ptr<TensorStore> TensorStore::open(const std::string& path) {
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail("checkpoint {} does not exist", path);
  std::string index_path, single_path;
  if (fs::is_directory(st)) {
    fs::path d(path);
    if (fs::exists(d / kSafetensorsIndexName, ec))
      index_path = (d / kSafetensorsIndexName).string();
    else if (fs::exists(d / kSafetensorsSingleName, ec))
      single_path = (d / kSafetensorsSingleName).string();
    else
      fail("{}: no {} or {} in this directory", path, kSafetensorsIndexName,
           kSafetensorsSingleName);
  } else if (path.size() >= 11 && path.compare(path.size() - 11, 11, ".index.json") == 0) {
    index_path = path;
  } else {
    single_path = path;
  }

  auto s = std::make_shared<TensorStore>();
  s->path_ = path;
  if (!single_path.empty()) {
    s->files_.push_back(SafetensorsFile::open(single_path));
    for (const auto& t : s->files_[0]->tensors()) {
      s->where_[t.name] = 0;
      s->total_bytes_ += t.end - t.begin;
    }
  } else {
    const json idx = parse_json(read_file(index_path), index_path);
    if (!idx.is_object()) fail("{}: expected a JSON object, found {}", index_path, json_type(idx));
    if (idx.contains("metadata")) {
      const json& m = idx["metadata"];
      if (!m.is_object() && !m.is_null())
        fail("{}: metadata: expected an object, found {}", index_path, json_type(m));
      if (m.is_object() && m.contains("total_size"))
        as_size(m["total_size"], index_path, "metadata.total_size");
    }
    if (!idx.contains("weight_map")) fail("{}: missing field 'weight_map'", index_path);
    const json& wm = idx["weight_map"];
    if (!wm.is_object())
      fail("{}: weight_map: expected an object {{tensor name: file}}, found {}", index_path,
           json_type(wm));
    const fs::path dir = fs::path(index_path).parent_path();
    std::map<std::string, size_t> file_ix;
    std::map<std::string, size_t> refs;  // file -> number of tensors mapped to it
    for (auto it = wm.begin(); it != wm.end(); ++it)
      if (it.value().is_string()) refs[it.value().get<std::string>()]++;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      const std::string& name = it.key();
      if (!it.value().is_string())
        fail("{}: weight_map['{}']: expected a file name, found {} ({})", index_path, name,
             json_type(it.value()), show(it.value()));
      const std::string file = it.value().get<std::string>();
      fs::path rel(file);
      bool escapes = file.empty() || rel.is_absolute();
      for (const auto& part : rel) escapes |= part == "..";
      if (escapes)
        fail(
            "{}: weight_map['{}']: file \"{}\" must be a relative path inside the checkpoint "
            "directory",
            index_path, name, file);
      auto [fi, inserted] = file_ix.try_emplace(file, s->files_.size());
      if (inserted) {
        const std::string full = (dir / rel).string();
        if (!fs::is_regular_file(full, ec))
          fail("{}: shard {} is missing (it should hold tensor '{}'{})", index_path, full, name,
               refs[file] > 1 ? fmt::format(" and {} more", refs[file] - 1) : std::string());
        s->files_.push_back(SafetensorsFile::open(full));
      }
      const auto& shard = s->files_[fi->second];
      if (!shard->has(name))
        fail("{}: tensor '{}' is mapped to {}, which has no tensor of that name", index_path, name,
             shard->path());
      s->where_[name] = fi->second;
      const TensorInfo& ti = shard->info(name);
      s->total_bytes_ += ti.end - ti.begin;
    }
  }
  s->names_.reserve(s->where_.size());
  for (const auto& [name, ix] : s->where_) s->names_.push_back(name);
  return s;
}

Tensor TensorStore::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("{}: no tensor named '{}'", path_, name);
  return files_[it->second]->get(name);
}

const TensorInfo& TensorStore::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("{}: no tensor named '{}'", path_, name);
  return files_[it->second]->info(name);
}

const std::string& TensorStore::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("{}: no tensor named '{}'", path_, name);
  return files_[it->second]->path();
}

std::vector<std::string> TensorStore::files() const {
  std::vector<std::string> r;
  for (const auto& f : files_) r.push_back(f->path());
  return r;
}

const std::map<std::string, std::string>& TensorStore::metadata() const {
  static const std::map<std::string, std::string> empty;
  return files_.empty() ? empty : files_[0]->metadata();
}

// ---------------------------------------------------------------------------------------------
std::string shard_file_name(size_t i, size_t n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", i, n);
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<size_t>& bytes,
                                             size_t max_shard_bytes) {
  // Like huggingface_hub's split_state_dict_into_shards_factory: in order; a tensor above the
  // limit alone in a shard where it was met; one that would overflow the current shard starts a
  // new one.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> cur;
  size_t cur_bytes = 0;
  for (size_t i = 0; i < bytes.size(); i++) {
    const size_t b = bytes[i];
    if (b > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (cur_bytes + b > max_shard_bytes) {
      shards.push_back(std::move(cur));
      cur.clear();
      cur_bytes = 0;
    }
    cur.push_back(i);
    cur_bytes += b;
  }
  if (!cur.empty() || shards.empty()) shards.push_back(std::move(cur));
  return shards;
}

std::string shard_index_json(const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size) {
  const json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

std::vector<std::string> save_sharded(const std::string& dir,
                                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                                      size_t max_shard_bytes,
                                      const std::map<std::string, std::string>& metadata) {
  ZAYA_CHECK(max_shard_bytes > 0, "writing {}: max_shard_bytes must be positive", dir);
  {
    std::set<std::string> seen;
    for (const auto& [name, t] : tensors)
      ZAYA_CHECK(seen.insert(name).second, "writing {}: tensor name '{}' appears twice", dir, name);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create checkpoint directory {}: {}", dir, ec.message());
  if (!fs::is_directory(dir, ec)) fail("cannot write checkpoint into {}: not a directory", dir);

  std::vector<size_t> bytes;
  size_t total = 0;
  for (const auto& kv : tensors) {
    bytes.push_back(kv.second.defined() ? kv.second.nbytes() : 0);
    total += bytes.back();
  }
  const std::vector<std::vector<size_t>> shards = plan_shards(bytes, max_shard_bytes);

  auto meta = metadata;
  meta.try_emplace("format", "pt");
  const fs::path d(dir);
  std::vector<std::string> written;
  if (shards.size() == 1) {
    save_safetensors((d / kSafetensorsSingleName).string(), tensors, meta);
    written.push_back(kSafetensorsSingleName);
  } else {
    std::map<std::string, std::string> weight_map;
    for (size_t s = 0; s < shards.size(); s++) {
      const std::string fname = shard_file_name(s + 1, shards.size());
      std::vector<std::pair<std::string, Tensor>> part;
      for (size_t i : shards[s]) {
        part.push_back(tensors[i]);
        weight_map[tensors[i].first] = fname;
      }
      save_safetensors((d / fname).string(), part, meta);
      written.push_back(fname);
    }
    write_file_atomic((d / kSafetensorsIndexName).string(), shard_index_json(weight_map, total));
    written.push_back(kSafetensorsIndexName);
  }

  // Remove what an earlier save left and this one does not use, index first so that no reader
  // follows a stale index to missing shards.
  const std::set<std::string> keep(written.begin(), written.end());
  if (!keep.count(kSafetensorsIndexName)) fs::remove(d / kSafetensorsIndexName, ec);
  static const std::regex shard_re(R"(model-\d{5,}-of-\d{5,}\.safetensors)");
  bool removed = false;
  for (const auto& e : fs::directory_iterator(d, ec)) {
    const std::string n = e.path().filename().string();
    if (keep.count(n)) continue;
    if (n == kSafetensorsSingleName || std::regex_match(n, shard_re)) {
      fs::remove(e.path(), ec);
      removed = true;
    }
  }
  if (removed) fsync_dir(dir);
  return written;
}

}  // namespace zaya
