// Placeholder translation unit: the tokenizer.json BPE is being written in this file.
#include "core/error.h"
#include "data/tokenizer.h"

namespace zaya {
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  fail("tokenizer.json support is not built yet ('{}')", path);
}
}  // namespace zaya
