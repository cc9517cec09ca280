// safetensors reading (memory-mapped, zero-copy, every header field validated) and writing
// (atomic), plus `transformers`-style sharded checkpoints (model.safetensors.index.json).
//
// File layout: u64 little-endian N, N bytes of UTF-8 JSON header, then the data section. The
// header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data section) and may hold "__metadata__": {string: string}. The data section must be
// covered exactly by the tensors, without holes or overlaps (as the reference reader requires).
// docs/CHECKPOINT_FORMAT.md gives the full rules and the order in which we write tensors.
//
// Deliberately not here: dtypes zaya has no DType for (F8_*, U64, F4, ...: they are reported as
// unknown), big-endian hosts, writing device tensors (copy to host first), and any conversion of
// dtypes: a tensor is returned exactly as stored.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace zaya {

// One tensor of a safetensors file; begin/end are byte offsets into the data section.
struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin, end;
};

// The reference reader rejects headers larger than this (100 MB), and so do we.
constexpr size_t kSafetensorsMaxHeader = 100'000'000;

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the whole header; an Error names the file, the tensor or
  // field, and what was expected.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // In data order (ascending offsets), which is the order the writer chose.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  // A read-only view on the mapping; it keeps the mapping alive after this object is gone.
  // A tensor whose bytes are not aligned to its element size (possible only in files from
  // writers that do not sort by alignment) is returned as an aligned read-only copy instead.
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // Bytes before the data section (8 + N).
  size_t data_start() const { return data_start_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<Storage> data_;  // the data section of the mapping
  size_t data_start_ = 0;
};

// The name, dtype and shape of a tensor to be written, for headers built before the data exists.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};

// The bytes a safetensors file starts with for `tensors` stored in the given order with no gaps:
// the u64 length and the JSON header (metadata first when not empty) padded with spaces to a
// multiple of 8. The data section that follows is the tensors' bytes in the same order. An Error
// names `what` (the file being written) for a reserved or repeated name or non-UTF-8 text.
std::string safetensors_header(const std::vector<TensorSpec>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::string& what);

// Writes `tensors` to `path` atomically (temp file, fsync, rename). Tensors are laid out by
// element size, largest first, so every tensor is aligned to its element size when the file is
// mapped; within one element size the given order is kept (the reference writer sorts by name
// there instead; readers do not care). The header lists "__metadata__" first (when not empty),
// then the tensors in data order, and is padded with spaces to a multiple of 8 bytes.
// Non-contiguous tensors are written contiguously. Host tensors only.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A set of named tensors stored as one safetensors file or as `transformers`-style shards:
//   open("dir/model.safetensors")             one file (any name)
//   open("dir") with dir/model.safetensors.index.json   the shards that index lists
//   open("dir") with dir/model.safetensors               one file
//   open("dir/model.safetensors.index.json")  the index directly
// The index is validated completely at open: every shard exists and is a valid safetensors file,
// and every tensor of the weight map is in the shard the map names.
class TensorStore {
 public:
  static std::shared_ptr<TensorStore> open(const std::string& path);

  // Sorted by name.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // Zero-copy view (see SafetensorsFile::get); an Error names the store and the tensor.
  Tensor get(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  // The file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  // The files opened, in the order they were first referenced.
  std::vector<std::string> files() const;
  // The "__metadata__" of the single file, or of the shard holding the first tensor by name
  // (save_sharded gives every shard the same metadata).
  const std::map<std::string, std::string>& metadata() const;
  // Sum of the tensors' byte sizes.
  size_t total_bytes() const { return total_bytes_; }
  // The path given to open().
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // name -> index into files_
  std::vector<std::string> names_;
  size_t total_bytes_ = 0;
};

// Shard names as `transformers` save_pretrained writes them.
constexpr const char* kSafetensorsSingleName = "model.safetensors";
constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";
std::string shard_file_name(size_t index_1based, size_t count);  // model-00001-of-00003.safetensors

// The shards of tensors of these byte sizes (in this order) under huggingface_hub's rule (see
// save_sharded): lists of indices, one per shard, in order. At least one shard (maybe empty).
std::vector<std::vector<size_t>> plan_shards(const std::vector<size_t>& bytes,
                                             size_t max_shard_bytes);
// The order save_safetensors lays tensors of these dtypes out in: by element size, largest first;
// the given order among tensors of one element size. Streaming writers that put a header before
// the data use it too, so every tensor is aligned to its element size once mapped.
std::vector<size_t> safetensors_data_order(const std::vector<DType>& dtypes);
// The text of model.safetensors.index.json as `transformers` writes it (sorted keys, indent 2,
// a final newline): {"metadata": {"total_size": N}, "weight_map": {name: shard file}}.
std::string shard_index_json(const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size);

// Writes `tensors` into `dir` (created if missing) as shards of at most `max_shard_bytes` bytes
// of tensor data each, split the way huggingface_hub's split_torch_state_dict_into_shards does:
// in the given order, a tensor that would push the current shard past the limit starts a new one,
// and a tensor larger than the limit alone gets a shard of its own. One shard is written as
// model.safetensors with no index; several as model-0000i-of-0000n.safetensors plus
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: file}}),
// the index last. Each shard's "__metadata__" is `metadata` plus "format": "pt" unless the caller
// set a format (transformers refuses shards whose metadata lacks it). Files of an earlier save in
// `dir` that the new one does not use (old shards, a stale index or single file) are removed
// afterwards. Each file is atomic; the set is not: for that, save into an AtomicDirCommit.
// Returns the names of the files written, index last.
std::vector<std::string> save_sharded(const std::string& dir,
                                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                                      size_t max_shard_bytes,
                                      const std::map<std::string, std::string>& metadata = {});

}  // namespace zaya
