// Streaming export of a checkpoint's model in the `transformers` layout. See export_hf.h.
#include "ckpt/export_hf.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "ckpt/model_io.h"
#include "ckpt/sharded.h"
#include "core/error.h"
#include "io/atomic.h"
#include "io/manifest.h"
#include "io/safetensors.h"
#include "model/zaya.h"

namespace zaya {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kBlockElems = int64_t(1) << 20;  // converted per write: 2 MiB of bf16

// Writes `t` converted to `to` (F32 or BF16), block by block from fp32.
void write_converted(AtomicFileWriter& w, const Tensor& t, DType to) {
  // A float type other than fp32 (a checkpoint written by another tool) goes through fp32 whole.
  const Tensor src = t.dtype() == DType::F32 && t.is_contiguous() ? t : t.to(DType::F32);
  if (to == DType::F32) {
    w.write(src.raw(), src.nbytes());
    return;
  }
  ZAYA_ASSERT(to == DType::BF16);
  const int64_t n = src.numel();
  std::vector<uint16_t> half(size_t(std::min(kBlockElems, n)));
  for (int64_t b = 0; b < n; b += kBlockElems) {
    const int64_t m = std::min(kBlockElems, n - b);
    const float* x = src.f32() + b;
    for (int64_t i = 0; i < m; i++) half[size_t(i)] = f32_to_bf16(x[i]);
    w.write(half.data(), size_t(m) * sizeof(uint16_t));
  }
}

}  // namespace

HfExportResult export_hf(const std::string& dir, const std::string& out,
                         const HfExportOptions& options) {
  ZAYA_CHECK(options.dtype == DType::BF16 || options.dtype == DType::F32,
             "export: dtype {} is not supported (bf16 or fp32)", dtype_name(options.dtype));
  ZAYA_CHECK(options.max_shard_bytes > 0, "export: the shard size must be positive");
  check_output_dir(dir, out, options.force);
  // Every byte converted is the manifest's.
  const Manifest manifest = read_manifest(dir);
  verify_checkpoint_files(dir, manifest, std::string(kCheckpointModelDir) + "/");
  const ZayaModel model = load_model(dir + "/" + kCheckpointModelDir);
  const auto named = model.named_tensors();

  std::vector<DType> dtypes;
  std::vector<size_t> bytes;
  for (const auto& [name, t] : named) {
    dtypes.push_back(hf_tensor_dtype(name, options.dtype));
    bytes.push_back(size_t(t.numel()) * dtype_size(dtypes.back()));
  }
  const std::vector<std::vector<size_t>> shards = plan_shards(bytes, options.max_shard_bytes);

  HfExportResult r;
  AtomicDirCommit commit(out);
  const std::string& staging = commit.staging();
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); s++) {
    const std::string fname =
        shards.size() == 1 ? kSafetensorsSingleName : shard_file_name(s + 1, shards.size());
    const std::string path = staging + "/" + fname;
    // The header first, in the data order save_safetensors uses (larger elements first).
    std::vector<DType> shard_dtypes;
    for (size_t i : shards[s]) shard_dtypes.push_back(dtypes[i]);
    std::vector<size_t> order;
    for (size_t k : safetensors_data_order(shard_dtypes)) order.push_back(shards[s][k]);
    std::vector<TensorSpec> specs;
    for (size_t i : order) specs.push_back({named[i].first, dtypes[i], named[i].second.shape()});
    AtomicFileWriter w(path);
    w.write(safetensors_header(specs, {{"format", "pt"}}, path));
    for (size_t i : order) {
      write_converted(w, named[i].second, dtypes[i]);
      weight_map[named[i].first] = fname;
      r.tensor_bytes += bytes[i];
      r.tensors++;
    }
    w.commit();
    r.files.push_back(fname);
  }
  if (shards.size() > 1) {
    write_file_atomic(staging + "/" + kSafetensorsIndexName,
                      shard_index_json(weight_map, r.tensor_bytes));
    r.files.push_back(kSafetensorsIndexName);
  }
  write_file_atomic(staging + "/config.json", hf_config_text(model.cfg, options.dtype));
  r.files.push_back("config.json");
  if (!options.tokenizer.empty())
    r.files.push_back(write_tokenizer_files(staging, options.tokenizer));
  commit.commit(options.force ? AtomicDirCommit::IfExists::Replace
                              : AtomicDirCommit::IfExists::Fail);
  std::sort(r.files.begin(), r.files.end());
  return r;
}

}  // namespace zaya
