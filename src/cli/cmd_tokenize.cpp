// `zaya tokenize`: text to token ids and back with any tokenizer zaya can load ("bytes" or a
// tokenizer.json), for checking a tokenizer by hand and in scripts.
//   zaya tokenize --tokenizer T [TEXT...] [--input FILE|-] [--add-special] [--format
//   ids|json|pieces]
//   zaya tokenize --tokenizer T --decode [IDS...] [--input FILE|-] [--skip-special]
//   both: [--output FILE] (written atomically) [--stats] (sizes and timings on stderr)
// With no TEXT and no --input, the input is stdin unless it is a terminal; empty input is an
// error. The input is one text (a file is not split into lines or documents: `zaya data prepare`
// does that). Not here: batching of many documents, or writing datasets.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "io/atomic.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The text (or ids) to work on: the arguments, else --input FILE (- for stdin), else stdin when it
// is not a terminal (piped or redirected). Empty input is an error, never a silent empty encoding.
std::string read_input(const std::string& input, const std::vector<std::string>& args) {
  ZAYA_CHECK(input.empty() || args.empty(),
             "tokenize: give the input either as arguments or with --input, not both");
  std::string text;
  std::string source = "the input";
  if (!args.empty()) {
    for (size_t i = 0; i < args.size(); i++) text += (i ? " " : "") + args[i];
    source = "the arguments";
  } else if (!input.empty() && input != "-") {
    text = zaya::read_file(input);
    source = "'" + input + "'";
  } else {
    ZAYA_CHECK(input == "-" || !isatty(fileno(stdin)),
               "tokenize: no input: give TEXT arguments, --input FILE, or pipe text on stdin");
    std::ostringstream s;
    s << std::cin.rdbuf();
    text = s.str();
    source = "stdin";
  }
  ZAYA_CHECK(!text.empty(), "tokenize: empty input ({}): nothing to encode or decode", source);
  return text;
}

// Whitespace-separated decimal ids; errors say which one is wrong and where.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& source) {
  std::vector<int32_t> ids;
  size_t i = 0, n = 0;
  while (true) {
    while (i < text.size() && std::isspace(uint8_t(text[i]))) i++;
    if (i == text.size()) break;
    size_t j = i;
    while (j < text.size() && !std::isspace(uint8_t(text[j])) && text[j] != ',') j++;
    const std::string word = text.substr(i, j - i);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ZAYA_CHECK(
        used == word.size() && !word.empty() && v >= 0 && v <= INT32_MAX,
        "tokenize --decode: {} item {} is '{}', expected a token id (a non-negative integer)",
        source, n, word);
    ids.push_back(int32_t(v));
    n++;
    i = j < text.size() && text[j] == ',' ? j + 1 : j;
  }
  return ids;
}

int run_tokenize(int argc, char** argv) {
  CLI::App app{"encode text to token ids, or decode ids to text", "zaya tokenize"};
  std::string spec, input, output, format = "ids";
  std::vector<std::string> args;
  bool add_special = false, decode = false, skip_special = false, stats = false;
  app.add_option("--tokenizer", spec, "\"bytes\" or a tokenizer.json (or its directory)")
      ->required();
  app.add_option("args", args, "the text to encode (words joined by spaces), or the ids to decode");
  app.add_option("--input", input,
                 "read the text (or ids) from this file; - for stdin (the default when no "
                 "arguments are given and stdin is not a terminal)");
  app.add_option("--output", output, "write here (atomically) instead of stdout");
  app.add_flag("--add-special", add_special, "apply the post-processor (e.g. a leading <bos>)");
  app.add_option("--format", format,
                 "ids: one line of ids; json: {\"ids\", \"pieces\"}; pieces: \"id<TAB>piece\" "
                 "lines, the piece JSON-quoted (a piece is its id decoded alone, so a byte "
                 "token of a multi-byte character shows as U+FFFD)")
      ->check(CLI::IsMember({"ids", "json", "pieces"}))
      ->capture_default_str();
  app.add_flag("--decode", decode, "decode ids (whitespace or comma separated) to text");
  app.add_flag("--skip-special", skip_special, "when decoding, drop special tokens");
  app.add_flag("--stats", stats, "print sizes, load and encode times to stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const auto t_load = Clock::now();
  auto tok = zaya::Tokenizer::load(spec);
  const double load_s = seconds_since(t_load);
  const std::string in = read_input(input, args);

  std::string out;
  const auto t_run = Clock::now();
  size_t n_ids = 0;
  if (decode) {
    const auto ids = parse_ids(in, input.empty() ? "argument" : "'" + input + "'");
    n_ids = ids.size();
    out = tok->decode(ids, skip_special);
    if (output.empty()) out += '\n';
  } else {
    const auto ids = tok->encode(in, add_special);
    n_ids = ids.size();
    if (format == "ids") {
      out = fmt::format("{}\n", fmt::join(ids, " "));
    } else {
      std::vector<std::string> pieces;
      pieces.reserve(ids.size());
      for (int32_t id : ids) pieces.push_back(tok->decode({id}));
      const auto quoted = [](const std::string& s) {
        return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      };
      if (format == "json") {
        nlohmann::json j = {{"ids", ids}, {"pieces", pieces}};
        out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      } else {
        for (size_t i = 0; i < ids.size(); i++)
          out += fmt::format("{}\t{}\n", ids[i], quoted(pieces[i]));
      }
    }
  }
  const double run_s = seconds_since(t_run);

  if (output.empty())
    std::fwrite(out.data(), 1, out.size(), stdout);
  else
    zaya::write_file_atomic(output, out);
  std::fflush(stdout);  // the stats line on stderr comes after the output
  if (stats) {
    const size_t text_bytes = decode ? out.size() : in.size();
    std::fprintf(
        stderr,
        "tokenizer %s (vocab %lld): %zu bytes <-> %zu tokens (%.2f bytes/token); load %.3f "
        "s, %s %.3f s (%.2f MB/s)\n",
        tok->name().c_str(), (long long)tok->vocab_size(), text_bytes, n_ids,
        n_ids ? double(text_bytes) / n_ids : 0.0, load_s, decode ? "decode" : "encode", run_s,
        run_s > 0 ? text_bytes / 1e6 / run_s : 0.0);
  }
  return 0;
}

}  // namespace

ZAYA_COMMAND("tokenize", "encode text to token ids or decode ids, with bytes or a tokenizer.json",
             run_tokenize);
