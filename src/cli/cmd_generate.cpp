// `zaya generate` and `zaya eval`: run a checkpoint (transformers layout or the original release
// layout) through a Decoder (engine/decoder.h): the CPU reference, or the GPU (`--device cuda`).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/model_io.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "engine/decoder.h"
#include "model/zaya.h"

namespace zaya::cli {

namespace {

std::vector<int32_t> parse_ids(const std::string& s, const std::string& what) {
  std::vector<int32_t> ids;
  std::istringstream in(s);
  std::string tok;
  while (in >> tok) {
    try {
      size_t pos = 0;
      long long v = std::stoll(tok, &pos);
      if (pos != tok.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(tok);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("{}: '{}' is not a token id (expected non-negative integers)", what, tok);
    }
  }
  return ids;
}

void check_ids(const std::vector<int32_t>& ids, int64_t vocab, const std::string& what) {
  for (size_t i = 0; i < ids.size(); i++)
    ZAYA_CHECK(ids[i] < vocab, "{}: token id {} at position {} is >= vocab_size {}", what, ids[i],
               i, vocab);
}

// The tokenizer of a model directory: --tokenizer, else DIR/tokenizer.json, else bytes when the
// model's vocabulary is the byte tokenizer's.
std::unique_ptr<Tokenizer> model_tokenizer(const std::string& flag, const std::string& dir,
                                           const ZayaConfig& cfg) {
  if (!flag.empty()) return Tokenizer::load(flag);
  if (std::filesystem::exists(dir + "/tokenizer.json"))
    return Tokenizer::load(dir + "/tokenizer.json");
  if (std::filesystem::exists(dir + "/tokenizer.txt")) {
    std::ifstream in(dir + "/tokenizer.txt");
    std::string spec;
    in >> spec;
    if (spec == "bytes") return Tokenizer::load("bytes");
  }
  if (cfg.vocab_size <= 512) return Tokenizer::load("bytes");
  fail("{}: no tokenizer.json in the model directory; pass --tokenizer FILE or use --ids", dir);
}

void add_device_option(CLI::App& app, std::string& device) {
  app.add_option("--device", device, "cpu (fp32 reference) or cuda (bf16 on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

int run_generate(int argc, char** argv) {
  CLI::App app{"Generate text from a checkpoint", "zaya generate"};
  std::string model, prompt, ids_text, tokenizer;
  int64_t max_new = 64;
  bool greedy = false, print_ids = false;
  std::string device = "cpu";
  SamplingOptions opt;
  app.add_option("--model", model, "checkpoint directory (config.json + safetensors)")->required();
  auto* p = app.add_option("--prompt", prompt, "prompt text");
  auto* i = app.add_option("--ids", ids_text, "prompt as token ids, e.g. \"1 2 3\"");
  p->excludes(i);
  app.add_option("--tokenizer", tokenizer, "tokenizer.json or 'bytes' (default: the model's)");
  app.add_option("--max-new-tokens,-n", max_new, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--greedy", greedy, "always take the most likely token");
  app.add_option("--temperature", opt.temperature, "sampling temperature");
  app.add_option("--top-k", opt.top_k, "keep the k most likely tokens (0: all)");
  app.add_option("--top-p", opt.top_p, "nucleus sampling mass");
  app.add_option("--seed", opt.seed, "sampling seed");
  app.add_flag("--print-ids", print_ids, "print token ids instead of text");
  add_device_option(app, device);
  if (!parse_or_help(app, argc, argv)) return 0;
  ZAYA_CHECK(!prompt.empty() || !ids_text.empty(), "give --prompt TEXT or --ids \"1 2 3\"");
  opt.greedy = greedy;
  ZAYA_CHECK(opt.temperature > 0 || greedy, "--temperature must be positive, got {}",
             opt.temperature);

  ZayaModel m = load_model(model);
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> ids;
  if (!ids_text.empty()) {
    ids = parse_ids(ids_text, "--ids");
  } else {
    tok = model_tokenizer(tokenizer, model, m.cfg);
    ids = tok->encode(prompt, false);
    if (tok->bos_id() >= 0 && tok->bos_id() < m.cfg.vocab_size)
      ids.insert(ids.begin(), tok->bos_id());
  }
  ZAYA_CHECK(!ids.empty(), "the prompt has no tokens");
  check_ids(ids, m.cfg.vocab_size, "prompt");
  if (!print_ids && !tok) tok = model_tokenizer(tokenizer, model, m.cfg);
  const int32_t stop = int32_t(m.cfg.eos_token_id);
  // Built first: a missing GPU fails before any output.
  const auto dec =
      make_decoder(m, {.device = device, .max_context = int64_t(ids.size()) + max_new});
  if (!print_ids)
    std::fputs(prompt.empty() ? tok->decode(ids, true).c_str() : prompt.c_str(), stdout);
  std::vector<int32_t> pending;
  std::string shown;
  auto on_token = [&](int32_t t) {
    if (print_ids) {
      std::printf("%d ", t);
    } else if (t != stop) {
      // Decode the whole pending run so multi-token characters (byte fallback) print correctly.
      pending.push_back(t);
      std::string s = tok->decode(pending, true);
      std::fputs(s.substr(std::min(shown.size(), s.size())).c_str(), stdout);
      shown = s;
    }
    std::fflush(stdout);
  };
  generate(*dec, ids, max_new, opt, stop, on_token);
  std::printf("\n");
  return 0;
}

int run_eval(int argc, char** argv) {
  CLI::App app{"Mean next-token cross-entropy of a checkpoint on some tokens", "zaya eval"};
  std::string model, ids_file, text_file, tokenizer;
  int64_t seq = 0;
  std::string device = "cpu";
  app.add_option("--model", model, "checkpoint directory")->required();
  auto* a = app.add_option("--ids-file", ids_file, "whitespace-separated token ids");
  auto* b = app.add_option("--text-file", text_file, "text, tokenized with the model's tokenizer");
  a->excludes(b);
  app.add_option("--tokenizer", tokenizer, "tokenizer.json or 'bytes'");
  app.add_option("--seq", seq, "evaluate in windows of this many tokens (default: whole input)");
  add_device_option(app, device);
  if (!parse_or_help(app, argc, argv)) return 0;
  ZAYA_CHECK(!ids_file.empty() || !text_file.empty(), "give --ids-file F or --text-file F");
  ZayaModel m = load_model(model);
  std::vector<int32_t> ids;
  const std::string src = ids_file.empty() ? text_file : ids_file;
  std::ifstream in(src, std::ios::binary);
  ZAYA_CHECK(in.good(), "cannot open '{}'", src);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!ids_file.empty()) {
    ids = parse_ids(content, ids_file);
  } else {
    auto tok = model_tokenizer(tokenizer, model, m.cfg);
    ids = tok->encode(content, false);
  }
  check_ids(ids, m.cfg.vocab_size, src);
  ZAYA_CHECK(ids.size() >= 2, "{}: need at least 2 tokens to score next-token prediction", src);
  const int64_t n = int64_t(ids.size());
  const auto dec =
      make_decoder(m, {.device = device, .max_context = seq > 1 ? std::min(seq, n) : n});
  const EvalResult r = evaluate(*dec, ids, seq);
  std::printf("{\"loss\": %.8f, \"perplexity\": %.6f, \"tokens\": %lld, \"scored\": %lld}\n",
              r.loss, std::exp(r.loss), (long long)n, (long long)r.scored);
  return 0;
}

}  // namespace

ZAYA_COMMAND("generate", "generate text from a checkpoint", run_generate);
ZAYA_COMMAND("eval", "mean next-token loss of a checkpoint on ids or text", run_eval);

}  // namespace zaya::cli
