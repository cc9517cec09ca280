#include "data/tokenizer.h"

#include <filesystem>

namespace zaya {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_special) ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string s;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256)
      s.push_back(char(id));
    else if (!skip_special)
      s += id == kPad ? "<pad>" : id == kBos ? "<bos>" : id == kEos ? "<eos>" : "<unk>";
  }
  return s;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<ByteTokenizer>();
  namespace fs = std::filesystem;
  std::string path = spec;
  if (fs::is_directory(path)) path = (fs::path(path) / "tokenizer.json").string();
  return load_hf_tokenizer(path);
}

}  // namespace zaya
