#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "core/checked.h"
#include "core/error.h"
#include "core/json.h"

namespace zaya {

using nlohmann::json;

int64_t ZayaConfig::rotary_dim() const {
  return int64_t(double(head_dim) * rope_hybrid.partial_rotary_factor);
}

// The deepest stack a config may describe (a bound before any per-layer allocation).
constexpr int64_t kMaxLayers = 4096;

bool ZayaConfig::layer_is_sliding(int64_t layer) const {
  return !layer_types.empty() && layer_types.at(size_t(layer)) == "hybrid_sliding";
}

const RopeSettings& ZayaConfig::rope_for_layer(int64_t layer) const {
  return layer_is_sliding(layer) ? rope_sliding : rope_hybrid;
}

// The counts use checked arithmetic (an overflow is an Error, not a wrapped count); validate()
// evaluates them once, so a validated config never overflows here.
int64_t ZayaConfig::params_per_layer() const {
  using I64 = CheckedI64;
  const I64 D = hidden_size, d = head_dim, Hq = num_attention_heads, Hkv = num_key_value_heads;
  const I64 C = I64(Hq + Hkv) * d, R = router_hidden_size, E = num_experts,
            I = moe_intermediate_size;
  I64 attn = Hq * d * D + Hkv * d * D + Hkv * d * D /* v_cur + v_del */ + D * Hq * d;
  attn += C * cca_time0 + C + C * d * cca_time1 + C + Hkv;
  I64 norms = I64(2) * D + I64(2 * 4) * D;
  I64 router = R * D + R + R /*states scale*/ + R + I64(2) * (R * R + R) + (E + 1) * R;
  I64 experts = E * (I64(2) * I * D + D * I);
  return (attn + norms + router + experts).v;
}

int64_t ZayaConfig::params_total(bool with_embedding) const {
  using I64 = CheckedI64;
  I64 n = I64(num_hidden_layers) * params_per_layer() + I64(2) * hidden_size + hidden_size;
  n -= router_hidden_size;  // layer 0 has no router_states_scale
  if (with_embedding) n += I64(vocab_size) * hidden_size;
  return n.v;
}

int64_t ZayaConfig::params_active(bool with_embedding) const {
  using I64 = CheckedI64;
  const I64 D = hidden_size, I = moe_intermediate_size;
  I64 per_layer = I64(params_per_layer()) - I64(num_experts) * 3 * I * D + I64(3) * I * D;
  I64 n = I64(num_hidden_layers) * per_layer + I64(3) * hidden_size - router_hidden_size;
  if (with_embedding) n += I64(vocab_size) * hidden_size;
  return n.v;
}

void ZayaConfig::validate(const std::string& where) const {
  auto pos = [&](const char* field, int64_t v) {
    ZAYA_CHECK(v > 0, "{}: {} must be positive, found {}", where, field, v);
  };
  pos("vocab_size", vocab_size);
  pos("hidden_size", hidden_size);
  pos("num_hidden_layers", num_hidden_layers);
  pos("num_attention_heads", num_attention_heads);
  pos("num_key_value_heads", num_key_value_heads);
  pos("head_dim", head_dim);
  pos("moe_intermediate_size", moe_intermediate_size);
  pos("num_experts", num_experts);
  pos("router_hidden_size", router_hidden_size);
  pos("cca_time0", cca_time0);
  pos("cca_time1", cca_time1);
  // Bounds far beyond any model that exists, so that a config cannot ask for per-layer tables
  // (layer types, RoPE settings) or buffers larger than memory before anything is allocated.
  ZAYA_CHECK(num_hidden_layers <= kMaxLayers, "{}: num_hidden_layers = {} exceeds {}", where,
             num_hidden_layers, kMaxLayers);
  // Every product of sizes the model forms (the parameter counts cover them all) must fit 64 bits
  // before anything below multiplies them.
  try {
    (void)params_total(true);
    (void)params_active(true);
  } catch (const Error& e) {
    fail("{}: the sizes are too large: {} (hidden_size {}, heads {}/{}, head_dim {}, experts {})",
         where, e.what(), hidden_size, num_attention_heads, num_key_value_heads, head_dim,
         num_experts);
  }
  ZAYA_CHECK(num_attention_heads % num_key_value_heads == 0,
             "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", where,
             num_attention_heads, num_key_value_heads);
  ZAYA_CHECK(
      (num_key_value_heads * head_dim) % 2 == 0,
      "{}: num_key_value_heads*head_dim ({}) must be even (values are split into current and "
      "delayed halves)",
      where, num_key_value_heads * head_dim);
  ZAYA_CHECK(num_experts_per_tok == 1,
             "{}: num_experts_per_tok must be 1 (top-1 routing), found {}", where,
             num_experts_per_tok);
  for (auto* r : {&rope_hybrid, &rope_sliding}) {
    ZAYA_CHECK(r->theta > 0, "{}: rope_theta must be positive, found {}", where, r->theta);
    ZAYA_CHECK(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1,
               "{}: partial_rotary_factor must be in (0, 1], found {}", where,
               r->partial_rotary_factor);
    int64_t rd = int64_t(double(head_dim) * r->partial_rotary_factor);
    ZAYA_CHECK(rd % 2 == 0 && rd > 0,
               "{}: rotary dim head_dim*partial_rotary_factor = {} must be even", where, rd);
  }
  ZAYA_CHECK(rms_norm_eps > 0, "{}: rms_norm_eps must be positive, found {}", where, rms_norm_eps);
  if (!layer_types.empty()) {
    ZAYA_CHECK(int64_t(layer_types.size()) == num_hidden_layers,
               "{}: layer_types has {} entries, expected num_hidden_layers = {}", where,
               layer_types.size(), num_hidden_layers);
    for (auto& t : layer_types) {
      ZAYA_CHECK(t == "hybrid" || t == "hybrid_sliding",
                 "{}: layer_types entry '{}' is not 'hybrid' or 'hybrid_sliding'", where, t);
      if (t == "hybrid_sliding")
        ZAYA_CHECK(sliding_window > 0, "{}: a hybrid_sliding layer needs sliding_window > 0",
                   where);
    }
  }
  for (auto [name, v] : {std::pair{"pad_token_id", pad_token_id},
                         {"bos_token_id", bos_token_id},
                         {"eos_token_id", eos_token_id}})
    ZAYA_CHECK(v >= 0 && v < vocab_size, "{}: {} = {} is outside the vocabulary of {}", where, name,
               v, vocab_size);
}

std::vector<std::string> ZayaConfig::preset_names() {
  return {"tiny", "zaya1-base", "zaya1-8b"};
}

ZayaConfig ZayaConfig::with_layers(int64_t n) const {
  ZAYA_CHECK(n >= 1 && n <= kMaxLayers, "a stack of {} layers: expected 1 to {}", n, kMaxLayers);
  ZayaConfig c = *this;
  c.num_hidden_layers = n;
  if (!c.layer_types.empty()) c.layer_types.resize(size_t(n), c.layer_types.back());
  return c;
}

ZayaConfig ZayaConfig::preset(const std::string& name) {
  ZayaConfig c;  // defaults are ZAYA1-base
  if (name == "zaya1-base") {
    c.rope_hybrid.theta = 1e6;  // after context extension
    c.max_position_embeddings = 32768;
  } else if (name == "zaya1-8b") {
    c.rope_hybrid.theta = 5e6;
    c.eos_token_id = 106;
    c.max_position_embeddings = 32768;
  } else if (name == "tiny") {
    // A debug model that trains on 2 CPU cores in minutes: same structure, small widths.
    c.vocab_size = 256 + 128;  // byte tokenizer (256) + specials, padded to a multiple of 128
    c.hidden_size = 128;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.moe_intermediate_size = 128;
    c.num_experts = 4;
    c.router_hidden_size = 32;
    c.max_position_embeddings = 1024;
    c.pad_token_id = 256;
    c.bos_token_id = 257;
    c.eos_token_id = 258;
    c.torch_dtype = "float32";
  } else {
    fail("unknown model preset '{}' (known: tiny, zaya1-base, zaya1-8b)", name);
  }
  c.validate("preset " + name);
  return c;
}

namespace {

template <typename T>
void get(const json& j, const char* key, T* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if constexpr (std::is_same_v<T, int64_t>) {
    // Checked before converting: nlohmann would cast any number (1e300 is undefined behaviour).
    if (!it->is_number())
      fail("{}: field '{}' has the wrong type ({})", where, key, json_show(*it));
    *out = json_int64(*it, fmt::format("{}: field '{}'", where, key));
  } else {
    try {
      *out = it->get<T>();
    } catch (const json::exception&) {
      fail("{}: field '{}' has the wrong type ({})", where, key, json_show(*it));
    }
  }
}

RopeSettings rope_from(const json& r, const std::string& where, RopeSettings def) {
  RopeSettings s = def;
  get(r, "rope_theta", &s.theta, where);
  get(r, "partial_rotary_factor", &s.partial_rotary_factor, where);
  return s;
}

}  // namespace

ZayaConfig ZayaConfig::from_json(const json& j, const std::string& where) {
  ZAYA_CHECK(j.is_object(), "{}: expected a JSON object", where);
  std::string mt;
  get(j, "model_type", &mt, where);
  ZAYA_CHECK(!mt.empty(), "{}: missing field 'model_type' (expected \"zaya\")", where);
  ZAYA_CHECK(mt == "zaya", "{}: model_type is \"{}\", expected \"zaya\"", where, mt);
  ZayaConfig c;
  c.layer_types.clear();
  for (const char* req : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"})
    ZAYA_CHECK(j.contains(req), "{}: missing required field '{}'", where, req);
  get(j, "vocab_size", &c.vocab_size, where);
  get(j, "hidden_size", &c.hidden_size, where);
  get(j, "num_hidden_layers", &c.num_hidden_layers, where);
  get(j, "num_attention_heads", &c.num_attention_heads, where);
  get(j, "num_key_value_heads", &c.num_key_value_heads, where);
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    get(j, "head_dim", &c.head_dim, where);
  else if (c.num_attention_heads > 0)
    c.head_dim = c.hidden_size / c.num_attention_heads;
  get(j, "moe_intermediate_size", &c.moe_intermediate_size, where);
  get(j, "num_experts", &c.num_experts, where);
  get(j, "num_experts_per_tok", &c.num_experts_per_tok, where);
  get(j, "router_hidden_size", &c.router_hidden_size, where);
  get(j, "cca_time0", &c.cca_time0, where);
  get(j, "cca_time1", &c.cca_time1, where);
  get(j, "rms_norm_eps", &c.rms_norm_eps, where);
  get(j, "max_position_embeddings", &c.max_position_embeddings, where);
  get(j, "tie_word_embeddings", &c.tie_word_embeddings, where);
  get(j, "pad_token_id", &c.pad_token_id, where);
  get(j, "bos_token_id", &c.bos_token_id, where);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty())
    c.eos_token_id = json_int64(j["eos_token_id"][0], where + ": field 'eos_token_id'[0]");
  else
    get(j, "eos_token_id", &c.eos_token_id, where);
  get(j, "sliding_window", &c.sliding_window, where);
  get(j, "layer_types", &c.layer_types, where);
  get(j, "torch_dtype", &c.torch_dtype, where);
  get(j, "dtype", &c.torch_dtype, where);  // transformers >= 5 writes "dtype"
  bool attention_bias = false, lm_head_bias = false;
  get(j, "attention_bias", &attention_bias, where);
  get(j, "lm_head_bias", &lm_head_bias, where);
  ZAYA_CHECK(!attention_bias && !lm_head_bias,
             "{}: attention_bias and lm_head_bias must be false (ZAYA1 has no such biases)", where);
  std::string act = "silu";
  get(j, "hidden_act", &act, where);
  ZAYA_CHECK(act == "silu", "{}: hidden_act is \"{}\", expected \"silu\" (SwiGLU experts)", where,
             act);
  // rope_parameters: either per layer type {"hybrid": {...}, "hybrid_sliding": {...}} or flat.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const json& rp = j["rope_parameters"];
    if (rp.contains("hybrid") || rp.contains("hybrid_sliding")) {
      if (rp.contains("hybrid")) c.rope_hybrid = rope_from(rp["hybrid"], where, c.rope_hybrid);
      if (rp.contains("hybrid_sliding"))
        c.rope_sliding = rope_from(rp["hybrid_sliding"], where, c.rope_sliding);
    } else {
      c.rope_hybrid = rope_from(rp, where, c.rope_hybrid);
    }
  } else {
    get(j, "rope_theta", &c.rope_hybrid.theta, where);
    get(j, "partial_rotary_factor", &c.rope_hybrid.partial_rotary_factor, where);
  }
  std::string so = "zero";
  get(j, "zaya_skip_output", &so, where);
  ZAYA_CHECK(so == "zero" || so == "scaled_input",
             "{}: zaya_skip_output is \"{}\", expected \"zero\" or \"scaled_input\"", where, so);
  c.skip_output = so == "zero" ? SkipOutput::Zero : SkipOutput::ScaledInput;
  c.validate(where);
  return c;
}

ZayaConfig ZayaConfig::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  ZAYA_CHECK(std::ifstream(file).good(), "cannot open model config '{}'", file);
  return from_json(read_json_file(file, "malformed JSON"), file);
}

json ZayaConfig::to_json() const {
  json rope = {{"hybrid",
                {{"rope_type", "default"},
                 {"rope_theta", rope_hybrid.theta},
                 {"partial_rotary_factor", rope_hybrid.partial_rotary_factor}}}};
  bool any_sliding = false;
  for (auto& t : layer_types) any_sliding |= t == "hybrid_sliding";
  if (any_sliding)
    rope["hybrid_sliding"] = {{"rope_type", "default"},
                              {"rope_theta", rope_sliding.theta},
                              {"partial_rotary_factor", rope_sliding.partial_rotary_factor}};
  std::vector<std::string> lt = layer_types;
  if (lt.empty()) lt.assign(size_t(num_hidden_layers), "hybrid");
  json j = {{"architectures", {"ZayaForCausalLM"}},
            {"model_type", "zaya"},
            {"vocab_size", vocab_size},
            {"hidden_size", hidden_size},
            {"num_hidden_layers", num_hidden_layers},
            {"num_attention_heads", num_attention_heads},
            {"num_key_value_heads", num_key_value_heads},
            {"head_dim", head_dim},
            {"moe_intermediate_size", moe_intermediate_size},
            {"num_experts", num_experts},
            {"num_experts_per_tok", num_experts_per_tok},
            {"router_hidden_size", router_hidden_size},
            {"cca_time0", cca_time0},
            {"cca_time1", cca_time1},
            {"rms_norm_eps", rms_norm_eps},
            {"rope_parameters", rope},
            {"layer_types", lt},
            {"sliding_window", sliding_window > 0 ? json(sliding_window) : json(nullptr)},
            {"max_position_embeddings", max_position_embeddings},
            {"tie_word_embeddings", tie_word_embeddings},
            {"pad_token_id", pad_token_id},
            {"bos_token_id", bos_token_id},
            {"eos_token_id", eos_token_id},
            {"dtype", torch_dtype},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"lm_head_bias", false}};
  if (skip_output == SkipOutput::ScaledInput) j["zaya_skip_output"] = "scaled_input";
  return j;
}

}  // namespace zaya
