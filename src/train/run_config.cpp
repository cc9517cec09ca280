// RunConfig parsing, overrides, validation, TOML output and phase selection; see run_config.h.
//
// How strictness works: the file (plus overrides) becomes a toml::table; each section is read by a
// Reader that marks the keys it consumes, and any key left over is an unknown-key error naming the
// full path. Overrides are applied to the table before reading, typed by a schema table that is
// to_toml() of a prototype config (every optional field set, one entry in every list), so a new
// field needs no extra override code.
#include "train/run_config.h"

// Debian's libtomlplusplus-dev ships toml.h; upstream single-header installs ship toml.hpp.
#if __has_include(<toml++/toml.hpp>)
#include <toml++/toml.hpp>
#else
#include <toml++/toml.h>
#endif

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/model_io.h"
#include "core/checked.h"
#include "core/error.h"
#include "io/atomic.h"
#include "train/toml_keys.h"

namespace zaya {

namespace {

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string line_of(const toml::node& n) {
  const auto& b = n.source().begin;
  return b.line > 0 ? fmt::format(" (line {})", b.line) : "";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "phase.3.seq_len" → "phase.N.seq_len": list indexes do not matter for which keys exist.
std::string generic_path(const std::string& path) {
  std::string out;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    std::string seg = path.substr(i, j - i);
    bool digits = !seg.empty() && std::all_of(seg.begin(), seg.end(), ::isdigit);
    if (!out.empty()) out += '.';
    out += digits ? std::string("N") : seg;
    i = j + 1;
  }
  return out;
}

std::string suggestions(const std::string& path) {
  const std::string g = generic_path(path);
  auto keys = RunConfig::key_paths();
  std::stable_sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    return edit_distance(g, a) < edit_distance(g, b);
  });
  keys.resize(std::min<size_t>(3, keys.size()));
  return fmt::format("nearest valid keys: {}", fmt::join(keys, ", "));
}

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

class Reader {
 public:
  Reader(const toml::table& t, std::string path, std::string file)
      : t_(t), path_(std::move(path)), file_(std::move(file)) {}

  const toml::node* find(const char* key) {
    used_.insert(key);
    return t_.get(key);
  }
  bool has(const char* key) const { return t_.get(key) != nullptr; }
  std::string where(const char* key) const { return join_path(path_, key); }
  [[noreturn]] void bad_type(const char* key, const toml::node& n, const char* expected) const {
    fail("{}: {} must be {}, found {}{}", file_, where(key), expected, type_name(n), line_of(n));
  }

  void get(const char* key, int64_t* out) {
    if (auto* n = find(key)) {
      if (!n->is_integer()) bad_type(key, *n, "an integer");
      *out = n->as_integer()->get();
    }
  }
  void get(const char* key, std::optional<int64_t>* out) {
    int64_t v = 0;
    if (t_.get(key)) get(key, &v), *out = v;
    used_.insert(key);
  }
  void get(const char* key, double* out) {
    if (auto* n = find(key)) {
      if (n->is_integer())
        *out = double(n->as_integer()->get());
      else if (n->is_floating_point())
        *out = n->as_floating_point()->get();
      else
        bad_type(key, *n, "a number");
    }
  }
  void get(const char* key, std::optional<double>* out) {
    double v = 0;
    if (t_.get(key)) get(key, &v), *out = v;
    used_.insert(key);
  }
  void get(const char* key, bool* out) {
    if (auto* n = find(key)) {
      if (!n->is_boolean()) bad_type(key, *n, "true or false");
      *out = n->as_boolean()->get();
    }
  }
  void get(const char* key, std::optional<bool>* out) {
    bool v = false;
    if (t_.get(key)) get(key, &v), *out = v;
    used_.insert(key);
  }
  void get(const char* key, std::string* out) {
    if (auto* n = find(key)) {
      if (!n->is_string()) bad_type(key, *n, "a string");
      *out = n->as_string()->get();
    }
  }
  void get_pair(const char* key, double* a, double* b) {
    if (auto* n = find(key)) {
      auto* arr = n->as_array();
      if (!arr || arr->size() != 2 || !(*arr)[0].is_number() || !(*arr)[1].is_number())
        bad_type(key, *n, "an array of two numbers");
      // value<double>() is empty for an integer a double cannot hold exactly.
      auto va = (*arr)[0].value<double>(), vb = (*arr)[1].value<double>();
      if (!va || !vb) bad_type(key, *n, "an array of two numbers");
      *a = *va;
      *b = *vb;
    }
  }
  // A sub-table: calls fn(Reader&) on it when present.
  template <typename F>
  void table(const char* key, F&& fn) {
    if (auto* n = find(key)) {
      if (!n->is_table()) bad_type(key, *n, "a table");
      Reader r(*n->as_table(), where(key), file_);
      fn(r);
      r.finish();
    }
  }
  // An array of tables: calls fn(Reader&, index) per entry.
  template <typename F>
  void list(const char* key, F&& fn) {
    if (auto* n = find(key)) {
      auto* arr = n->as_array();
      if (!arr) bad_type(key, *n, "an array of tables");
      for (size_t i = 0; i < arr->size(); i++) {
        auto* t = (*arr)[i].as_table();
        if (!t)
          fail("{}: {}.{} must be a table, found {}{}", file_, where(key), i, type_name((*arr)[i]),
               line_of((*arr)[i]));
        Reader r(*t, fmt::format("{}.{}", where(key), i), file_);
        fn(r, i);
        r.finish();
      }
    }
  }
  void finish() const {
    for (auto&& [k, v] : t_) {
      std::string key(k.str());
      if (!used_.count(key))
        fail("{}: unknown key '{}'{}; {}", file_, join_path(path_, key), line_of(v),
             suggestions(join_path(path_, key)));
    }
  }

 private:
  const toml::table& t_;
  std::string path_, file_;
  std::set<std::string> used_;
};

void read_blend(Reader& r, const char* key, std::vector<BlendEntry>* out) {
  out->clear();
  r.list(key, [&](Reader& e, size_t) {
    BlendEntry b;
    b.weight = 1.0;
    e.get("prefix", &b.prefix);
    e.get("weight", &b.weight);
    out->push_back(b);
  });
}

RunConfig from_table(const toml::table& root, const std::string& file) {
  RunConfig c;
  c.source = file;
  Reader r(root, "", file);
  r.table("model", [&](Reader& m) {
    m.get("init", &c.model.init);
    m.get("layers", &c.model.layers);
    // With a checkpoint to start from, an unset config means "the checkpoint's".
    if (!c.model.init.empty() && !m.has("config")) c.model.config.clear();
    m.get("config", &c.model.config);
  });
  r.table("optim", [&](Reader& o) {
    auto& s = c.optim;
    o.get("lr", &s.lr);
    o.get("min_lr", &s.min_lr);
    o.get("weight_decay", &s.weight_decay);
    o.get_pair("betas", &s.beta1, &s.beta2);
    o.get("eps", &s.eps);
    o.get("muon_momentum", &s.muon_momentum);
    o.get("muon_nesterov", &s.muon_nesterov);
    o.get("muon_ns_steps", &s.muon_ns_steps);
    o.get("clip", &s.clip);
    o.get("default_rules", &s.default_rules);
    o.list("rules", [&](Reader& e, size_t i) {
      ParamRule rule;
      std::string opt = "adamw";
      e.get("pattern", &rule.pattern);
      e.get("optimizer", &opt);
      rule.optimizer = optimizer_kind_from_name(opt, file + ": " + e.where("optimizer"));
      e.get("lr_mult", &rule.lr_mult);
      e.get("weight_decay", &rule.weight_decay);
      s.rules.push_back(rule);
    });
    o.table("balancing", [&](Reader& b) {
      b.get("enabled", &s.balancing.enabled);
      b.get("lr", &s.balancing.lr);
      b.get_pair("betas", &s.balancing.beta1, &s.balancing.beta2);
      b.get("eps", &s.balancing.eps);
    });
  });
  r.table("schedule", [&](Reader& s) {
    std::string kind(schedule_kind_name(c.schedule.kind));
    std::string shape(decay_shape_name(c.schedule.decay_shape));
    s.get("kind", &kind);
    c.schedule.kind = schedule_kind_from_name(kind, file + ": schedule.kind");
    s.get("warmup_steps", &c.schedule.warmup_steps);
    s.get("total_steps", &c.schedule.total_steps);
    s.get("decay_fraction", &c.schedule.decay_fraction);
    s.get("decay_shape", &shape);
    c.schedule.decay_shape = decay_shape_from_name(shape, file + ": schedule.decay_shape");
  });
  r.table("data", [&](Reader& d) {
    d.get("corpus", &c.data.corpus);
    d.get("tokenizer", &c.data.tokenizer);
    read_blend(d, "blend", &c.data.blend);
  });
  r.table("eval", [&](Reader& e) {
    e.get("every", &c.eval.every);
    e.get("batches", &c.eval.batches);
  });
  r.table("checkpoint", [&](Reader& k) {
    k.get("every", &c.checkpoint.every);
    k.get("keep_last", &c.checkpoint.keep_last);
    k.get("dir", &c.checkpoint.dir);
    k.get("async", &c.checkpoint.async);
    k.get("staging_mb", &c.checkpoint.staging_mb);
    k.get("snapshot", &c.checkpoint.snapshot);
  });
  r.table("train", [&](Reader& t) {
    t.get("seed", &c.train.seed);
    t.get("micro_batch", &c.train.micro_batch);
    t.get("grad_accum", &c.train.grad_accum);
    t.get("steps", &c.train.steps);
    t.get("seq_len", &c.train.seq_len);
    t.get("device", &c.train.device);
    t.get("log_every", &c.train.log_every);
    t.get("recompute", &c.train.recompute);
  });
  r.table("parallel", [&](Reader& q) {
    q.get("dp", &c.parallel.dp);
    q.get("cp", &c.parallel.cp);
    q.get("backend", &c.parallel.backend);
    q.get("bucket_mb", &c.parallel.bucket_mb);
    q.get("overlap", &c.parallel.overlap);
  });
  r.table("fault_tolerance", [&](Reader& q) {
    q.get("collective_timeout", &c.fault_tolerance.collective_timeout);
    q.get("nonfinite", &c.fault_tolerance.nonfinite);
    q.get("loss_spike", &c.fault_tolerance.loss_spike);
    q.get("loss_spike_window", &c.fault_tolerance.loss_spike_window);
  });
  r.list("phase", [&](Reader& p, size_t) {
    PhaseSection ph;
    p.get("name", &ph.name);
    p.get("tokens", &ph.tokens);
    p.get("steps", &ph.steps);
    p.get("seq_len", &ph.seq_len);
    p.get("rope_theta", &ph.rope_theta);
    read_blend(p, "blend", &ph.blend);
    p.get("batch_size", &ph.batch_size);
    p.get("batch_start", &ph.batch_start);
    p.get("batch_ramp_tokens", &ph.batch_ramp_tokens);
    p.get("cp", &ph.cp);
    p.get("recompute", &ph.recompute);
    c.phases.push_back(ph);
  });
  r.finish();
  return c;
}

toml::array blend_to_toml(const std::vector<BlendEntry>& blend) {
  toml::array a;
  for (const auto& b : blend) a.push_back(toml::table{{"prefix", b.prefix}, {"weight", b.weight}});
  return a;
}

toml::table to_table(const RunConfig& c) {
  toml::table root;
  root.insert(
      "model",
      toml::table{{"config", c.model.config}, {"init", c.model.init}, {"layers", c.model.layers}});
  const auto& o = c.optim;
  toml::table optim{{"lr", o.lr},
                    {"min_lr", o.min_lr},
                    {"weight_decay", o.weight_decay},
                    {"betas", toml::array{o.beta1, o.beta2}},
                    {"eps", o.eps},
                    {"muon_momentum", o.muon_momentum},
                    {"muon_nesterov", o.muon_nesterov},
                    {"muon_ns_steps", o.muon_ns_steps},
                    {"clip", o.clip},
                    {"default_rules", o.default_rules}};
  toml::array rules;
  for (const auto& r : o.rules) {
    toml::table t{{"pattern", r.pattern},
                  {"optimizer", std::string(optimizer_kind_name(r.optimizer))},
                  {"lr_mult", r.lr_mult}};
    if (r.weight_decay) t.insert("weight_decay", *r.weight_decay);
    rules.push_back(std::move(t));
  }
  optim.insert("rules", std::move(rules));
  optim.insert("balancing",
               toml::table{{"enabled", o.balancing.enabled},
                           {"lr", o.balancing.lr},
                           {"betas", toml::array{o.balancing.beta1, o.balancing.beta2}},
                           {"eps", o.balancing.eps}});
  root.insert("optim", std::move(optim));
  root.insert("schedule",
              toml::table{{"kind", std::string(schedule_kind_name(c.schedule.kind))},
                          {"warmup_steps", c.schedule.warmup_steps},
                          {"total_steps", c.schedule.total_steps},
                          {"decay_fraction", c.schedule.decay_fraction},
                          {"decay_shape", std::string(decay_shape_name(c.schedule.decay_shape))}});
  root.insert("data", toml::table{{"corpus", c.data.corpus},
                                  {"tokenizer", c.data.tokenizer},
                                  {"blend", blend_to_toml(c.data.blend)}});
  root.insert("eval", toml::table{{"every", c.eval.every}, {"batches", c.eval.batches}});
  root.insert("checkpoint", toml::table{{"every", c.checkpoint.every},
                                        {"keep_last", c.checkpoint.keep_last},
                                        {"dir", c.checkpoint.dir},
                                        {"async", c.checkpoint.async},
                                        {"staging_mb", c.checkpoint.staging_mb},
                                        {"snapshot", c.checkpoint.snapshot}});
  root.insert("train", toml::table{{"seed", c.train.seed},
                                   {"micro_batch", c.train.micro_batch},
                                   {"grad_accum", c.train.grad_accum},
                                   {"steps", c.train.steps},
                                   {"seq_len", c.train.seq_len},
                                   {"device", c.train.device},
                                   {"log_every", c.train.log_every},
                                   {"recompute", c.train.recompute}});
  root.insert("parallel", toml::table{{"dp", c.parallel.dp},
                                      {"cp", c.parallel.cp},
                                      {"backend", c.parallel.backend},
                                      {"bucket_mb", c.parallel.bucket_mb},
                                      {"overlap", c.parallel.overlap}});
  root.insert("fault_tolerance",
              toml::table{{"collective_timeout", c.fault_tolerance.collective_timeout},
                          {"nonfinite", c.fault_tolerance.nonfinite},
                          {"loss_spike", c.fault_tolerance.loss_spike},
                          {"loss_spike_window", c.fault_tolerance.loss_spike_window}});
  toml::array phases;
  for (const auto& p : c.phases) {
    toml::table t{{"name", p.name},
                  {"tokens", p.tokens},
                  {"steps", p.steps},
                  {"blend", blend_to_toml(p.blend)},
                  {"batch_start", p.batch_start},
                  {"batch_ramp_tokens", p.batch_ramp_tokens}};
    if (p.seq_len) t.insert("seq_len", *p.seq_len);
    if (p.rope_theta) t.insert("rope_theta", *p.rope_theta);
    if (p.batch_size) t.insert("batch_size", *p.batch_size);
    if (p.cp) t.insert("cp", *p.cp);
    if (p.recompute) t.insert("recompute", *p.recompute);
    phases.push_back(std::move(t));
  }
  root.insert("phase", std::move(phases));
  return root;
}

// Every key with a value of its type: optional fields set, one entry in each list.
const toml::table& schema() {
  static const toml::table s = [] {
    RunConfig c;
    c.optim.rules.push_back({"*", OptimizerKind::AdamW, 1.0, 0.0});
    c.data.blend.push_back({"p", 1.0});
    PhaseSection p;
    p.seq_len = 1;
    p.rope_theta = 1.0;
    p.batch_size = 1;
    p.cp = 1;
    p.blend.push_back({"p", 1.0});
    c.phases.push_back(p);
    return to_table(c);
  }();
  return s;
}

void collect_paths(const toml::table& t, const std::string& prefix, std::vector<std::string>* out) {
  for (auto&& [k, v] : t) {
    std::string p = join_path(prefix, std::string(k.str()));
    if (auto* sub = v.as_table()) {
      collect_paths(*sub, p, out);
    } else if (auto* arr = v.as_array(); arr && !arr->empty() && (*arr)[0].is_table()) {
      collect_paths(*(*arr)[0].as_table(), p + ".N", out);
    } else {
      out->push_back(p);
    }
  }
}

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  for (;;) {
    size_t j = s.find('.', i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) return out;
    i = j + 1;
  }
}

// Parses `text` as a value shaped like `like` (the schema's node for the key).
void set_typed(toml::table& parent, const std::string& key, const toml::node& like,
               const std::string& text, const std::string& path) {
  auto bad = [&](const char* expected) {
    fail("override --{}={}: expected {}", path, text, expected);
  };
  if (like.is_table()) {
    fail("override --{}: '{}' is a section; name a key inside it (such as --{}.<key>=...)", path,
         path, path);
  } else if (like.is_integer()) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size()) bad("an integer");
    parent.insert_or_assign(key, v);
  } else if (like.is_floating_point()) {
    char* end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size()) bad("a number");
    parent.insert_or_assign(key, v);
  } else if (like.is_boolean()) {
    if (text == "true" || text == "1")
      parent.insert_or_assign(key, true);
    else if (text == "false" || text == "0")
      parent.insert_or_assign(key, false);
    else
      bad("true or false");
  } else if (like.is_string()) {
    std::string v = text;
    if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
      v = v.substr(1, v.size() - 2);
    parent.insert_or_assign(key, v);
  } else if (auto* arr = like.as_array(); arr && (arr->empty() || !(*arr)[0].is_table())) {
    toml::table t;
    try {
      t = toml::parse("v = " + text);
    } catch (const toml::parse_error& e) {
      bad("an inline TOML array such as [0.9, 0.95]");
    }
    if (!t["v"].is_array()) bad("an inline TOML array such as [0.9, 0.95]");
    parent.insert_or_assign(key, *t["v"].as_array());
  } else {
    fail("override --{}: a list of tables cannot be set from the command line; set it in the file",
         path);
  }
}

void apply_override(toml::table& root, const std::string& arg) {
  std::string a = arg.rfind("--", 0) == 0 ? arg.substr(2) : arg;
  const size_t eq = a.find('=');
  ZAYA_CHECK(eq != std::string::npos && eq > 0,
             "override '{}': expected --section.key=value (for example --optim.lr=3e-4)", arg);
  const std::string path = a.substr(0, eq), text = a.substr(eq + 1);
  const auto segs = split_dots(path);
  const toml::node* like = &schema();
  toml::node* node = &root;
  for (size_t i = 0; i < segs.size(); i++) {
    const std::string& s = segs[i];
    const bool last = i + 1 == segs.size();
    if (auto* st = like->as_table()) {
      const toml::node* next_like = st->get(s);
      const bool is_list = next_like && next_like->is_array() && !next_like->as_array()->empty() &&
                           (*next_like->as_array())[0].is_table();
      // A plain value in the middle of the path ("optim.lr.x") is as unknown as a missing key.
      if (!next_like || (!last && !next_like->is_table() && !is_list))
        fail("unknown override key '{}'; {}", path, suggestions(path));
      auto* t = node->as_table();
      if (!t)
        fail("override --{}: '{}' is {} in the config, expected a table", path,
             fmt::join(segs.begin(), segs.begin() + long(i), "."), type_name(*node));
      if (last) {
        set_typed(*t, s, *next_like, text, path);
        return;
      }
      if (!t->get(s)) {
        // Absent from the file: create the section (lists cannot be created by index).
        if (next_like->is_table())
          t->insert(s, toml::table{});
        else
          fail("override --{}: '{}' has no entries in the config to override", path,
               join_path("", s));
      }
      node = t->get(s);
      like = next_like;
    } else if (auto* la = like->as_array(); la && !la->empty() && (*la)[0].is_table()) {
      size_t idx = 0;
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), idx);
      if (ec != std::errc() || p != s.data() + s.size())
        fail("override --{}: '{}' is a list; expected an index, found '{}'", path,
             fmt::join(segs.begin(), segs.begin() + long(i), "."), s);
      auto* arr = node->as_array();
      const size_t n = arr ? arr->size() : 0;
      if (idx >= n)
        fail("override --{}: '{}' has {} entries, so index {} does not exist", path,
             fmt::join(segs.begin(), segs.begin() + long(i), "."), n, idx);
      if (last) fail("override --{}: a whole list entry cannot be set; name a key inside it", path);
      node = arr->get(idx);
      like = &(*la)[0];
    } else {
      fail("unknown override key '{}'; {}", path, suggestions(path));
    }
    if (!node->is_table() && !node->is_array())
      fail("override --{}: '{}' is {} in the config, not a section", path,
           fmt::join(segs.begin(), segs.begin() + long(i) + 1, "."), type_name(*node));
  }
  fail("override '{}': name a key, not a section", arg);
}

RunConfig finish(toml::table root, const std::string& where,
                 const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(root, o);
  RunConfig c = from_table(root, where);
  c.validate();
  return c;
}

}  // namespace

bool is_config_override(const std::string& arg) {
  return arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos &&
         arg.find('.') < arg.find('=');
}

std::vector<std::string> RunConfig::key_paths() {
  std::vector<std::string> out;
  collect_paths(schema(), "", &out);
  return out;
}

namespace {

// Runs fn, turning the zaya::Errors it throws into ConfigErrors with the same message.
template <typename Fn>
RunConfig as_config_error(Fn&& fn) {
  try {
    return fn();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
}

RunConfig parse_toml(const std::string& text, const std::string& where,
                     const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    fail("{}:{}:{}: {}", where, e.source().begin.line, e.source().begin.column, e.description());
  }
  check_toml_keys_read(text, root, where);
  return finish(std::move(root), where, overrides);
}

}  // namespace

RunConfig RunConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
  return as_config_error([&] {
    std::error_code ec;
    ZAYA_CHECK(std::filesystem::is_regular_file(path, ec),
               "run config '{}' does not exist or is not a file", path);
    return parse_toml(read_file(path), path, overrides);
  });
}

RunConfig RunConfig::from_toml(const std::string& text, const std::string& where,
                               const std::vector<std::string>& overrides) {
  return as_config_error([&] { return parse_toml(text, where, overrides); });
}

RunConfig RunConfig::defaults(const std::vector<std::string>& overrides) {
  return as_config_error([&] { return finish(toml::table{}, "<defaults>", overrides); });
}

// toml++ prints doubles with 17 significant digits (0.9 → 0.90000000000000002): exact but hard to
// read. Rewrite each float token outside strings as the shortest text that parses back to the same
// double (fmt's "{}"), keeping a '.' or exponent so TOML still reads it as a float.
static std::string shorten_floats(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  size_t i = 0;
  while (i < in.size()) {
    const char ch = in[i];
    if (ch == '\'' || ch == '"') {  // copy a string literal verbatim ("..." may hold \" escapes)
      size_t j = i + 1;
      while (j < in.size() && in[j] != ch) j += (ch == '"' && in[j] == '\\') ? 2 : 1;
      out.append(in, i, j + 1 - i);
      i = j + 1;
      continue;
    }
    const bool starts_number =
        std::isdigit((unsigned char)ch) ||
        ((ch == '-' || ch == '+') && i + 1 < in.size() && std::isdigit((unsigned char)in[i + 1]));
    const bool after_word = i > 0 && (std::isalnum((unsigned char)in[i - 1]) || in[i - 1] == '_');
    if (starts_number && !after_word) {
      size_t j = i + 1;
      while (j < in.size() &&
             (std::isalnum((unsigned char)in[j]) || in[j] == '.' || in[j] == '_' ||
              ((in[j] == '-' || in[j] == '+') && (in[j - 1] == 'e' || in[j - 1] == 'E'))))
        j++;
      std::string tok = in.substr(i, j - i);
      const bool is_float = tok.find_first_of(".eE") != std::string::npos &&
                            tok.find('_') == std::string::npos &&
                            tok.find(':') == std::string::npos;
      char* end = nullptr;
      const double v = is_float ? std::strtod(tok.c_str(), &end) : 0.0;
      if (is_float && end == tok.c_str() + tok.size() && std::isfinite(v)) {
        std::string s = fmt::format("{}", v);
        if (s.find_first_of(".eE") == std::string::npos) s += ".0";
        out += s;
      } else {
        out += tok;
      }
      i = j;
      continue;
    }
    out += ch;
    i++;
  }
  return out;
}

std::string RunConfig::to_toml() const {
  std::ostringstream ss;
  ss << toml::toml_formatter(to_table(*this));
  ss << "\n";
  return shorten_floats(ss.str());
}

OptimizerSettings OptimSection::optimizer_settings() const {
  OptimizerSettings s;
  s.weight_decay = weight_decay;
  s.adamw = {beta1, beta2, eps};
  s.muon.momentum = muon_momentum;
  s.muon.nesterov = muon_nesterov;
  s.muon.ns_steps = int(muon_ns_steps);
  s.rules = rules;
  s.default_rules = default_rules;
  return s;
}

void RunConfig::validate() const {
  const std::string& f = source;
  auto check = [&](bool ok, const std::string& field, const auto& value, const char* expected) {
    if (!ok) fail("{}: {} = {} is invalid: expected {}", f, field, value, expected);
  };
  check(!model.config.empty() || !model.init.empty(), "model.config", "\"\"",
        "a preset name or a config.json path (\"\" only with model.init)");
  if (!model.init.empty()) {
    // Checked here, before any work, so a typo does not surface after the data preparation.
    std::error_code ec;
    if (!std::filesystem::is_directory(model.init, ec))
      fail(
          "{}: model.init = \"{}\" is not a directory (expected a Hugging Face checkpoint: "
          "config.json and safetensors)",
          f, model.init);
    if (!std::filesystem::is_regular_file(std::filesystem::path(model.init) / "config.json", ec))
      fail(
          "{}: model.init = \"{}\" has no config.json (expected a Hugging Face checkpoint "
          "directory)",
          f, model.init);
  }
  if (!model.config.empty()) {
    const auto presets = ZayaConfig::preset_names();
    const bool preset = std::find(presets.begin(), presets.end(), model.config) != presets.end();
    std::error_code ec;
    if (!preset && !std::filesystem::exists(model.config, ec))
      fail("{}: model.config = \"{}\" is neither a preset ({}) nor an existing path", f,
           model.config, fmt::join(presets, ", "));
  }
  // Optimizer.
  check(std::isfinite(optim.lr) && optim.lr > 0, "optim.lr", optim.lr, "a number > 0");
  check(std::isfinite(optim.min_lr) && optim.min_lr >= 0 && optim.min_lr <= optim.lr,
        "optim.min_lr", optim.min_lr, "a number in [0, optim.lr]");
  check(optim.clip >= 0 && std::isfinite(optim.clip), "optim.clip", optim.clip,
        "a number >= 0 (0 turns clipping off)");
  check(optim.muon_ns_steps >= 1 && optim.muon_ns_steps <= 100, "optim.muon_ns_steps",
        optim.muon_ns_steps, "an integer in [1, 100]");
  optim.optimizer_settings().validate(f + ": optim");
  optim.balancing.validate(f + ": optim.balancing");
  // Schedule.
  check(schedule.warmup_steps >= 0, "schedule.warmup_steps", schedule.warmup_steps,
        "an integer >= 0");
  check(schedule.total_steps >= 0, "schedule.total_steps", schedule.total_steps,
        "an integer >= 0 (0: train.steps)");
  check(schedule.decay_fraction > 0 && schedule.decay_fraction <= 1, "schedule.decay_fraction",
        schedule.decay_fraction, "a number in (0, 1]");
  // Train.
  check(train.seed >= 0, "train.seed", train.seed, "an integer >= 0");
  check(train.micro_batch >= 1, "train.micro_batch", train.micro_batch, "an integer >= 1");
  check(train.grad_accum >= 1, "train.grad_accum", train.grad_accum, "an integer >= 1");
  check(train.steps >= 1, "train.steps", train.steps, "an integer >= 1");
  check(train.seq_len >= 1, "train.seq_len", train.seq_len, "an integer >= 1");
  check(train.device == "cpu" || train.device == "cuda", "train.device",
        fmt::format("\"{}\"", train.device), "\"cpu\" or \"cuda\"");
  check(train.log_every >= 1, "train.log_every", train.log_every, "an integer >= 1");
  checked_mul(train.micro_batch, train.grad_accum, f + ": train.micro_batch × train.grad_accum");
  // Data, eval, checkpoint.
  auto check_blend = [&](const std::vector<BlendEntry>& blend, const std::string& key) {
    for (size_t i = 0; i < blend.size(); i++) {
      check(!blend[i].prefix.empty(), fmt::format("{}.{}.prefix", key, i), "\"\"",
            "a dataset path prefix");
      check(std::isfinite(blend[i].weight) && blend[i].weight > 0,
            fmt::format("{}.{}.weight", key, i), blend[i].weight, "a number > 0");
    }
  };
  check_blend(data.blend, "data.blend");
  check(!data.corpus.empty() || !data.blend.empty(), "data.corpus", "\"\"",
        "a built-in corpus name when data.blend is empty");
  check(!data.tokenizer.empty(), "data.tokenizer", "\"\"", "\"bytes\" or a tokenizer.json path");
  check(model.layers >= 0 && model.layers <= 4096, "model.layers", model.layers,
        "an integer from 0 to 4096 (0: the config's own layer count)");
  check(eval.every >= 0, "eval.every", eval.every, "an integer >= 0 (0 turns evaluation off)");
  check(eval.batches >= 1, "eval.batches", eval.batches, "an integer >= 1");
  check(checkpoint.every >= 0, "checkpoint.every", checkpoint.every,
        "an integer >= 0 (0: only at the end)");
  check(checkpoint.keep_last >= 1, "checkpoint.keep_last", checkpoint.keep_last, "an integer >= 1");
  check(!checkpoint.dir.empty(), "checkpoint.dir", "\"\"", "a directory path");
  check(checkpoint.staging_mb >= 0 && checkpoint.staging_mb <= (int64_t(1) << 30),
        "checkpoint.staging_mb", checkpoint.staging_mb,
        "an integer from 0 to 2^30 (MiB; 0: one save's size)");
  check(checkpoint.snapshot == "auto" || checkpoint.snapshot == "device" ||
            checkpoint.snapshot == "host",
        "checkpoint.snapshot", fmt::format("\"{}\"", checkpoint.snapshot),
        "\"auto\", \"device\" or \"host\"");
  // Parallel.
  check(parallel.dp >= 0, "parallel.dp", parallel.dp, "an integer >= 0 (0: the world size)");
  check(parallel.cp >= 1 && parallel.cp <= 4096, "parallel.cp", parallel.cp,
        "an integer from 1 to 4096 (1: no context parallelism)");
  // Context parallelism cuts every sequence into 2·cp chunks of at least the convolutions'
  // history (2 tokens for ZAYA1's kernels): seq_len must be a multiple of 2·cp.
  auto check_cp_seq = [&](const std::string& what, int64_t cp, int64_t seq) {
    if (cp > 1 && seq % (2 * cp) != 0)
      fail(
          "{}: {} = {} is not divisible by 2·cp = {} (each of the {} context-parallel ranks "
          "holds two chunks of every sequence)",
          f, what, seq, 2 * cp, cp);
  };
  if (phases.empty()) check_cp_seq("train.seq_len", parallel.cp, train.seq_len);
  check(parallel.backend == "auto" || parallel.backend == "nccl" || parallel.backend == "mpi",
        "parallel.backend", fmt::format("\"{}\"", parallel.backend),
        "\"auto\", \"nccl\" or \"mpi\"");
  check(train.device == "cuda" || parallel.backend != "nccl", "parallel.backend", "\"nccl\"",
        "\"mpi\" or \"auto\" with train.device = \"cpu\" (NCCL needs GPUs)");
  check(std::isfinite(parallel.bucket_mb) && parallel.bucket_mb > 0 && parallel.bucket_mb <= 4096,
        "parallel.bucket_mb", parallel.bucket_mb, "a number in (0, 4096]");
  // Fault tolerance.
  const auto& ft = fault_tolerance;
  check(std::isfinite(ft.collective_timeout) && ft.collective_timeout >= 0,
        "fault_tolerance.collective_timeout", ft.collective_timeout,
        "a number of seconds >= 0 (0 turns the watchdog off)");
  check(ft.nonfinite == "auto" || ft.nonfinite == "skip" || ft.nonfinite == "restart",
        "fault_tolerance.nonfinite", fmt::format("\"{}\"", ft.nonfinite),
        "\"auto\", \"skip\" or \"restart\"");
  check(ft.loss_spike == 0 || (std::isfinite(ft.loss_spike) && ft.loss_spike > 1),
        "fault_tolerance.loss_spike", ft.loss_spike, "0 (off) or a factor > 1");
  check(ft.loss_spike_window >= 1, "fault_tolerance.loss_spike_window", ft.loss_spike_window,
        "an integer >= 1");
  // Phases.
  std::set<std::string> names;
  int by_tokens = 0, by_steps = 0;
  int64_t budget_sum = 0;  // phase boundaries are sums of budgets
  for (size_t i = 0; i < phases.size(); i++) {
    const auto& p = phases[i];
    const std::string k = fmt::format("phase.{}", i);
    check(!p.name.empty(), k + ".name", "\"\"", "a non-empty name");
    if (!names.insert(p.name).second)
      fail("{}: {}.name = \"{}\" is invalid: another phase has that name", f, k, p.name);
    check(p.tokens >= 0, k + ".tokens", p.tokens, "an integer >= 0");
    check(p.steps >= 0, k + ".steps", p.steps, "an integer >= 0");
    if (p.tokens > 0 && p.steps > 0)
      fail("{}: {} sets both tokens and steps; give its budget in one unit", f, k);
    if (p.tokens == 0 && p.steps == 0 && i + 1 < phases.size())
      fail("{}: {} has no budget (tokens or steps); only the last phase may run open-ended", f, k);
    by_tokens += p.tokens > 0;
    by_steps += p.steps > 0;
    budget_sum = checked_add(budget_sum, p.tokens + p.steps, f + ": the phase budgets' sum");
    if (p.seq_len) check(*p.seq_len >= 1, k + ".seq_len", *p.seq_len, "an integer >= 1");
    if (p.cp)
      check(*p.cp >= 1 && *p.cp <= 4096, k + ".cp", *p.cp,
            "an integer from 1 to 4096 (1: no context parallelism)");
    check_cp_seq(p.seq_len ? k + ".seq_len" : "train.seq_len (of " + k + ")",
                 p.cp.value_or(parallel.cp), p.seq_len.value_or(train.seq_len));
    if (p.rope_theta)
      check(std::isfinite(*p.rope_theta) && *p.rope_theta > 0, k + ".rope_theta", *p.rope_theta,
            "a number > 0");
    check_blend(p.blend, k + ".blend");
    if (p.batch_size)
      check(*p.batch_size >= 1, k + ".batch_size", *p.batch_size, "an integer >= 1");
    check(p.batch_start >= 0, k + ".batch_start", p.batch_start, "an integer >= 0");
    check(p.batch_ramp_tokens >= 0, k + ".batch_ramp_tokens", p.batch_ramp_tokens,
          "an integer >= 0");
    if (p.batch_ramp_tokens > 0) {
      check(p.batch_start >= 1, k + ".batch_start", p.batch_start,
            "an integer >= 1 when batch_ramp_tokens is set");
      const int64_t full = p.batch_size.value_or(train.micro_batch * train.grad_accum);
      if (p.batch_start > full)
        fail("{}: {}.batch_start = {} is invalid: expected at most the phase's batch size {}", f, k,
             p.batch_start, full);
      if (by_steps > 0 && i > 0)
        fail(
            "{}: {}.batch_ramp_tokens: a batch ramp in a step-budget phase is only supported in "
            "the first phase (where it starts at token 0)",
            f, k);
    }
  }
  if (by_tokens > 0 && by_steps > 0)
    fail("{}: phases mix token and step budgets; give every phase's budget in the same unit", f);
}

RunConfig::ResolvedParallel RunConfig::resolve_parallel(int64_t world) const {
  ZAYA_CHECK(world >= 1, "resolve_parallel: world size {} must be >= 1", world);
  ResolvedParallel r;
  for (size_t i = 0; i <= phases.size(); i++) {
    const int64_t cp = i < phases.size() ? phase_cp(i) : parallel.cp;
    if (world % cp != 0)
      fail("{}: {} = {} does not divide the world size {} (the job has {} ranks)", source,
           i < phases.size() && phases[i].cp ? fmt::format("phase.{}.cp", i) : "parallel.cp", cp,
           world, world);
  }
  r.dp = parallel.dp == 0 ? world / parallel.cp : parallel.dp;
  if (world % r.dp != 0)
    fail("{}: parallel.dp = {} does not divide the world size {} (the job has {} ranks)", source,
         r.dp, world, world);
  if (r.dp * parallel.cp != world)
    fail(
        "{}: parallel.dp = {} with {} ranks and parallel.cp = {}: the other factor ({}) would be "
        "tensor, pipeline or expert parallelism, which zaya does not have; set parallel.dp = {} "
        "or leave it 0",
        source, r.dp, world, parallel.cp, world / (r.dp * parallel.cp), world / parallel.cp);
  r.backend =
      parallel.backend == "auto" ? (train.device == "cuda" ? "nccl" : "mpi") : parallel.backend;
  r.bucket_elems = std::max<int64_t>(1, int64_t(parallel.bucket_mb * double(1 << 20) / 4.0));
  for (size_t i = 0; i < phases.size(); i++) {
    const auto& p = phases[i];
    const int64_t dp = world / phase_cp(i), quantum = train.micro_batch * dp;
    if (p.batch_size && *p.batch_size % quantum != 0)
      fail(
          "{}: phase.{}.batch_size = {} (global sequences per step) is not divisible by "
          "train.micro_batch × {} = {} × {} = {}",
          source, i, *p.batch_size,
          phase_cp(i) > 1 ? fmt::format("data-parallel groups (world / cp {})", phase_cp(i))
                          : std::string("parallel.dp"),
          train.micro_batch, dp, quantum);
  }
  return r;
}

// config.json fields that decide a tensor's shape (expected_tensor_shapes) or the stack: a
// checkpoint cannot be trained as a model that differs in one of them.
constexpr const char* kShapeFields[] = {"vocab_size",
                                        "hidden_size",
                                        "num_hidden_layers",
                                        "num_attention_heads",
                                        "num_key_value_heads",
                                        "head_dim",
                                        "moe_intermediate_size",
                                        "num_experts",
                                        "num_experts_per_tok",
                                        "router_hidden_size",
                                        "cca_time0",
                                        "cca_time1",
                                        "tie_word_embeddings"};

ZayaConfig RunConfig::resolve_model(std::vector<std::string>* notes) const {
  const auto layered = [&](ZayaConfig c) {
    if (model.layers > 0) {
      c = c.with_layers(model.layers);
      c.validate(fmt::format("{} (model.config = \"{}\" with model.layers = {})", source,
                             model.config, model.layers));
    }
    return c;
  };
  const auto named = [&] {
    const auto presets = ZayaConfig::preset_names();
    if (std::find(presets.begin(), presets.end(), model.config) != presets.end())
      return layered(ZayaConfig::preset(model.config));
    return layered(ZayaConfig::load(model.config));
  };
  if (model.init.empty()) return named();
  ZayaConfig ck = load_model_config(model.init);
  if (model.config.empty()) return ck;
  // Both given: the checkpoint decides; model.config may only restate its shapes.
  const nlohmann::json want = named().to_json(), have = ck.to_json();
  std::vector<std::string> shape_diffs;
  for (const char* k : kShapeFields)
    if (want.value(k, nlohmann::json()) != have.value(k, nlohmann::json()))
      shape_diffs.push_back(fmt::format("{} = {} in model.config, {} in the checkpoint", k,
                                        want.value(k, nlohmann::json()).dump(),
                                        have.value(k, nlohmann::json()).dump()));
  if (!shape_diffs.empty())
    fail(
        "{}: model.config = \"{}\" disagrees with the checkpoint of model.init = \"{}\": {}; the "
        "architecture comes from the checkpoint, so leave model.config out (or \"\") or make it "
        "agree",
        source, model.config, model.init, fmt::join(shape_diffs, "; "));
  if (notes) {
    std::set<std::string> keys;
    for (auto& [k, v] : want.items()) keys.insert(k);
    for (auto& [k, v] : have.items()) keys.insert(k);
    for (const std::string& k : keys) {
      const bool shape = std::any_of(std::begin(kShapeFields), std::end(kShapeFields),
                                     [&](const char* s) { return k == s; });
      const nlohmann::json w = want.value(k, nlohmann::json()), h = have.value(k, nlohmann::json());
      if (!shape && k != "dtype" && w != h)
        notes->push_back(fmt::format("{} = {} in model.config, {} in the checkpoint (used)", k,
                                     w.dump(), h.dump()));
    }
  }
  return ck;
}

ScheduleSettings RunConfig::resolved_schedule() const {
  ScheduleSettings s = schedule;
  if (s.total_steps == 0) s.total_steps = train.steps;
  return s;
}

int64_t RunConfig::phase_cp(size_t i) const {
  return i < phases.size() && phases[i].cp ? *phases[i].cp : parallel.cp;
}

PhaseState RunConfig::phase_at(int64_t step, int64_t tokens, int64_t world,
                               double model_rope_theta) const {
  ZAYA_CHECK(world >= 1, "phase_at: world must be >= 1, got {}", world);
  ZAYA_CHECK(step >= 0 && tokens >= 0, "phase_at: step ({}) and tokens ({}) must be >= 0", step,
             tokens);
  PhaseState st;
  if (phases.empty()) {
    st.cp = parallel.cp;
    ZAYA_CHECK(world % st.cp == 0, "{}: parallel.cp = {} does not divide the world size {}", source,
               st.cp, world);
    st.dp = world / st.cp;
    st.recompute = train.recompute;
    const int64_t quantum = train.micro_batch * st.dp;  // sequences per micro-step, all groups
    const int64_t default_batch = quantum * train.grad_accum;
    st.name = "main";
    st.seq_len = train.seq_len;
    st.rope_theta = model_rope_theta;
    st.batch_size = default_batch;
    st.micro_steps = train.grad_accum;
    st.blend = data.blend;
    st.past_end = step >= train.steps;
    return st;
  }
  // Phases run back to back; all budgets are in one unit (validated), so the boundaries are sums.
  const bool by_tokens =
      std::any_of(phases.begin(), phases.end(), [](const PhaseSection& p) { return p.tokens > 0; });
  const int64_t pos = by_tokens ? tokens : step;
  int64_t start = 0;
  size_t i = 0;
  for (; i < phases.size(); i++) {
    const int64_t budget = by_tokens ? phases[i].tokens : phases[i].steps;
    if (budget == 0 || pos < start + budget) break;  // open-ended last phase, or inside this one
    start += budget;
  }
  if (i == phases.size()) {
    st.past_end = true;
    i = phases.size() - 1;
    start -= by_tokens ? phases[i].tokens : phases[i].steps;
  }
  const PhaseSection& p = phases[i];
  st.cp = phase_cp(i);
  ZAYA_CHECK(world % st.cp == 0,
             "{}: phase '{}' has cp = {}, which does not divide the world size {}", source, p.name,
             st.cp, world);
  st.dp = world / st.cp;
  st.recompute = p.recompute.value_or(train.recompute);
  const int64_t quantum = train.micro_batch * st.dp;  // sequences per micro-step, all groups
  const int64_t default_batch = quantum * train.grad_accum;
  st.index = i;
  st.name = p.name;
  st.seq_len = p.seq_len.value_or(train.seq_len);
  st.rope_theta = p.rope_theta.value_or(model_rope_theta);
  st.blend = p.blend.empty() ? data.blend : p.blend;
  const int64_t full = p.batch_size.value_or(default_batch);
  int64_t batch = full;
  if (p.batch_ramp_tokens > 0) {
    // Step-budget phases only ramp in phase 0, whose token start is 0 (validated).
    const int64_t into = by_tokens ? tokens - start : tokens;
    const double f = std::min(1.0, double(into) / double(p.batch_ramp_tokens));
    batch = p.batch_start + int64_t(std::floor(f * double(full - p.batch_start)));
  }
  // Whole micro-steps on every rank: round down to the quantum, but never below one micro-step.
  batch = std::max(quantum, batch / quantum * quantum);
  ZAYA_CHECK(full % quantum == 0,
             "{}: phase '{}' batch_size {} is not a multiple of micro_batch × data-parallel ranks "
             "({} × {})",
             source, p.name, full, train.micro_batch, st.dp);
  st.batch_size = batch;
  st.micro_steps = batch / quantum;
  return st;
}

}  // namespace zaya
