// Model checkpoint I/O in the Hugging Face layouts. See model_io.h.
#include "ckpt/model_io.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "core/json.h"
#include "io/atomic.h"
#include "io/safetensors.h"

namespace zaya {

namespace {

// A layer or expert number from a tensor name (digits only, by the regexes that found it); one
// too large for int64 is an Error naming the tensor instead of std::out_of_range.
int64_t name_number(const std::string& digits, const std::string& name) {
  int64_t v = 0;
  for (char c : digits)
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v))
      fail("tensor '{}': the number {} is too large", name, digits);
  return v;
}

}  // namespace

std::string original_to_hf_name(const std::string& name, int64_t num_stages) {
  static const std::regex layer_re(R"(^model\.layers\.(\d+)\.(.+)$)");
  std::smatch m;
  auto res_set = [](const std::string& rest) {
    return rest.substr(std::string("res_scale.").size());
  };
  if (!std::regex_match(name, m, layer_re)) {
    if (name == "model.final_norm.weight") return "model.norm.weight";
    if (name.rfind("model.res_scale.", 0) == 0)
      return "model.layers." + std::to_string(num_stages / 2 - 1) + ".post_mlp_residual_scale." +
             name.substr(std::string("model.res_scale.").size());
    if (name == "model.embed_tokens.weight") return name;
    if (name == "lm_head.weight") return "";
    fail("original checkpoint: unexpected tensor '{}'", name);
  }
  const int64_t stage = name_number(m[1], name);
  const std::string rest = m[2];
  const std::string lp = "model.layers." + std::to_string(stage / 2) + ".";
  static const std::vector<std::pair<std::string, std::string>> attn = {
      {"self_attn.qkv.linear_q.", "self_attn.qkv_proj.q_proj."},
      {"self_attn.qkv.linear_k.", "self_attn.qkv_proj.k_proj."},
      {"self_attn.qkv.val_proj1.", "self_attn.qkv_proj.v_proj_current."},
      {"self_attn.qkv.val_proj2.", "self_attn.qkv_proj.v_proj_delayed."},
      {"self_attn.qkv.conv_qk.0.", "self_attn.qkv_proj.conv_qk_depthwise."},
      {"self_attn.qkv.conv_qk.1.", "self_attn.qkv_proj.conv_qk_grouped."},
      {"self_attn.qkv.temp", "self_attn.qk_norm.temp"},
      {"self_attn.linear_proj.", "self_attn.o_proj."},
      {"self_attn.o_proj.", "self_attn.o_proj."},
      {"input_norm.", "input_layernorm."}};
  static const std::vector<std::pair<std::string, std::string>> moe = {
      {"zaya_block.router.down_proj.", "mlp.gate.down_proj."},
      {"zaya_block.router.rmsnorm_eda.", "mlp.gate.router_mlp.norm."},
      {"zaya_block.router.router_states_scale", "mlp.gate.router_states_scale"},
      {"zaya_block.router.router_mlp.0.", "mlp.gate.router_mlp.fc1."},
      {"zaya_block.router.router_mlp.2.", "mlp.gate.router_mlp.fc2."},
      {"zaya_block.router.router_mlp.4.", "mlp.gate.router_mlp.out_proj."},
      {"zaya_block.router.balancing_biases", "mlp.gate.balancing_biases"},
      {"input_norm.", "post_attention_layernorm."}};
  if (rest.rfind("res_scale.", 0) == 0) {
    if (stage == 0) {
      // Stage 0's output affine is the model's input affine; its residual half acts on nothing.
      const std::string f = res_set(rest);
      if (f == "hidden_states_scale" || f == "hidden_states_bias") return "model.input_" + f;
      return "";
    }
    if (stage % 2 == 0)
      return "model.layers." + std::to_string(stage / 2 - 1) + ".post_mlp_residual_scale." +
             res_set(rest);
    return lp + "post_attention_residual_scale." + res_set(rest);
  }
  for (auto& [from, to] : (stage % 2 == 0 ? attn : moe))
    if (rest.rfind(from, 0) == 0) return lp + to + rest.substr(from.size());
  fail("original checkpoint: unexpected tensor '{}' at stage {}", name, stage);
}

namespace {

// Reads the model config of an original-layout checkpoint: num_hidden_layers counts stages there
// and the per-stage lists describe the stack; the transformers fields are used when present.
ZayaConfig config_for_original(const nlohmann::json& j, const std::string& where, int64_t stages) {
  nlohmann::json k = j;
  k["model_type"] = "zaya";
  k["num_hidden_layers"] = stages / 2;
  auto first_nonzero = [&](const char* key) -> int64_t {
    if (!j.contains(key) || !j[key].is_array()) return 0;
    for (auto& v : j[key])
      if (v.is_number_integer() && v.get<int64_t>() > 0) return v.get<int64_t>();
    return 0;
  };
  if (int64_t hq = first_nonzero("cca_num_q_heads")) k["num_attention_heads"] = hq;
  if (int64_t g = first_nonzero("num_query_groups_list")) k["num_key_value_heads"] = g;
  if (int64_t f = first_nonzero("ffn_hidden_size_list"); f && !j.contains("moe_intermediate_size"))
    k["moe_intermediate_size"] = f / 2;
  if (int64_t r = first_nonzero("zaya_mlp_expansion"); r && !j.contains("router_hidden_size"))
    k["router_hidden_size"] = r;
  if (int64_t e = first_nonzero("zaya_layers"); e && !j.contains("num_experts"))
    k["num_experts"] = e;
  if (!j.contains("head_dim") && j.contains("kv_channels")) k["head_dim"] = j["kv_channels"];
  if (!j.contains("rms_norm_eps") && j.contains("norm_epsilon"))
    k["rms_norm_eps"] = j["norm_epsilon"];
  k.erase("layer_types");
  k["zaya_skip_output"] = j.value("zaya_skip_output", std::string("scaled_input"));
  return ZayaConfig::from_json(k, where);
}

// A checkpoint directory before its weights are read: the tensor index, the layout, and the model
// config (for the original layout, with the stack depth counted from the tensor names).
struct OpenedCheckpoint {
  std::shared_ptr<TensorStore> store;
  bool original = false;
  int64_t stages = 0;  // original layout: alternating attention/MoE stages
  ZayaConfig cfg;
};

OpenedCheckpoint open_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ZAYA_CHECK(fs::is_directory(dir, ec), "model directory '{}' does not exist", dir);
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  ZAYA_CHECK(fs::exists(cfg_path, ec), "{}: missing config.json", dir);
  OpenedCheckpoint o;
  o.store = TensorStore::open(dir);
  o.original = o.store->has("model.layers.0.self_attn.qkv.linear_q.weight");
  if (!o.original) {
    o.cfg = ZayaConfig::load(cfg_path);
    return o;
  }
  const nlohmann::json j = read_json_file(cfg_path, "malformed JSON");
  // The stage count comes from the tensors (the config's num_hidden_layers may be stale).
  int64_t last_stage = -1;
  static const std::regex re(R"(^model\.layers\.(\d+)\.)");
  for (auto& n : o.store->names()) {
    std::smatch mm;
    if (std::regex_search(n, mm, re))
      last_stage = std::max<int64_t>(last_stage, name_number(mm[1], n));
  }
  // Every stage holds tensors, so a stage number beyond the tensor count is a corrupt name (and
  // would size the model's layer list).
  ZAYA_CHECK(last_stage < int64_t(o.store->names().size()),
             "{}: a tensor name numbers stage {}, but the checkpoint holds only {} tensors", dir,
             last_stage, o.store->names().size());
  o.stages = last_stage + 1;
  ZAYA_CHECK(o.stages % 2 == 0 && o.stages > 0,
             "{}: original layout with {} stages (expected an even "
             "number of alternating attention/MoE stages)",
             dir, o.stages);
  o.cfg = config_for_original(j, cfg_path, o.stages);
  return o;
}

}  // namespace

ZayaConfig load_model_config(const std::string& dir) {
  return open_checkpoint(dir).cfg;
}

ZayaModel load_model(const std::string& dir) {
  OpenedCheckpoint o = open_checkpoint(dir);
  const auto& store = o.store;
  const int64_t stages = o.stages;
  ZayaModel m;
  m.cfg = o.cfg;
  std::map<std::string, Tensor> by_name;
  if (!o.original) {
    for (auto& n : store->names()) by_name[n] = store->get(n);
  } else {
    static const std::regex ex(
        R"(^model\.layers\.(\d+)\.zaya_block\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight$)");
    std::map<std::string, std::vector<std::pair<int64_t, Tensor>>> experts;
    for (auto& n : store->names()) {
      std::smatch mm;
      if (std::regex_match(n, mm, ex)) {
        const std::string target =
            "model.layers." + std::to_string(name_number(mm[1], n) / 2) +
            (mm[3] == "1" ? ".mlp.experts.gate_up_proj" : ".mlp.experts.down_proj");
        experts[target].emplace_back(name_number(mm[2], n), store->get(n));
        continue;
      }
      std::string hf = original_to_hf_name(n, stages);
      if (!hf.empty()) by_name[hf] = store->get(n);
    }
    for (auto& [target, list] : experts) {
      std::sort(list.begin(), list.end(), [](auto& a, auto& b) { return a.first < b.first; });
      Shape sh = list[0].second.shape();
      sh.insert(sh.begin(), int64_t(list.size()));
      Tensor stacked = Tensor::empty(sh, list[0].second.dtype());
      for (size_t e = 0; e < list.size(); e++) {
        ZAYA_CHECK(list[e].first == int64_t(e), "{}: expert {} missing for {}", dir, e, target);
        stacked.select(0, int64_t(e)).copy_from(list[e].second);
      }
      by_name[target] = stacked;
    }
  }
  const ZayaConfig& c = m.cfg;
  // Each layer has tensors of its own; a config asking for more layers than there are tensors is
  // refused before the layer list is sized by it.
  ZAYA_CHECK(c.num_hidden_layers <= int64_t(store->names().size()),
             "{}: config.json asks for {} layers, but the checkpoint holds only {} tensors", dir,
             c.num_hidden_layers, store->names().size());
  m.layers.resize(size_t(c.num_hidden_layers));
  auto shapes = expected_tensor_shapes(c);
  std::vector<std::string> missing;
  for (auto& [name, slot] : m.tensor_slots()) {
    Tensor& t = *slot;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    const Shape& want = shapes.at(name);
    ZAYA_CHECK(dtype_is_float(src.dtype()), "{}: tensor '{}' has dtype {}, expected a float type",
               dir, name, dtype_name(src.dtype()));
    ZAYA_CHECK(src.shape() == want, "{}: tensor '{}' has shape {}, expected {}", dir, name,
               shape_str(src.shape()), shape_str(want));
    // Matrices stay in their stored dtype (zero-copy view of the mapping); vectors and conv filters
    // are widened to fp32, the dtype the math runs in.
    t = is_matrix_tensor(name, want) && src.dtype() != DType::F64 ? src : src.to(DType::F32);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 20; i++) list += "\n  " + missing[i];
    if (missing.size() > 20) list += fmt::format("\n  ... and {} more", missing.size() - 20);
    fail("{}: {} tensor(s) missing from the checkpoint:{}", dir, missing.size(), list);
  }
  if (m.embed.dtype() != DType::F32 && c.vocab_size * c.hidden_size < (int64_t(1) << 24))
    m.embed = m.embed.to(DType::F32);
  return m;
}

ZayaModel load_model_f32(const std::string& dir) {
  ZayaModel m = load_model(dir);
  for (auto& [name, t] : m.tensor_slots())
    if (t->defined()) *t = t->to(DType::F32);
  return m;
}

DType hf_tensor_dtype(const std::string& name, DType dtype) {
  return name.find("balancing_biases") != std::string::npos ? DType::F32 : dtype;
}

std::string hf_config_text(const ZayaConfig& cfg, DType dtype) {
  nlohmann::json cj = cfg.to_json();
  cj["dtype"] = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  return cj.dump(2) + "\n";
}

std::string write_tokenizer_files(const std::string& model_dir, const std::string& tokenizer) {
  if (tokenizer == "bytes") {
    write_file_atomic(model_dir + "/tokenizer.txt", "bytes\n");
    return "tokenizer.txt";
  }
  std::error_code ec;
  std::string file = tokenizer;
  if (std::filesystem::is_directory(file, ec)) file += "/tokenizer.json";
  ZAYA_CHECK(std::filesystem::is_regular_file(file, ec), "tokenizer {}: no such file", file);
  write_file_atomic(model_dir + "/tokenizer.json", read_file(file));
  return "tokenizer.json";
}

void save_model(const ZayaModel& model, const std::string& dir, DType dtype,
                size_t max_shard_bytes) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : model.named_tensors()) {
    const DType want = hf_tensor_dtype(name, dtype);
    out.emplace_back(name, t.dtype() == want ? t : t.to(want));
  }
  // Staged next to its destination and renamed into place: a reader never sees a half-written
  // checkpoint, and an existing one is replaced only once the new one is complete.
  AtomicDirCommit commit(dir);
  save_sharded(commit.staging(), out, max_shard_bytes ? max_shard_bytes : (size_t(5) << 30),
               {{"format", "pt"}});
  write_file_atomic(commit.staging() + "/config.json", hf_config_text(model.cfg, dtype));
  commit.commit(AtomicDirCommit::IfExists::Replace);
}

}  // namespace zaya
