// The Hugging Face tokenizer.json BPE, reproducing the `tokenizers` library's encode and decode for
// the components that SentencePiece-style BPE vocabularies (Gemma-3, Llama-2 family) use:
//   added tokens (leftmost-longest match on the raw text, or on the normalized text for those
//   marked "normalized"; lstrip/rstrip) → normalizer (Replace with a String pattern, Prepend,
//   Sequence) → pre-tokenizer (Split with a String pattern, all five behaviours, invert; Sequence)
//   → BPE model (merges by rank, byte fallback, unk fusing, continuing_subword_prefix /
//   end_of_word_suffix, ignore_merges) → post-processor (TemplateProcessing, Bert/Roberta-style
//   cls+sep, ByteLevel). decode: Replace, ByteFallback, Fuse, Strip, Sequence decoders.
// It deliberately does not implement regex patterns, Unicode normalization forms (NFC/NFKC),
// lowercasing, the ByteLevel/Metaspace/Whitespace pre-tokenizers, WordPiece/Unigram models, BPE
// dropout or added tokens with single_word: a tokenizer.json that asks for any of them is refused
// with an error naming the field, rather than encoded approximately. Text that is not valid UTF-8
// is accepted: each invalid byte is its own symbol, so with byte fallback it becomes its <0xXX>
// token and the ids still describe the input exactly.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "data/hf_tokenizer_json.h"
#include "data/tokenizer.h"

namespace zaya {
namespace {

using json = nlohmann::json;

// ---- UTF-8
// ----------------------------------------------------------------------------------------

// Length of the well-formed UTF-8 sequence starting at s[i], or 1 for a byte that does not start
// one (so that invalid input is consumed one byte at a time).
size_t utf8_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return i + k < s.size() ? uint8_t(s[i + k]) : uint8_t(0); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 1;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 1;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 1;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 1;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 1;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 1;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 1;
  return 1;
}

uint32_t utf8_decode(std::string_view s, size_t i, size_t len) {
  const auto u = [&](size_t k) { return uint32_t(uint8_t(s[i + k])); };
  switch (len) {
    case 2: return (u(0) & 0x1F) << 6 | (u(1) & 0x3F);
    case 3: return (u(0) & 0x0F) << 12 | (u(1) & 0x3F) << 6 | (u(2) & 0x3F);
    case 4: return (u(0) & 0x07) << 18 | (u(1) & 0x3F) << 12 | (u(2) & 0x3F) << 6 | (u(3) & 0x3F);
    default: return u(0);
  }
}

// Rust's char::is_whitespace (the Unicode White_Space property), which `tokenizers` uses for
// lstrip/rstrip of added tokens.
bool is_unicode_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;  // `tokenizers` matches nothing with an empty pattern
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

constexpr int64_t kMaxId = hf::kMaxTokenId;
// The id table has one entry per id up to the largest, so a tiny file naming id 2^30 would ask for
// tens of GiB. Ids are dense in real files; this many unused ids are allowed beyond the entries.
constexpr int64_t kMaxUnusedIds = int64_t(1) << 20;
using hf::JsonFile;

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, normalized;
};

// Byte trie over the added tokens' texts; find_matches reproduces `tokenizers`' AddedVocabulary
// splitting (aho-corasick LeftmostLongest, then lstrip/rstrip widening).
class AddedTokenTrie {
 public:
  void add(std::string_view text, int32_t token_index) {
    if (text.empty()) return;
    int32_t node = 0;
    first_byte_[uint8_t(text[0])] = true;
    for (char ch : text) {
      const uint64_t key = uint64_t(node) << 8 | uint8_t(ch);
      auto it = children_.find(key);
      if (it == children_.end()) {
        terminal_.push_back(-1);
        it = children_.emplace(key, int32_t(terminal_.size() - 1)).first;
      }
      node = it->second;
    }
    terminal_[node] = token_index;
  }
  bool empty() const { return terminal_.size() == 1; }

  // The longest token starting at s[pos]: (token index, length), or (-1, 0).
  std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const {
    if (!first_byte_[uint8_t(s[pos])]) return {-1, 0};
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t i = pos; i < s.size(); i++) {
      auto it = children_.find(uint64_t(node) << 8 | uint8_t(s[i]));
      if (it == children_.end()) break;
      node = it->second;
      if (terminal_[node] >= 0) best = terminal_[node], best_len = i + 1 - pos;
    }
    return {best, best_len};
  }

 private:
  std::unordered_map<uint64_t, int32_t> children_;
  std::vector<int32_t> terminal_{-1};  // node 0 is the root
  bool first_byte_[256] = {};
};

struct Span {
  size_t begin, end;
  int32_t added;  // index into added tokens, or -1 for text still to be tokenized
};

size_t space_leftmost_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (uint8_t(s[start]) & 0xC0) == 0x80 && end - start < 4) start--;
    const size_t len = utf8_len(s, start);
    if (start + len != end) return end;  // an invalid byte is not whitespace
    if (!is_unicode_whitespace(utf8_decode(s, start, len))) return end;
    end = start;
  }
  return 0;
}

size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = utf8_len(s, i);
    if (!is_unicode_whitespace(utf8_decode(s, i, len))) break;
    i += len;
  }
  return i;
}

// ---- the tokenizer
// --------------------------------------------------------------------------------

// Open-addressing hash table from a pair of token ids to its merge: the BPE inner loop does several
// lookups per merge, and std::unordered_map's node chasing dominated encode time.
class MergeTable {
 public:
  struct Merge {
    int32_t rank, new_id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    shift_ = 60;
    while (cap < 2 * n) cap *= 2, shift_--;
    slots_.assign(cap, Slot{kEmpty, {}});
    mask_ = cap - 1;
  }
  void insert_or_assign(uint32_t a, uint32_t b, Merge m) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    const uint64_t key = uint64_t(a) << 32 | b;
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, m};
        size_++;
        return;
      }
      if (slots_[i].key == key) {
        slots_[i].merge = m;
        return;
      }
    }
  }
  const Merge* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = uint64_t(uint32_t(a)) << 32 | uint32_t(b);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);  // ids are < 2^31, so no real key is all ones
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  // Fibonacci hashing: the top bits of the product are the well-mixed ones.
  size_t slot_of(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(16, old.size()));
    size_ = 0;
    for (const Slot& s : old)
      if (s.key != kEmpty) insert_or_assign(uint32_t(s.key >> 32), uint32_t(s.key), s.merge);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 60;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::string pattern;
  SplitBehavior behavior;
  bool invert;
};

struct NormalizeStep {
  enum Kind { kReplace, kPrepend } kind;
  std::string a, b;  // Replace: pattern → content; Prepend: a
};

struct DecodeStep {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string a, b;  // Replace: pattern → content; Strip: a is the character
  size_t start = 0, stop = 0;
};

class HfBpeTokenizer final : public Tokenizer {
 public:
  explicit HfBpeTokenizer(const std::string& path);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  std::string name() const override { return file_.path; }

 private:
  void parse_added_tokens(const json& root);
  void parse_normalizer(const json& n, const std::string& where);
  void parse_pre_tokenizer(const json& p, const std::string& where);
  void parse_model(const json& m, hf::TokenizerJson& parsed);
  void parse_post_processor(const json& p);
  void parse_decoder(const json& d, const std::string& where);
  void pick_bos_eos();
  void grow_id_table(int32_t id, const std::string& where);

  std::string normalize(std::string_view s) const;
  void split_added(std::string_view s, const AddedTokenTrie& trie, std::vector<Span>& out) const;
  void pre_tokenize(std::string_view s, std::vector<std::string_view>& words) const;
  void bpe(std::string_view word, std::vector<int32_t>& ids) const;
  int32_t vocab_find(std::string_view s) const {
    auto it = vocab_.find(s);
    return it == vocab_.end() ? -1 : it->second;
  }

  JsonFile file_;
  std::vector<AddedToken> added_;
  AddedTokenTrie raw_trie_, normalized_trie_;
  std::vector<NormalizeStep> normalizer_;
  std::vector<SplitStep> pre_tokenizer_;
  bool has_decoder_ = false;
  std::vector<DecodeStep> decoder_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // the post-processor's template around the text

  // BPE model.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  using Merge = MergeTable::Merge;
  MergeTable merges_;
  // Single-character tokens of the Basic Multilingual Plane, by code point: the first step of
  // every encode looks up each character.
  std::vector<int32_t> bmp_ids_;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::string subword_prefix_, word_suffix_;
  int32_t byte_ids_[256];  // <0xXX> tokens, -1 where absent

  std::vector<std::string> id_to_token_;  // model vocab and added tokens; holes are empty
  std::vector<uint8_t> id_kind_;          // 0 none, 1 model, 2 added, 3 added special
  int32_t bos_ = -1, eos_ = -1;
  int64_t id_limit_ = 0;  // ids must be below this (the entries of the file + kMaxUnusedIds)
};

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) {
  file_.path = path;
  hf::TokenizerJson parsed = hf::read_tokenizer_json(file_);
  const json& root = parsed.root;
  {
    auto at = root.find("added_tokens");
    const size_t added = at != root.end() && at->is_array() ? at->size() : 0;
    id_limit_ = int64_t(parsed.vocab.size() + added) + kMaxUnusedIds;
  }
  parse_model(file_.field(root, "model", "tokenizer"), parsed);
  parse_added_tokens(root);
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null())
    parse_normalizer(*it, "normalizer");
  if (auto it = root.find("pre_tokenizer"); it != root.end() && !it->is_null())
    parse_pre_tokenizer(*it, "pre_tokenizer");
  if (auto it = root.find("post_processor"); it != root.end() && !it->is_null())
    parse_post_processor(*it);
  if (auto it = root.find("decoder"); it != root.end() && !it->is_null()) {
    has_decoder_ = true;
    parse_decoder(*it, "decoder");
  }
  // Normalized added tokens are matched in normalized text, so their pattern is normalized too;
  // `tokenizers` (0.23) also decodes them to that normalized form.
  for (size_t i = 0; i < added_.size(); i++) {
    if (added_[i].normalized) {
      const std::string pattern = normalize(added_[i].content);
      normalized_trie_.add(pattern, int32_t(i));
      id_to_token_[added_[i].id] = pattern;
    } else {
      raw_trie_.add(added_[i].content, int32_t(i));
    }
  }
  pick_bos_eos();
}

void HfBpeTokenizer::parse_model(const json& m, hf::TokenizerJson& parsed) {
  const std::string type = file_.str(m, "type", "model");
  if (type != "BPE") file_.bad("model.type", "is '" + type + "'; only BPE models are supported");
  if (auto it = m.find("dropout");
      it != m.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0))
    file_.bad("model.dropout", "is " + it->dump() +
                                   "; BPE dropout is a training-time regulariser and zaya encodes "
                                   "deterministically (expected null)");
  byte_fallback_ = file_.flag(m, "byte_fallback", "model", false);
  fuse_unk_ = file_.flag(m, "fuse_unk", "model", false);
  ignore_merges_ = file_.flag(m, "ignore_merges", "model", false);
  subword_prefix_ = file_.opt_str(m, "continuing_subword_prefix", "model");
  word_suffix_ = file_.opt_str(m, "end_of_word_suffix", "model");

  if (!parsed.has_vocab) {  // absent, or not an object (then the tree has it)
    const json& vocab = file_.field(m, "vocab", "model");
    file_.bad("model.vocab", "must be an object of token → id, not " + vocab.dump().substr(0, 80));
  }
  vocab_.reserve(parsed.vocab.size());
  for (auto& [token, id] : parsed.vocab) {
    if (size_t(id) >= id_to_token_.size())
      grow_id_table(id, "model.vocab[" + json(token).dump() + "]");
    id_to_token_[id] = token;
    id_kind_[id] = 1;
    vocab_[std::move(token)] = id;
  }
  parsed.vocab = {};
  if (std::string unk = file_.opt_str(m, "unk_token", "model"); !unk.empty()) {
    unk_id_ = vocab_find(unk);
    if (unk_id_ < 0) file_.bad("model.unk_token", "'" + unk + "' is not in model.vocab");
  }
  for (int b = 0; b < 256; b++) byte_ids_[b] = vocab_find(fmt::format("<0x{:02X}>", b));
  bmp_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : vocab_) {
    if (token.empty()) continue;
    const size_t len = utf8_len(token, 0);
    if (len == token.size() && (len > 1 || uint8_t(token[0]) < 0x80)) {
      const uint32_t cp = utf8_decode(token, 0, len);
      if (cp < 0x10000) bmp_ids_[cp] = id;
    }
  }

  if (!parsed.has_merges) {
    const json& merges = file_.field(m, "merges", "model");
    file_.bad("model.merges", "must be an array, not " + merges.dump().substr(0, 80));
  }
  merges_.reserve(parsed.merges.size());
  std::string merged;
  for (size_t r = 0; r < parsed.merges.size(); r++) {
    const auto& [a, b] = parsed.merges[r];
    const auto where = [r] { return fmt::format("model.merges[{}]", r); };  // only on errors
    const int32_t ia = vocab_find(a), ib = vocab_find(b);
    if (ia < 0) file_.bad(where(), "'" + a + "' is not in model.vocab");
    if (ib < 0) file_.bad(where(), "'" + b + "' is not in model.vocab");
    std::string_view tail = b;
    if (!subword_prefix_.empty() && tail.starts_with(subword_prefix_))
      tail.remove_prefix(subword_prefix_.size());
    merged.assign(a).append(tail);
    const int32_t im = vocab_find(merged);
    if (im < 0) file_.bad(where(), "merged token '" + merged + "' is not in model.vocab");
    // A repeated pair takes its later rank, as in `tokenizers`.
    merges_.insert_or_assign(uint32_t(ia), uint32_t(ib), {int32_t(r), im});
  }
  parsed.merges = {};
}

void HfBpeTokenizer::grow_id_table(int32_t id, const std::string& where) {
  if (id >= id_limit_)
    file_.bad(where, fmt::format("is id {}, but the file has only {} tokens and ids may leave at "
                                 "most {} unused",
                                 id, id_limit_ - kMaxUnusedIds, kMaxUnusedIds));
  id_to_token_.resize(size_t(id) + 1);
  id_kind_.resize(size_t(id) + 1, 0);
}

void HfBpeTokenizer::parse_added_tokens(const json& root) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return;
  if (!it->is_array()) file_.bad("added_tokens", "must be an array");
  for (size_t i = 0; i < it->size(); i++) {
    const json& t = (*it)[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    AddedToken a;
    a.content = file_.str(t, "content", where);
    a.id = int32_t(file_.integer(file_.field(t, "id", where), where + ".id", 0, kMaxId));
    a.special = file_.flag(t, "special", where, false);
    a.lstrip = file_.flag(t, "lstrip", where, false);
    a.rstrip = file_.flag(t, "rstrip", where, false);
    a.normalized = file_.flag(t, "normalized", where, !a.special);
    if (file_.flag(t, "single_word", where, false))
      file_.bad(where + ".single_word", "is true for '" + a.content + "', which is not supported");
    if (a.content.empty()) file_.bad(where + ".content", "must not be empty");
    // An added token whose text is already in the model's vocabulary keeps the model's id, as in
    // `tokenizers`.
    if (int32_t model_id = vocab_find(a.content); model_id >= 0) a.id = model_id;
    if (size_t(a.id) >= id_to_token_.size()) grow_id_table(a.id, where + ".id");
    id_to_token_[a.id] = a.content;
    id_kind_[a.id] = a.special ? 3 : 2;
    added_.push_back(std::move(a));
  }
}

void HfBpeTokenizer::parse_normalizer(const json& n, const std::string& where) {
  const std::string type = file_.str(n, "type", where);
  if (type == "Sequence") {
    const json& list = file_.field(n, "normalizers", where);
    if (!list.is_array()) file_.bad(where + ".normalizers", "must be an array");
    for (size_t i = 0; i < list.size(); i++)
      parse_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
  } else if (type == "Replace") {
    normalizer_.push_back(
        {NormalizeStep::kReplace, file_.string_pattern(n, where), file_.str(n, "content", where)});
  } else if (type == "Prepend") {
    normalizer_.push_back({NormalizeStep::kPrepend, file_.str(n, "prepend", where), {}});
  } else {
    file_.bad(where + ".type",
              "is '" + type + "'; supported normalizers: Replace, Prepend, Sequence");
  }
}

void HfBpeTokenizer::parse_pre_tokenizer(const json& p, const std::string& where) {
  const std::string type = file_.str(p, "type", where);
  if (type == "Sequence") {
    const json& list = file_.field(p, "pretokenizers", where);
    if (!list.is_array()) file_.bad(where + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < list.size(); i++)
      parse_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
  } else if (type == "Split") {
    SplitStep s;
    s.pattern = file_.string_pattern(p, where);
    const std::string b = file_.str(p, "behavior", where);
    if (b == "Removed")
      s.behavior = SplitBehavior::kRemoved;
    else if (b == "Isolated")
      s.behavior = SplitBehavior::kIsolated;
    else if (b == "MergedWithPrevious")
      s.behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      s.behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous")
      s.behavior = SplitBehavior::kContiguous;
    else
      file_.bad(where + ".behavior", "is '" + b +
                                         "'; expected Removed, Isolated, MergedWithPrevious, "
                                         "MergedWithNext or Contiguous");
    s.invert = file_.flag(p, "invert", where, false);
    pre_tokenizer_.push_back(std::move(s));
  } else {
    file_.bad(where + ".type", "is '" + type + "'; supported pre-tokenizers: Split, Sequence");
  }
}

void HfBpeTokenizer::parse_post_processor(const json& p) {
  const std::string type = file_.str(p, "type", "post_processor");
  const auto lookup_pair = [&](const char* key) {
    const json& v = file_.field(p, key, "post_processor");
    if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
      file_.bad(std::string("post_processor.") + key, "must be [token, id], not " + v.dump());
    return int32_t(file_.integer(v[1], std::string("post_processor.") + key, 0, kMaxId));
  };
  if (type == "TemplateProcessing") {
    const json& single = file_.field(p, "single", "post_processor");
    const json& specials = file_.field(p, "special_tokens", "post_processor");
    if (!single.is_array()) file_.bad("post_processor.single", "must be an array");
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); i++) {
      const std::string where = fmt::format("post_processor.single[{}]", i);
      const json& piece = single[i];
      if (piece.is_object() && piece.contains("Sequence")) {
        const std::string id = file_.str(piece["Sequence"], "id", where + ".Sequence");
        if (id != "A") file_.bad(where + ".Sequence.id", "is '" + id + "'; expected 'A'");
        seen_sequence = true;
      } else if (piece.is_object() && piece.contains("SpecialToken")) {
        const std::string name = file_.str(piece["SpecialToken"], "id", where + ".SpecialToken");
        const json& st = file_.field(specials, name.c_str(), "post_processor.special_tokens");
        const json& ids = file_.field(st, "ids", "post_processor.special_tokens." + name);
        if (!ids.is_array())
          file_.bad("post_processor.special_tokens." + name + ".ids", "must be an array");
        for (const json& id : ids) {
          const int32_t v = int32_t(
              file_.integer(id, "post_processor.special_tokens." + name + ".ids", 0, kMaxId));
          (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(v);
        }
      } else {
        file_.bad(where,
                  "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, not " + piece.dump());
      }
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    prefix_ids_ = {lookup_pair("cls")};
    suffix_ids_ = {lookup_pair("sep")};
  } else if (type != "ByteLevel") {  // ByteLevel only adjusts offsets, which zaya does not report
    file_.bad("post_processor.type", "is '" + type +
                                         "'; supported: TemplateProcessing, BertProcessing, "
                                         "RobertaProcessing, ByteLevel");
  }
}

void HfBpeTokenizer::parse_decoder(const json& d, const std::string& where) {
  const std::string type = file_.str(d, "type", where);
  if (type == "Sequence") {
    const json& list = file_.field(d, "decoders", where);
    if (!list.is_array()) file_.bad(where + ".decoders", "must be an array");
    for (size_t i = 0; i < list.size(); i++)
      parse_decoder(list[i], fmt::format("{}.decoders[{}]", where, i));
  } else if (type == "Replace") {
    decoder_.push_back(
        {DecodeStep::kReplace, file_.string_pattern(d, where), file_.str(d, "content", where)});
  } else if (type == "ByteFallback") {
    decoder_.push_back({DecodeStep::kByteFallback, {}, {}});
  } else if (type == "Fuse") {
    decoder_.push_back({DecodeStep::kFuse, {}, {}});
  } else if (type == "Strip") {
    DecodeStep s{DecodeStep::kStrip, file_.str(d, "content", where), {}};
    if (s.a.empty() || utf8_len(s.a, 0) != s.a.size())
      file_.bad(where + ".content", "must be a single character, not '" + s.a + "'");
    s.start = size_t(file_.integer(file_.field(d, "start", where), where + ".start", 0, kMaxId));
    s.stop = size_t(file_.integer(file_.field(d, "stop", where), where + ".stop", 0, kMaxId));
    decoder_.push_back(std::move(s));
  } else {
    file_.bad(
        where + ".type",
        "is '" + type + "'; supported decoders: Replace, ByteFallback, Fuse, Strip, Sequence");
  }
}

// tokenizer.json does not say which token ends a document; tokenizer_config.json beside it does.
void HfBpeTokenizer::pick_bos_eos() {
  const auto id_of = [&](std::string_view t) -> int32_t {
    for (const auto& a : added_)
      if (a.content == t) return a.id;
    return vocab_find(t);
  };
  const auto first_known = [&](std::initializer_list<std::string_view> names) {
    for (auto n : names)
      if (int32_t id = id_of(n); id >= 0) return id;
    return -1;
  };
  bos_ =
      prefix_ids_.size() == 1 ? prefix_ids_[0] : first_known({"<bos>", "<s>", "<|begin_of_text|>"});
  eos_ = first_known({"<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>"});
  namespace fs = std::filesystem;
  const fs::path config = fs::path(file_.path).parent_path() / "tokenizer_config.json";
  std::ifstream in(config);
  if (!in) return;
  // A malformed tokenizer_config.json is ignored, as before; the depth limit still applies.
  json c;
  try {
    c = read_json_file(config.string());
  } catch (const Error&) {
    return;
  }
  const auto configured = [&](const char* key, int32_t& out) {
    if (!c.is_object() || !c.contains(key)) return;
    const json& v = c[key];
    std::string text = v.is_string() ? v.get<std::string>()
                       : v.is_object() && v.contains("content") && v["content"].is_string()
                           ? v["content"].get<std::string>()
                           : std::string();
    if (text.empty()) return;
    const int32_t id = id_of(text);
    if (id < 0) fail("{}: {} '{}' is not a token of {}", config.string(), key, text, file_.path);
    out = id;
  };
  configured("bos_token", bos_);
  configured("eos_token", eos_);
}

// ---- encode
// ---------------------------------------------------------------------------------------

std::string HfBpeTokenizer::normalize(std::string_view s) const {
  std::string out(s);
  for (const auto& step : normalizer_) {
    if (step.kind == NormalizeStep::kReplace)
      replace_all(out, step.a, step.b);
    else if (!out.empty())
      out.insert(0, step.a);
  }
  return out;
}

void HfBpeTokenizer::split_added(std::string_view s, const AddedTokenTrie& trie,
                                 std::vector<Span>& out) const {
  if (trie.empty()) {
    out.push_back({0, s.size(), -1});
    return;
  }
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    auto [tok, len] = trie.longest_at(s, pos);
    if (tok < 0) {
      pos++;
      continue;
    }
    size_t start = pos, stop = pos + len;
    // The matcher resumes after the match itself, not after the whitespace rstrip takes; that is
    // how `tokenizers` behaves, so it is kept.
    pos = stop;
    if (added_[tok].lstrip)
      start = std::max(space_leftmost_at_end(s.substr(0, start)), start_offset);
    if (added_[tok].rstrip) stop += space_rightmost_at_start(s.substr(stop));
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
}

void HfBpeTokenizer::pre_tokenize(std::string_view s, std::vector<std::string_view>& words) const {
  words.assign(1, s);
  std::vector<std::string_view> next;
  struct Part {
    size_t b, e;
    bool match;
  };
  std::vector<Part> parts, merged;
  for (const SplitStep& step : pre_tokenizer_) {
    next.clear();
    for (std::string_view w : words) {
      parts.clear();
      size_t prev = 0;
      if (!step.pattern.empty()) {
        for (size_t hit; (hit = w.find(step.pattern, prev)) != std::string_view::npos;
             prev = hit + step.pattern.size()) {
          if (prev != hit) parts.push_back({prev, hit, false});
          parts.push_back({hit, hit + step.pattern.size(), true});
        }
      }
      if (prev != w.size()) parts.push_back({prev, w.size(), false});
      if (step.invert)
        for (auto& p : parts) p.match = !p.match;
      merged.clear();
      bool previous_match = false;
      switch (step.behavior) {
        case SplitBehavior::kRemoved:
          for (auto& p : parts)
            if (!p.match) merged.push_back(p);
          break;
        case SplitBehavior::kIsolated: merged = parts; break;
        case SplitBehavior::kMergedWithPrevious:
          for (auto& p : parts) {
            if (p.match && !previous_match && !merged.empty())
              merged.back().e = p.e;
            else
              merged.push_back(p);
            previous_match = p.match;
          }
          break;
        case SplitBehavior::kMergedWithNext:
          for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
            if (it->match && !previous_match && !merged.empty())
              merged.back().b = it->b;
            else
              merged.push_back(*it);
            previous_match = it->match;
          }
          std::reverse(merged.begin(), merged.end());
          break;
        case SplitBehavior::kContiguous:
          for (auto& p : parts) {
            if (p.match == previous_match && !merged.empty())
              merged.back().e = p.e;
            else
              merged.push_back(p);
            previous_match = p.match;
          }
          break;
      }
      for (auto& p : merged)
        if (p.e > p.b) next.push_back(w.substr(p.b, p.e - p.b));
    }
    words.swap(next);
  }
  if (!words.empty() && words[0].empty()) words.clear();
}

// `tokenizers`' BPE::merge_word and Word::merge_all: symbols start as characters (or their byte
// tokens, or <unk>), then the lowest-ranked mergeable adjacent pair is merged first, leftmost on
// ties.
void HfBpeTokenizer::bpe(std::string_view word, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    if (int32_t id = vocab_find(word); id >= 0) {
      ids.push_back(id);
      return;
    }
  }
  ZAYA_CHECK(word.size() < size_t(INT32_MAX), "{}: a text piece of {} bytes is too long to encode",
             file_.path, word.size());
  struct Symbol {
    int32_t id, prev, next;
    bool removed;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  const auto add = [&](int32_t id) {
    const int32_t n = int32_t(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, false});
  };
  int32_t pending_unk = -1;  // a (possibly fused) <unk> not yet added
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    const size_t len = utf8_len(word, i);
    std::string_view ch = word.substr(i, len);
    const bool first = i == 0, last = i + len == word.size();
    int32_t id;
    if ((!first && !subword_prefix_.empty()) || (last && !word_suffix_.empty())) {
      piece.clear();
      if (!first) piece += subword_prefix_;
      piece += ch;
      if (last) piece += word_suffix_;
      id = vocab_find(piece);
      ch = piece;
    } else if (len > 1 || uint8_t(ch[0]) < 0x80) {
      const uint32_t cp = utf8_decode(ch, 0, len);
      id = cp < 0x10000 ? bmp_ids_[cp] : vocab_find(ch);
    } else {
      id = vocab_find(ch);  // an invalid byte
    }
    i += len;
    if (id >= 0) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(id);
      continue;
    }
    if (byte_fallback_ &&
        std::all_of(ch.begin(), ch.end(), [&](char c) { return byte_ids_[uint8_t(c)] >= 0; })) {
      // As in `tokenizers`, a pending <unk> is not flushed before byte tokens.
      for (char c : ch) add(byte_ids_[uint8_t(c)]);
      continue;
    }
    if (unk_id_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto merge_of = [&](int32_t a, int32_t b) -> const Merge* { return merges_.find(a, b); };
  for (int32_t p = 0; p + 1 < int32_t(sym.size()); p++)
    if (const Merge* m = merge_of(sym[p].id, sym[p + 1].id)) queue.push({m->rank, p, m->new_id});
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (cur.removed || cur.next < 0) continue;
    const Symbol right = sym[cur.next];
    // Entries made stale by earlier merges no longer describe the pair at this position.
    const Merge* m = merge_of(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    sym[cur.next].removed = true;
    cur.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const Merge* pm = merge_of(sym[cur.prev].id, cur.id))
        queue.push({pm->rank, cur.prev, pm->new_id});
    if (cur.next >= 0)
      if (const Merge* nm = merge_of(cur.id, sym[cur.next].id))
        queue.push({nm->rank, top.pos, nm->new_id});
  }
  for (const Symbol& s : sym)
    if (!s.removed) ids.push_back(s.id);
}

std::vector<int32_t> HfBpeTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  if (add_special) ids = prefix_ids_;
  std::vector<Span> raw, norm;
  std::vector<std::string_view> words;
  split_added(text, raw_trie_, raw);
  for (const Span& r : raw) {
    if (r.added >= 0) {
      ids.push_back(added_[r.added].id);
      continue;
    }
    const std::string normalized = normalize(text.substr(r.begin, r.end - r.begin));
    norm.clear();
    split_added(normalized, normalized_trie_, norm);
    for (const Span& n : norm) {
      if (n.added >= 0) {
        ids.push_back(added_[n.added].id);
        continue;
      }
      pre_tokenize(std::string_view(normalized).substr(n.begin, n.end - n.begin), words);
      for (std::string_view w : words) bpe(w, ids);
    }
  }
  if (add_special) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

// ---- decode
// ---------------------------------------------------------------------------------------

std::string HfBpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= id_to_token_.size() || id_kind_[id] == 0)
      fail("token id {} is not in the vocabulary of {} (ids 0..{})", id, file_.path,
           id_to_token_.size() - 1);
    if (skip_special && id_kind_[id] == 3) continue;
    tokens.push_back(id_to_token_[id]);
  }
  if (!has_decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); i++) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::vector<std::string> next;
  for (const DecodeStep& step : decoder_) {
    switch (step.kind) {
      case DecodeStep::kReplace:
        for (auto& t : tokens) replace_all(t, step.a, step.b);
        break;
      case DecodeStep::kFuse: {
        std::string all;
        for (auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecodeStep::kStrip:
        for (auto& t : tokens) {
          size_t b = 0, e = t.size();
          for (size_t k = 0; k < step.start && t.compare(b, step.a.size(), step.a) == 0; k++)
            b += step.a.size();
          for (size_t k = 0; k < step.stop && e >= b + step.a.size() &&
                             t.compare(e - step.a.size(), step.a.size(), step.a) == 0;
               k++)
            e -= step.a.size();
          t = t.substr(b, e - b);
        }
        break;
      case DecodeStep::kByteFallback: {
        // Runs of <0xXX> tokens become their bytes when those form valid UTF-8, and one U+FFFD per
        // byte token otherwise (as in `tokenizers`).
        next.clear();
        std::string bytes;
        size_t nbytes = 0;
        const auto flush = [&] {
          if (nbytes == 0) return;
          bool valid = true;
          for (size_t i = 0; i < bytes.size() && valid;) {
            const size_t len = utf8_len(bytes, i);
            valid = len > 1 || uint8_t(bytes[i]) < 0x80;
            i += len;
          }
          if (valid)
            next.push_back(bytes);
          else
            for (size_t i = 0; i < nbytes; i++) next.push_back("\xEF\xBF\xBD");
          bytes.clear();
          nbytes = 0;
        };
        for (auto& t : tokens) {
          const bool is_byte = t.size() == 6 && t.starts_with("<0x") && t[5] == '>' &&
                               std::isxdigit(uint8_t(t[3])) && std::isxdigit(uint8_t(t[4]));
          if (is_byte) {
            bytes.push_back(char(std::stoi(t.substr(3, 2), nullptr, 16)));
            nbytes++;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(next);
        break;
      }
    }
  }
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  return std::make_unique<HfBpeTokenizer>(path);
}

}  // namespace zaya
