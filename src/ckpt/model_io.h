// Model checkpoints in the Hugging Face layouts: loading a directory of config.json + safetensors
// (sharded with model.safetensors.index.json or not) in the `transformers` ZayaForCausalLM layout
// or the original ZAYA1-base release layout (80 alternating attention/MoE stages, one tensor per
// expert), and writing the `transformers` layout atomically.
//
// Loaded weights stay in their stored dtype as zero-copy views of the memory map (matrices); the
// small vectors and convolution filters are widened to fp32. Deliberately not here: training state
// (optimizer moments, data cursors), which ckpt/checkpoint.h stores beside the model.
#pragma once
#include <cstddef>
#include <string>

#include "core/dtype.h"
#include "model/zaya.h"

namespace zaya {

// Loads a checkpoint directory (config.json + safetensors, sharded or not) in either layout.
ZayaModel load_model(const std::string& dir);

// load_model with every tensor replaced by an owned fp32 copy: what training needs, since it writes
// the weights in place (the memory map is read-only) and keeps fp32 masters.
ZayaModel load_model_f32(const std::string& dir);

// The model config load_model(dir) would give, from config.json and the safetensors headers (the
// original layout's stack depth comes from its tensor names), without reading any weights.
ZayaConfig load_model_config(const std::string& dir);

// Writes config.json and the weights in the `transformers` layout, staged and renamed into `dir`
// (an existing directory is replaced only once the new one is complete). Balancing biases stay
// fp32; the other tensors take `dtype`. Shards hold at most `max_shard_bytes` (0: 5 GiB).
void save_model(const ZayaModel& model, const std::string& dir, DType dtype = DType::F32,
                size_t max_shard_bytes = 0);

// The dtype a tensor is stored in when a model is written in `dtype`: the balancing biases stay
// fp32 (`transformers` keeps them as fp32 buffers), every other tensor takes `dtype`.
DType hf_tensor_dtype(const std::string& name, DType dtype);
// config.json for weights stored in `dtype`: cfg.to_json() with "dtype" (the `transformers` >= 5
// spelling of torch_dtype) set to "float32", "bfloat16" or "float16".
std::string hf_config_text(const ZayaConfig& cfg, DType dtype);

// Puts the tokenizer beside a model, where `zaya generate` and `zaya eval` look for it:
// "bytes" writes tokenizer.txt ("bytes"); a tokenizer.json file, or a directory holding one, is
// copied as tokenizer.json (atomically). Returns the file name written; an Error names a missing
// tokenizer.
std::string write_tokenizer_files(const std::string& model_dir, const std::string& tokenizer);

// Name mapping of the original ZAYA1-base release (80 alternating stages) to `transformers` names.
// Returns "" for names that carry no weight in the transformers model. Experts are handled by the
// loader (one tensor per expert in the original, stacked in transformers).
std::string original_to_hf_name(const std::string& name, int64_t num_stages);

}  // namespace zaya
