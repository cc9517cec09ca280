// Files zaya did not write: each class of hostile input a fuzzing campaign found (deep nesting,
// regex nesting, unbounded allocation, numeric edge cases, foreign exceptions, null pointers for
// empty ranges, a TOML library that drops keys) is refused with a zaya::Error naming the file and
// the field. The fuzz targets in tests/fuzz/ search for more; these pin down what they found.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "core/json.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "io/manifest.h"
#include "io/safetensors.h"
#include "io_test_util.h"
#include "model/config.h"
#include "optim/param_rules.h"
#include "train/run_config.h"
#include "train/toml_keys.h"

using namespace zaya;
using zaya::iotest::expect_error;
using zaya::iotest::TempDir;
using zaya::iotest::write_raw;

namespace {

std::string nested(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string safetensors_bytes(const std::string& header) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  return out + header;
}

// A config.json of the tiny preset with one field replaced by raw JSON text.
std::string config_with(const std::string& key, const std::string& raw) {
  nlohmann::json j = ZayaConfig::preset("tiny").to_json();
  j[key] = "@@";
  std::string s = j.dump();
  s.replace(s.find("\"@@\""), 4, raw);
  return s;
}

void expect_config_error(const TempDir& d, const std::string& text, const std::string& part) {
  write_raw(d / "config.json", text);
  expect_error([&] { ZayaConfig::load(d / "config.json"); }, {part});
}

}  // namespace

// ---- Deep nesting: refused before any recursive code walks the tree.
TEST(HostileInput, DeepNestingIsAnErrorForEveryJsonFile) {
  TempDir d;
  const std::string deep = nested(200000);
  expect_error([&] { parse_json(deep, "x.json"); }, {"x.json: not valid JSON"});
  expect_error([&] { parse_json(nested(kMaxJsonDepth + 1), "x.json"); }, {"nest deeper"});
  EXPECT_NO_THROW(parse_json(nested(kMaxJsonDepth), "x.json"));

  write_raw(d / "config.json", "{\"model_type\": \"zaya\", \"layer_types\": " + deep + "}");
  expect_error([&] { ZayaConfig::load(d / "config.json"); }, {"config.json"});

  write_raw(d / "a.safetensors", safetensors_bytes("{\"__metadata__\": " + deep + "}"));
  expect_error([&] { SafetensorsFile::open(d / "a.safetensors"); }, {"a.safetensors"});

  write_raw(d / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"x\": " + deep + "}}");
  expect_error([&] { Tokenizer::load(d / "tokenizer.json"); }, {"tokenizer.json"});

  // A manifest: resume auto skips the checkpoint instead of crashing.
  write_raw(d / "manifest.json", "{\"format\": " + deep + "}");
  const ManifestCheck c = verify_manifest(d.path());
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.reason.find("manifest.json"), std::string::npos) << c.reason;

  write_raw(d / "model.safetensors.index.json", "{\"weight_map\": " + deep + "}");
  expect_error([&] { TensorStore::open(d.path()); }, {"model.safetensors.index.json"});
}

// ---- Regex nesting: bounded before std::regex compiles it.
TEST(HostileInput, RegexRulesAreBoundedBeforeStdRegex) {
  const auto rule = [](const std::string& re) {
    return ParamRule{"re:" + re, OptimizerKind::AdamW, 1.0, std::nullopt};
  };
  const std::string deep = std::string(20000, '(') + "a" + std::string(20000, ')');
  expect_error([&] { validate_param_rule(rule(deep), "run.toml: optim.rules.0"); },
               {"run.toml: optim.rules.0"});
  expect_error(
      [&] { validate_param_rule(rule(std::string(20, '(') + "a" + std::string(20, ')')), "r"); },
      {"groups nest deeper"});
  expect_error([&] { validate_param_rule(rule("((a{1000}){1000}){1000}"), "r"); }, {"states"});
  expect_error([&] { validate_param_rule(rule("a{99999}"), "r"); }, {"repetition count"});
  expect_error([&] { validate_param_rule(rule(std::string(5000, 'a')), "r"); }, {"characters"});
  // A backreference of a hundred digits (fuzz_run_config, 2026-12-07): std::regex's int
  // overflows parsing it; refused first. A short one is std::regex's to judge.
  expect_error([&] { validate_param_rule(rule("(a)\\" + std::string(100, '4') + "d+"), "r"); },
               {"backreference of 100 digits"});
  EXPECT_NO_THROW(validate_param_rule(rule(R"((a)\1)"), "r"));
  // Ordinary patterns are unaffected.
  EXPECT_NO_THROW(validate_param_rule(rule(R"(model\.layers\.(\d+)\.(mlp|self_attn)\..*)"), "r"));
  EXPECT_TRUE(
      rule_matches(rule(R"(.*\.experts\.[a-z_]{2,20})"), "model.layers.0.mlp.experts.down_proj"));
}

// ---- Unbounded allocation: ids far beyond the file's entries.
TEST(HostileInput, TokenizerIdsAreBoundedByTheEntries) {
  TempDir d;
  write_raw(d / "tokenizer.json",
            R"({"model":{"type":"BPE","vocab":{"a":1073741824},"merges":[]}})");
  expect_error([&] { Tokenizer::load(d / "tokenizer.json"); },
               {"tokenizer.json", "model.vocab[\"a\"]"});
  write_raw(d / "tokenizer.json",
            R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},)"
            R"("added_tokens":[{"id":1000000000,"content":"<x>","special":true}]})");
  expect_error([&] { Tokenizer::load(d / "tokenizer.json"); }, {"added_tokens[0].id"});
}

// ---- Numeric edge cases: checked before conversion or multiplication.
TEST(HostileInput, NumericEdgeCasesAreErrors) {
  TempDir d;
  expect_config_error(d, config_with("hidden_size", "1e300"), "hidden_size");
  expect_config_error(d, config_with("vocab_size", "18446744073709551615"), "vocab_size");
  expect_config_error(d, config_with("head_dim", "4611686018427387904"), "too large");
  expect_config_error(d, config_with("num_experts", "4611686018427387904"), "too large");
  // Found by fuzz_model_config: 4e12 layers fit the parameter count but not memory (layer_types).
  expect_config_error(d, config_with("num_hidden_layers", "4000000000000"), "num_hidden_layers");
  // An integral float still reads as before.
  write_raw(d / "config.json", config_with("hidden_size", "128.0"));
  EXPECT_EQ(ZayaConfig::load(d / "config.json").hidden_size, 128);

  // micro_batch × grad_accum, and the phases' budgets.
  expect_error(
      [&] {
        RunConfig::from_toml("[train]\nmicro_batch = 4611686018427387904\ngrad_accum = 4\n",
                             "run.toml");
      },
      {"train.micro_batch × train.grad_accum"});
  expect_error(
      [&] {
        RunConfig::from_toml(
            "[[phase]]\nname = \"a\"\ntokens = 9223372036854775807\n"
            "[[phase]]\nname = \"b\"\ntokens = 9223372036854775807\n",
            "run.toml");
      },
      {"phase budgets"});

  // safetensors: a zero dimension does not hide an overflowing product of the others.
  write_raw(d / "z.safetensors",
            safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],)"
                              R"("data_offsets":[0,0]}})"));
  expect_error([&] { SafetensorsFile::open(d / "z.safetensors"); }, {"overflows"});
  // trainer.json
  expect_error(
      [&] {
        TrainerState::from_json(
            nlohmann::json::parse(R"({"step": 1e300, "tokens": 0, "phase": 0,)"
                                  R"("optimizer_steps": 0, "balancing_steps": 0,)"
                                  R"("data_cursor": null})"),
            "trainer.json");
      },
      {"trainer.json: step"});
}

// ---- Library exceptions leave the parsers only as zaya::Error naming the file.
TEST(HostileInput, LibraryExceptionsBecomeErrorsWithTheFile) {
  TempDir d;
  expect_config_error(d, config_with("rms_norm_eps", "2e639"), "config.json: malformed JSON");
  expect_config_error(d, config_with("eos_token_id", "[\"x\"]"), "eos_token_id");
  expect_config_error(d, config_with("layer_types", "[1, 2]"), "layer_types");
  // An integer a double cannot hold (toml++'s value<double>() is empty: bad_optional_access).
  expect_error(
      [&] { RunConfig::from_toml("[optim]\nbetas = [9007199254740993, 0.95]\n", "run.toml"); },
      {"optim.betas"});
  // Paths the filesystem refuses (ENAMETOOLONG) are Errors, not filesystem_error.
  const std::string long_name(5000, 'a');
  expect_error([&] { RunConfig::load(long_name); }, {"does not exist"});
  expect_error([&] { RunConfig::from_toml("[model]\nconfig = \"" + long_name + "\"\n", "r"); },
               {"model.config"});
}

// ---- Valid data: an empty sequence of an int32 dataset (an empty .bin maps to null).
TEST(HostileInput, EmptySequencesReadWithoutNullPointers) {
  TempDir d;
  {
    IndexedDatasetWriter w(d / "e", TokenDType::Int32);
    w.add_document({});
    w.finish();
  }
  IndexedDataset ds(d / "e");
  EXPECT_EQ(ds.num_tokens(), 0);
  EXPECT_TRUE(ds.sequence(0).empty());
  EXPECT_TRUE(ds.document(0).empty());
  ds.read(0, 0, nullptr);
}

// ---- The TOML library: a parse that lost or invented keys is refused with the line.
TEST(HostileInput, TomlKeysReadAreCheckedAgainstTheFile) {
  // A parse missing a key of the file (what toml++ 3.3.0 does with some multi-line strings).
  const std::string text = "[train]\nsteps = 5\nseed = 3\n";
  const toml::table lost = toml::parse("[train]\nsteps = 5\n");
  expect_error([&] { check_toml_keys_read(text, lost, "run.toml"); }, {"run.toml:3:", "not read"});
  const toml::table extra = toml::parse("[train]\nsteps = 5\nseed = 3\nlog_every = 1\n");
  expect_error([&] { check_toml_keys_read(text, extra, "run.toml"); }, {"run.toml:4:"});
  // Valid files with every construct the scan skips agree with the library.
  const std::string tricky = R"(# comment = 1
top = "a = b # c"
[optim]
lr = 3e-4  # trailing comment
betas = [
  0.9,   # first
  0.95,
]
[[optim.rules]]
pattern = '''re:model\.(a|b)
x = 1 '''
optimizer = """muon""""
[[optim.rules]]
pattern = """
lr = 2 \
  "quoted" ""
"""
lr_mult = 1.0
[data]
"quoted.key" = 'x'
blend = [ { prefix = "p", weight = 1.0 }, { prefix = "[q]", weight = 2.0 } ]
dotted.key = 1
)";
  EXPECT_NO_THROW(check_toml_keys_read(tricky, toml::parse(tricky), "t.toml"));
}
