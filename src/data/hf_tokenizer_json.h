// Reading a Hugging Face tokenizer.json for data/hf_tokenizer.cpp. The file is large (Gemma-3's is
// 33 MB: 262k vocabulary entries and 515k merges), so model.vocab and model.merges are streamed
// straight into flat vectors while everything else becomes an ordinary nlohmann::json tree;
// building the whole tree would cost millions of small allocations and several seconds. Also:
// JsonFile, the field accessors whose errors name the file, the field and the bad value. It does
// not interpret the components (that is hf_tokenizer.cpp's job); it only checks the shape of
// model.vocab and model.merges, since those never reach the tree.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace zaya::hf {

using json = nlohmann::json;

constexpr int64_t kMaxTokenId = int64_t(1) << 30;

struct JsonFile {
  std::string path;

  [[noreturn]] void bad(const std::string& where, const std::string& what) const;
  const json& field(const json& obj, const char* key, const std::string& where) const;
  std::string str(const json& obj, const char* key, const std::string& where) const;
  // Absent or null gives dflt.
  bool flag(const json& obj, const char* key, const std::string& where, bool dflt) const;
  // Absent or null gives "".
  std::string opt_str(const json& obj, const char* key, const std::string& where) const;
  int64_t integer(const json& v, const std::string& where, int64_t lo, int64_t hi) const;
  // A `tokenizers` pattern; only {"String": "..."} is supported.
  std::string string_pattern(const json& obj, const std::string& where) const;
};

struct TokenizerJson {
  json root;  // model.vocab and model.merges are left empty here; see below
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, int32_t>> vocab;       // in file order
  std::vector<std::pair<std::string, std::string>> merges;  // rank order; "a b" entries split
};

// Parses `file.path`; errors name the file (and, for vocab or merges entries, the entry).
TokenizerJson read_tokenizer_json(const JsonFile& file);

}  // namespace zaya::hf
