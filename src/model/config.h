// ZayaConfig: the model's hyper-parameters, read from and written to Hugging Face `config.json`
// (model_type "zaya", fields as in ZAYA1.md §1), with named presets and validation.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace zaya {

enum class SkipOutput { Zero, ScaledInput };  // what a token routed to the skip class outputs

struct RopeSettings {
  double theta = 10000.0;
  double partial_rotary_factor = 0.5;
};

struct ZayaConfig {
  int64_t vocab_size = 262272;
  int64_t hidden_size = 2048;            // D
  int64_t num_hidden_layers = 40;        // L
  int64_t num_attention_heads = 8;       // Hq
  int64_t num_key_value_heads = 2;       // Hkv
  int64_t head_dim = 128;                // d
  int64_t moe_intermediate_size = 2048;  // I
  int64_t num_experts = 16;              // E
  int64_t num_experts_per_tok = 1;       // top-k (only 1 is supported)
  int64_t router_hidden_size = 256;      // R
  int64_t cca_time0 = 2;
  int64_t cca_time1 = 2;
  double rms_norm_eps = 1e-5;
  RopeSettings rope_hybrid{10000.0, 0.5};
  RopeSettings rope_sliding{10000.0, 0.5};
  std::vector<std::string> layer_types;  // "hybrid" or "hybrid_sliding", one per layer
  int64_t sliding_window = 0;            // 0: none
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = true;
  int64_t pad_token_id = 0, bos_token_id = 2, eos_token_id = 1;
  SkipOutput skip_output = SkipOutput::Zero;
  std::string torch_dtype = "bfloat16";

  // Derived sizes.
  int64_t conv_channels() const { return (num_attention_heads + num_key_value_heads) * head_dim; }
  int64_t rotary_dim() const;  // of "hybrid" layers
  bool layer_is_sliding(int64_t layer) const;
  const RopeSettings& rope_for_layer(int64_t layer) const;

  // Parameter counts (matmul and vector parameters), for logs and sizing.
  int64_t params_per_layer() const;
  int64_t params_total(bool with_embedding) const;
  int64_t params_active(bool with_embedding) const;  // per token: one expert, router, attention

  // Throws zaya::Error naming the field and the constraint it breaks. `where` names the source
  // (a file path or "preset tiny") for the message.
  void validate(const std::string& where = "config") const;

  // The same architecture with n >= 1 layers: the first n entries of layer_types, the last one
  // repeated when n is larger (bench-sized runs of a large preset).
  ZayaConfig with_layers(int64_t n) const;

  static ZayaConfig preset(const std::string& name);  // "tiny", "zaya1-base", "zaya1-8b"
  static std::vector<std::string> preset_names();
  // Parses config.json content; `where` names the file in errors.
  static ZayaConfig from_json(const nlohmann::json& j, const std::string& where);
  static ZayaConfig load(const std::string& path);  // a config.json file or a directory holding one
  nlohmann::json to_json() const;                   // the `transformers` config.json
};

}  // namespace zaya
