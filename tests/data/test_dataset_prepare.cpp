// prepare_dataset: documents and EOS as the byte tokenizer defines them (checked byte by byte
// against the input text), output independent of the worker count and batch size, JSONL errors
// naming file:line with no output left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using namespace zaya;

namespace {

struct Dir {
  fs::path p;
  Dir() {
    p = fs::temp_directory_path() /
        ("zaya_prep_" +
         std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
         std::to_string(::getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~Dir() { fs::remove_all(p); }
  std::string operator/(const std::string& n) const { return (p / n).string(); }
};

void put(const std::string& path, const std::string& s) {
  std::ofstream(path, std::ios::binary) << s;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST(PrepareDataset, DocumentsAreBytesPlusEosInInputOrder) {
  Dir d;
  std::string jsonl;
  std::vector<std::string> texts;
  for (int i = 0; i < 200; i++) {
    texts.push_back("document number " + std::to_string(i) + std::string(size_t(i % 7), 'x'));
    jsonl += "{\"text\": \"" + texts.back() + "\"}\n";
  }
  put(d / "a.jsonl", jsonl);
  put(d / "b.txt", "line one\n\nline two\n");
  texts.push_back("line one\n\nline two\n");
  ByteTokenizer tok;
  std::string first_bin, first_idx;
  for (int workers : {1, 4}) {
    for (size_t batch : {size_t(1) << 22, size_t(50)}) {
      PrepareOptions o;
      o.inputs = {d / "a.jsonl", d / "b.txt"};
      o.output_prefix = d / ("out/w" + std::to_string(workers) + "_" + std::to_string(batch));
      o.workers = workers;
      o.batch_bytes = batch;
      auto st = prepare_dataset(o, tok);
      EXPECT_EQ(st.documents, 201);
      IndexedDataset ds(o.output_prefix);
      ASSERT_EQ(ds.num_documents(), 201);
      EXPECT_EQ(ds.dtype(), TokenDType::UInt16);
      for (int64_t i = 0; i < 201; i++) {
        std::vector<int32_t> want(texts[size_t(i)].begin(), texts[size_t(i)].end());
        for (auto& c : want) c = int32_t(uint8_t(c));
        want.push_back(ByteTokenizer::kEos);
        ASSERT_EQ(ds.document(i), want) << "document " << i;
      }
      if (first_bin.empty()) {
        first_bin = slurp(o.output_prefix + ".bin");
        first_idx = slurp(o.output_prefix + ".idx");
      } else {
        EXPECT_EQ(slurp(o.output_prefix + ".bin"), first_bin);
        EXPECT_EQ(slurp(o.output_prefix + ".idx"), first_idx);
      }
    }
  }
}

TEST(PrepareDataset, MalformedJsonlNamesFileAndLineAndWritesNothing) {
  Dir d;
  std::string s;
  for (int i = 0; i < 50; i++) s += "{\"text\": \"fine\"}\n";
  s += "{\"text\": \"unterminated}\n";                  // line 51
  for (int i = 0; i < 50; i++) s += "{\"text\": 7}\n";  // later errors must not win
  put(d / "m.jsonl", s);
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {d / "m.jsonl"};
  o.output_prefix = d / "m";
  o.workers = 4;
  o.batch_bytes = 64;
  try {
    prepare_dataset(o, tok);
    FAIL() << "malformed JSONL accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.jsonl:51: invalid JSON"), std::string::npos)
        << e.what();
  }
  int files = 0;
  for (auto& e : fs::directory_iterator(d.p)) files++, (void)e;
  EXPECT_EQ(files, 1);  // only the input: no .bin, .idx or temporaries

  put(d / "t.jsonl", "{\"text\": \"a\"}\n{\"text\": [1]}\n");
  o.inputs = {d / "t.jsonl"};
  try {
    prepare_dataset(o, tok);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.jsonl:2: field \"text\" must be a string"),
              std::string::npos)
        << e.what();
  }
}

TEST(PrepareDataset, TextSplitModes) {
  Dir d;
  put(d / "t.txt", "a b\nc\n\n\n d \n\ne");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {d / "t.txt"};
  o.append_eos = false;
  o.output_prefix = d / "para";
  o.text_split = TextSplit::Paragraph;
  prepare_dataset(o, tok);
  IndexedDataset p(o.output_prefix);
  ASSERT_EQ(p.num_documents(), 3);
  EXPECT_EQ(tok.decode(p.document(0)), "a b\nc");
  EXPECT_EQ(tok.decode(p.document(1)), " d ");
  EXPECT_EQ(tok.decode(p.document(2)), "e");
  o.output_prefix = d / "line";
  o.text_split = TextSplit::Line;
  prepare_dataset(o, tok);
  EXPECT_EQ(IndexedDataset(o.output_prefix).num_documents(), 4);
  o.output_prefix = d / "file";
  o.text_split = TextSplit::File;
  prepare_dataset(o, tok);
  EXPECT_EQ(tok.decode(IndexedDataset(o.output_prefix).document(0)), "a b\nc\n\n\n d \n\ne");
}
