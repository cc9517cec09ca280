// Parity of zaya's tokenizer.json BPE with Hugging Face `tokenizers` (the Rust implementation), on
// fixtures that tests/fixtures/tokenizer/make_fixtures.mjs wrote with it: two small BPEs cut out of
// Gemma-3 (always run) and the full Gemma-3 tokenizer (run when its 33 MB tokenizer.json is
// present: $ZAYA_GEMMA3_TOKENIZER or .cache/tok/tokenizer.json in the source tree). Also: round
// trips, invalid UTF-8, thread safety, and the errors a broken tokenizer.json gets.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"

using namespace zaya;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(ZAYA_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in) << p;
  return json::parse(in);
}

std::string show(const std::string& s) {
  return json(s).dump();
}

// Every case of an expected_*.json: ids without and with the post-processor, and both decodings.
void expect_matches_reference(const Tokenizer& tok, const fs::path& expected_file,
                              size_t min_cases = 300) {
  const json expected = read_json(expected_file);
  ASSERT_GE(expected["cases"].size(), min_cases) << expected_file;
  int failures = 0;
  for (const json& c : expected["cases"]) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    EXPECT_EQ(got, ids) << "text " << show(text);
    EXPECT_EQ(tok.encode(text, true), c["ids_with_special"].get<std::vector<int32_t>>())
        << "text " << show(text);
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << "ids of " << show(text);
    if (c.contains("decoded_skip_special")) {
      EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>())
          << "ids of " << show(text);
    }
    if (got != ids && ++failures > 5) FAIL() << "stopping after 5 mismatching texts";
  }
}

// A copy of a fixture tokenizer with one edit, written to a temp directory.
fs::path edited_tokenizer(const std::string& name, const std::function<void(json&)>& edit) {
  json t = read_json(kFixtures / "mini_gemma.json");
  edit(t);
  const fs::path dir =
      fs::temp_directory_path() / ("zaya_tok_" + name + "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << t.dump();
  return dir / "tokenizer.json";
}

void expect_load_error(const fs::path& file, const std::vector<std::string>& fragments) {
  try {
    Tokenizer::load(file.string());
    ADD_FAILURE() << "loading " << file << " did not fail";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << msg << "\nlacks: " << f;
  }
  fs::remove_all(file.parent_path());
}

}  // namespace

TEST(HfTokenizer, MiniGemmaMatchesHuggingFace) {
  auto tok = Tokenizer::load((kFixtures / "mini_gemma.json").string());
  expect_matches_reference(*tok, kFixtures / "expected_mini_gemma.json");
}

TEST(HfTokenizer, MiniLlamaStyleMatchesHuggingFace) {
  // Prepend normalizer, Strip decoder, fused <unk> without byte fallback, "a b" merges, an added
  // token with lstrip/rstrip, one matched in normalized text, and a three-token post-processor
  // template.
  auto tok = Tokenizer::load((kFixtures / "mini_llama.json").string());
  expect_matches_reference(*tok, kFixtures / "expected_mini_llama.json");
}

TEST(HfTokenizer, Gemma3MatchesHuggingFace) {
  const char* env = std::getenv("ZAYA_GEMMA3_TOKENIZER");
  const fs::path path =
      env ? fs::path(env) : fs::path(ZAYA_SOURCE_DIR) / ".cache/tok/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << "no Gemma-3 tokenizer.json at " << path;
  auto tok = Tokenizer::load(path.string());
  expect_matches_reference(*tok, kFixtures / "expected.json", 25);     // cases.json, from Python
  expect_matches_reference(*tok, kFixtures / "expected_gemma3.json");  // + random texts, from Node
  // ZAYA1: pad 0, eos 1, bos 2; the Gemma-3 vocabulary's largest id is <image_soft_token> 262144.
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->vocab_size(), 262145);
}

TEST(HfTokenizer, IdsAndSizesComeFromTheFile) {
  const json t = read_json(kFixtures / "mini_gemma.json");
  auto tok = Tokenizer::load((kFixtures / "mini_gemma.json").string());
  int64_t largest = 0;
  for (auto& [k, v] : t["model"]["vocab"].items())
    largest = std::max<int64_t>(largest, v.get<int64_t>());
  for (auto& a : t["added_tokens"]) largest = std::max<int64_t>(largest, a["id"].get<int64_t>());
  EXPECT_EQ(tok->vocab_size(), largest + 1);
  EXPECT_EQ(tok->bos_id(), t["model"]["vocab"]["<bos>"].get<int32_t>());
  EXPECT_EQ(tok->eos_id(), t["model"]["vocab"]["<eos>"].get<int32_t>());
  EXPECT_EQ(tok->name(), (kFixtures / "mini_gemma.json").string());
}

TEST(HfTokenizer, LoadsFromADirectory) {
  const fs::path file = edited_tokenizer("dir", [](json&) {});
  auto tok = Tokenizer::load(file.parent_path().string());
  auto ref = Tokenizer::load((kFixtures / "mini_gemma.json").string());
  EXPECT_EQ(tok->encode("Hello, world!"), ref->encode("Hello, world!"));
  EXPECT_EQ(tok->eos_id(), ref->eos_id());
  // tokenizer_config.json beside it names the end-of-document token (ZAYA1-8B's is <end_of_turn>).
  std::ofstream(file.parent_path() / "tokenizer_config.json")
      << R"({"eos_token": {"content": "<end_of_turn>"}, "bos_token": "<bos>"})";
  const json t = read_json(file);
  EXPECT_EQ(Tokenizer::load(file.string())->eos_id(),
            t["model"]["vocab"]["<end_of_turn>"].get<int32_t>());
  std::ofstream(file.parent_path() / "tokenizer_config.json") << R"({"eos_token": "<nope>"})";
  EXPECT_THROW(Tokenizer::load(file.string()), Error);
  fs::remove_all(file.parent_path());
}

TEST(HfTokenizer, RandomUnicodeRoundTrips) {
  // With byte fallback every valid UTF-8 text decodes back to itself, except that the tokenizer
  // writes spaces as U+2581, so the texts avoid that one character.
  auto tok = Tokenizer::load((kFixtures / "mini_gemma.json").string());
  Rng rng(7);
  for (int n = 0; n < 200; n++) {
    std::string s;
    const int len = 1 + int(rng.next_u32() % 40);
    for (int i = 0; i < len; i++) {
      uint32_t cp;
      switch (rng.next_u32() % 4) {
        case 0: cp = 0x20 + rng.next_u32() % 0x5F; break;
        case 1: cp = " \n\t"[rng.next_u32() % 3]; break;
        case 2: cp = 0x80 + rng.next_u32() % 0x2F80; break;
        default: cp = 0x10000 + rng.next_u32() % 0x20000; break;
      }
      if (cp == 0x2581 || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 'x';
      if (cp < 0x80) {
        s += char(cp);
      } else if (cp < 0x800) {
        s += char(0xC0 | cp >> 6), s += char(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        s += char(0xE0 | cp >> 12), s += char(0x80 | (cp >> 6 & 0x3F)),
            s += char(0x80 | (cp & 0x3F));
      } else {
        s += char(0xF0 | cp >> 18), s += char(0x80 | (cp >> 12 & 0x3F));
        s += char(0x80 | (cp >> 6 & 0x3F)), s += char(0x80 | (cp & 0x3F));
      }
    }
    EXPECT_EQ(tok->decode(tok->encode(s)), s) << show(s);
  }
}

TEST(HfTokenizer, InvalidUtf8BecomesByteTokens) {
  const json t = read_json(kFixtures / "mini_gemma.json");
  auto tok = Tokenizer::load((kFixtures / "mini_gemma.json").string());
  const auto id = [&](const char* s) { return t["model"]["vocab"][s].get<int32_t>(); };
  // A lone continuation byte, a truncated 3-byte sequence, an overlong encoding of '/', a
  // surrogate.
  EXPECT_EQ(tok->encode("\x80"), (std::vector<int32_t>{id("<0x80>")}));
  EXPECT_EQ(tok->encode("a\xE2\x82"), (std::vector<int32_t>{id("a"), id("<0xE2>"), id("<0x82>")}));
  EXPECT_EQ(tok->encode("\xC0\xAF"), (std::vector<int32_t>{id("<0xC0>"), id("<0xAF>")}));
  EXPECT_EQ(tok->encode("\xED\xA0\x80").size(), 3u);
  // Decoding cannot produce invalid UTF-8: one U+FFFD per byte token of an invalid run.
  EXPECT_EQ(tok->decode(tok->encode("a\xE2\x82")), "a\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(HfTokenizer, ConcurrentEncodesAgree) {
  auto tok = Tokenizer::load((kFixtures / "mini_gemma.json").string());
  const std::string text = "Concurrent <start_of_turn>user\n encodes of the same text, 日本語 😀.";
  const auto want = tok->encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; i++) ok[t] += tok->encode(text) == want;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; t++) EXPECT_EQ(ok[t], 200);
}

TEST(HfTokenizer, DecodeRejectsUnknownIds) {
  auto tok = Tokenizer::load((kFixtures / "mini_gemma.json").string());
  EXPECT_THROW(tok->decode({int32_t(tok->vocab_size())}), Error);
  EXPECT_THROW(tok->decode({-1}), Error);
}

TEST(HfTokenizerErrors, MissingFileAndBadJson) {
  expect_load_error("/nonexistent/zaya/tokenizer.json", {"/nonexistent/zaya/tokenizer.json"});
  const fs::path dir = fs::temp_directory_path() / ("zaya_tok_badjson_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\", ";
  expect_load_error(dir / "tokenizer.json", {(dir / "tokenizer.json").string(), "not valid JSON"});
}

TEST(HfTokenizerErrors, NameTheFieldAndTheValue) {
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"model_type",
       [](json& t) { t["model"]["type"] = "WordPiece"; },
       {"model.type", "WordPiece"}},
      {"no_vocab", [](json& t) { t["model"].erase("vocab"); }, {"model.vocab", "missing"}},
      {"bad_id",
       [](json& t) { t["model"]["vocab"]["a"] = "seven"; },
       {"model.vocab[\"a\"]", "seven"}},
      {"merge_oov",
       [](json& t) {
         t["model"]["merges"][3] = json::array({"a", "no-such-token"});
       },
       {"model.merges[3]", "no-such-token"}},
      {"merge_shape", [](json& t) { t["model"]["merges"][0] = 5; }, {"model.merges[0]"}},
      {"unk",
       [](json& t) { t["model"]["unk_token"] = "<missing>"; },
       {"model.unk_token", "<missing>"}},
      {"dropout", [](json& t) { t["model"]["dropout"] = 0.1; }, {"model.dropout"}},
      {"normalizer",
       [](json& t) {
         t["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}};
       },
       {"normalizer.normalizers[0].type", "NFKC"}},
      {"regex",
       [](json& t) {
         t["pre_tokenizer"]["pattern"] = {{"Regex", "\\s+"}};
       },
       {"pre_tokenizer.pattern", "Regex"}},
      {"behavior", [](json& t) { t["pre_tokenizer"]["behavior"] = "Sideways"; }, {"Sideways"}},
      {"decoder",
       [](json& t) {
         t["decoder"]["decoders"][1] = {{"type", "ByteLevel"}};
       },
       {"decoder.decoders[1].type", "ByteLevel"}},
      {"post",
       [](json& t) { t["post_processor"]["single"][0]["SpecialToken"]["id"] = "<cls>"; },
       {"post_processor.special_tokens.<cls>", "missing"}},
      {"single_word",
       [](json& t) { t["added_tokens"][2]["single_word"] = true; },
       {"added_tokens[2].single_word"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path file = edited_tokenizer(c.name, c.edit);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back(file.string());
    expect_load_error(file, fragments);
  }
}
