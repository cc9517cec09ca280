// Tokenizers: the Hugging Face tokenizer.json BPE (as used by Gemma-3: Replace normalizer, Split
// pre-tokenizer, merges, byte fallback, added/special tokens, Replace+ByteFallback+Fuse decoder)
// and a byte-level tokenizer for small models (ids 0..255 are bytes, then <pad>, <bos>, <eos>).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zaya {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids. Special tokens written inline in the text are recognised as such. add_special
  // applies the tokenizer's post-processor (e.g. a leading <bos> for Gemma-3).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = false) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int64_t vocab_size() const = 0;  // largest id + 1
  virtual int32_t bos_id() const = 0;      // -1 when none
  virtual int32_t eos_id() const = 0;      // -1 when none
  virtual std::string name() const = 0;

  // "bytes" gives the byte tokenizer; anything else is a path to a tokenizer.json (or a directory
  // holding one). Errors name the file and the field that is wrong.
  static std::unique_ptr<Tokenizer> load(const std::string& spec);
};

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kPad = 256, kBos = 257, kEos = 258;
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int64_t vocab_size() const override { return 259; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  std::string name() const override { return "bytes"; }
};

// Implemented in data/hf_tokenizer.cpp.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace zaya
