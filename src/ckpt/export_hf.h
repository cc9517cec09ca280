// Exporting a training checkpoint's model as a `transformers` checkpoint (`zaya ckpt export-hf`):
// config.json with "dtype", the weights in bf16 or fp32 (balancing biases stay fp32, as save_model
// writes them), sharded as huggingface_hub shards with model.safetensors.index.json, and the
// tokenizer (tokenizer.json, or tokenizer.txt for the byte tokenizer). Streaming: each shard's
// header is written first, then every tensor converted block by block from the memory-mapped
// checkpoint, so memory stays a few MiB whatever the model's size. The model files are checked
// against the manifest's checksums before anything is written; the output is staged and renamed
// into place (AtomicDirCommit), so a failure leaves no OUT at all (or the old one, with force).
//
// Deliberately not here: choosing the tokenizer of a run (train/ckpt_tools.h knows the run
// config), fp16, and the original ZAYA1 release layout (zaya reads it, never writes it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace zaya {

struct HfExportOptions {
  DType dtype = DType::BF16;                 // BF16 or F32
  size_t max_shard_bytes = size_t(5) << 30;  // tensor bytes per shard (huggingface_hub's rule)
  // "bytes" (writes tokenizer.txt), a tokenizer.json file or a directory holding one (copied),
  // or "" (no tokenizer files).
  std::string tokenizer;
  bool force = false;  // replace an existing OUT (once the new one is complete)
};

struct HfExportResult {
  std::vector<std::string> files;  // written, relative to OUT, sorted
  int64_t tensors = 0;
  uint64_t tensor_bytes = 0;  // the data sections' bytes (the index's total_size)
};

// Exports checkpoint `dir` (a step-* directory) to `out`. Errors: `out` exists without force, or
// is the checkpoint, inside it or above it; a model file differs from the manifest; a dtype other
// than BF16/F32; a tokenizer that does not exist.
HfExportResult export_hf(const std::string& dir, const std::string& out,
                         const HfExportOptions& options);

}  // namespace zaya
