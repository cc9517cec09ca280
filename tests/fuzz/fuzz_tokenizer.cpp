// libFuzzer target: a Hugging Face tokenizer.json (load, then encode and decode a few strings).
#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = zaya::fuzz::write_input("tokenizer.json", data, size);
  try {
    auto t = zaya::Tokenizer::load(path);
    for (const char* text : {"", "a", "Hello world, hello   zaya!", "\xff\xfe bytes \xe2\x82",
                             "<bos>x</s> \n\t ünïcödé 日本"}) {
      const auto ids = t->encode(text, true);
      (void)t->decode(ids, false);
      (void)t->decode(ids, true);
    }
    (void)t->vocab_size();
  } catch (const zaya::Error&) {
  }
  return 0;
}
