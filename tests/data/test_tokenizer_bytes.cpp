// The byte tokenizer behind Tokenizer::load("bytes"): ids 0..255 are the bytes themselves, then
// <pad>, <bos>, <eos>; every byte string round-trips, invalid UTF-8 included.
#include <gtest/gtest.h>

#include "data/tokenizer.h"

using namespace zaya;

TEST(ByteTokenizer, EveryByteIsItsOwnId) {
  auto tok = Tokenizer::load("bytes");
  std::string all;
  for (int b = 0; b < 256; b++) all.push_back(char(b));
  const auto ids = tok->encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; b++) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_EQ(tok->name(), "bytes");
}

TEST(ByteTokenizer, SpecialTokens) {
  auto tok = Tokenizer::load("bytes");
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{tok->bos_id(), 'a', 'b'}));
  const std::vector<int32_t> ids = {tok->bos_id(), 'h', 'i', tok->eos_id(), ByteTokenizer::kPad};
  EXPECT_EQ(tok->decode(ids), "<bos>hi<eos><pad>");
  EXPECT_EQ(tok->decode(ids, true), "hi");
  EXPECT_NE(tok->bos_id(), tok->eos_id());
  EXPECT_GE(tok->eos_id(), 256);
}
