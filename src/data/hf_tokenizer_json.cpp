// Streaming reader of tokenizer.json (see hf_tokenizer_json.h): a SAX handler that builds the tree
// for everything except model.vocab and model.merges, which it writes into flat vectors.
#include "data/hf_tokenizer_json.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json.h"

namespace zaya::hf {

void JsonFile::bad(const std::string& where, const std::string& what) const {
  fail("{}: {} {}", path, where, what);
}

const json& JsonFile::field(const json& obj, const char* key, const std::string& where) const {
  if (!obj.is_object()) bad(where, "must be an object, not " + obj.dump());
  auto it = obj.find(key);
  if (it == obj.end()) bad(where + "." + key, "is missing");
  return *it;
}

std::string JsonFile::str(const json& obj, const char* key, const std::string& where) const {
  const json& v = field(obj, key, where);
  if (!v.is_string()) bad(where + "." + key, "must be a string, not " + v.dump());
  return v.get<std::string>();
}

bool JsonFile::flag(const json& obj, const char* key, const std::string& where, bool dflt) const {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) bad(where + "." + key, "must be true or false, not " + it->dump());
  return it->get<bool>();
}

std::string JsonFile::opt_str(const json& obj, const char* key, const std::string& where) const {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return {};
  if (!it->is_string()) bad(where + "." + key, "must be a string or null, not " + it->dump());
  return it->get<std::string>();
}

int64_t JsonFile::integer(const json& v, const std::string& where, int64_t lo, int64_t hi) const {
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    bad(where, fmt::format("must be an integer in [{}, {}], not {}", lo, hi, v.dump()));
  return v.get<int64_t>();
}

std::string JsonFile::string_pattern(const json& obj, const std::string& where) const {
  const json& p = field(obj, "pattern", where);
  if (p.is_object() && p.contains("String") && p["String"].is_string())
    return p["String"].get<std::string>();
  bad(where + ".pattern",
      "must be {\"String\": ...} (regex patterns are not supported), not " + p.dump());
}

namespace {

class Reader final : public nlohmann::json_sax<json> {
 public:
  Reader(const JsonFile& file, TokenizerJson& out) : file_(file), out_(out) {}

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool binary(binary_t& v) override { return value(json(v)); }
  bool string(string_t& s) override {
    if (mode_ == kMerges) {
      if (merge_depth_ == 1) {
        merge_parts_.push_back(std::move(s));
        return true;
      }
      // The older "left right" form.
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        file_.bad(merge_where(), "'" + s + "' must be two tokens separated by one space");
      out_.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      return true;
    }
    return value(json(std::move(s)));
  }

  bool start_object(std::size_t) override {
    if (mode_ == kMerges) bad_merge("{...}");
    if (mode_ == kVocab) file_.bad(vocab_where(), "must be an integer id, not an object");
    if (under_model() && key_ == "vocab") {
      out_.has_vocab = true;
      (*stack_.back())["vocab"] = json::object();
      mode_ = kVocab;
      return true;
    }
    return open(json::object());
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == kVocab) {
      mode_ = kTree;
      return true;
    }
    stack_.pop_back();
    path_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == kVocab) file_.bad(vocab_where(), "must be an integer id, not an array");
    if (mode_ == kMerges) {
      if (merge_depth_ == 1) bad_merge("a nested array");
      merge_depth_ = 1;
      merge_parts_.clear();
      return true;
    }
    if (under_model() && key_ == "merges") {
      out_.has_merges = true;
      (*stack_.back())["merges"] = json::array();
      mode_ = kMerges;
      merge_depth_ = 0;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == kMerges) {
      if (merge_depth_ == 0) {
        mode_ = kTree;
        return true;
      }
      if (merge_parts_.size() != 2) bad_merge(json(merge_parts_).dump());
      out_.merges.emplace_back(std::move(merge_parts_[0]), std::move(merge_parts_[1]));
      merge_depth_ = 0;
      return true;
    }
    stack_.pop_back();
    path_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail("{}: not valid JSON ({})", file_.path, e.what());
  }

 private:
  enum Mode { kTree, kVocab, kMerges };

  bool under_model() const {
    return stack_.size() == 2 && path_[1] == "model" && stack_.back()->is_object();
  }
  std::string vocab_where() const { return "model.vocab[" + json(key_).dump() + "]"; }
  std::string merge_where() const { return fmt::format("model.merges[{}]", out_.merges.size()); }
  [[noreturn]] void bad_merge(const std::string& got) const {
    file_.bad(merge_where(), "must be [\"left\", \"right\"] or \"left right\", not " + got);
  }

  bool value(json v) {
    if (mode_ == kVocab) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId)
        file_.bad(vocab_where(),
                  fmt::format("must be an integer id in [0, {}], not {}", kMaxTokenId, v.dump()));
      out_.vocab.emplace_back(std::move(key_), int32_t(v.get<int64_t>()));
      return true;
    }
    if (mode_ == kMerges) bad_merge(v.dump());
    place(std::move(v));
    return true;
  }
  json& place(json v) {
    if (stack_.empty()) {
      out_.root = std::move(v);
      return out_.root;
    }
    json& parent = *stack_.back();
    if (parent.is_object()) return parent[key_] = std::move(v);
    parent.push_back(std::move(v));
    return parent.back();
  }
  bool open(json container) {
    check_json_depth(stack_.size(), file_.path);
    std::string name = stack_.empty() || !stack_.back()->is_object() ? std::string() : key_;
    // Elements of the parent are not touched until this container closes, so the pointer stays
    // valid.
    stack_.push_back(&place(std::move(container)));
    path_.push_back(std::move(name));
    return true;
  }

  const JsonFile& file_;
  TokenizerJson& out_;
  Mode mode_ = kTree;
  std::vector<json*> stack_;
  std::vector<std::string> path_;  // key of each open container within its parent
  std::string key_;
  int merge_depth_ = 0;
  std::vector<std::string> merge_parts_;
};

}  // namespace

TokenizerJson read_tokenizer_json(const JsonFile& file) {
  std::ifstream in(file.path, std::ios::binary);
  ZAYA_CHECK(in,
             "cannot open tokenizer file '{}' (expected a tokenizer.json or a directory with one)",
             file.path);
  std::ostringstream buf;
  buf << in.rdbuf();
  ZAYA_CHECK(!in.bad(), "{}: read error", file.path);
  const std::string text = std::move(buf).str();
  TokenizerJson out;
  Reader reader(file, out);
  json::sax_parse(text, &reader);
  if (!out.root.is_object()) file.bad("the top level", "must be a JSON object");
  return out;
}

}  // namespace zaya::hf
