// Parallel, order-preserving tokenization into an indexed dataset (see prepare.h).
//
// The reader thread (the caller) cuts the input into batches of about batch_bytes of text; a round
// of up to `workers` batches is tokenized by that many std::threads, then written in batch order.
// An error inside a worker is kept with its batch and rethrown when that batch's turn to be written
// comes, so the reported error is the first one in input order whatever the scheduling.
#include "data/prepare.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/json.h"
#include "data/corpus.h"
#include "data/indexed_dataset.h"

namespace zaya {

TextSplit parse_text_split(const std::string& s) {
  if (s == "file") return TextSplit::File;
  if (s == "paragraph") return TextSplit::Paragraph;
  if (s == "line") return TextSplit::Line;
  fail("unknown text split \"{}\" (expected file, paragraph or line)", s);
}

namespace {

struct RawDoc {
  std::string text;  // document text, or a JSON line to parse
  bool json = false;
  int file = -1;  // index into the file names, for messages
  int64_t line = 0;
};

struct Batch {
  std::vector<RawDoc> docs;
  size_t bytes = 0;
  // Results.
  std::vector<int32_t> tokens;
  std::vector<int64_t> lengths;  // per kept document
  int64_t skipped = 0;
  std::exception_ptr error;
};

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool is_blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

void tokenize_batch(Batch& b, const Tokenizer& tok, const std::vector<std::string>& files,
                    const std::string& key, bool append_eos) {
  try {
    for (auto& d : b.docs) {
      std::string text;
      if (d.json) {
        const std::string where = files[size_t(d.file)] + ":" + std::to_string(d.line);
        const nlohmann::json j = parse_json(d.text, where, nullptr, "invalid JSON");
        ZAYA_CHECK(j.is_object(), "{}: expected a JSON object with a string field \"{}\", got {}",
                   where, key, j.type_name());
        auto it = j.find(key);
        ZAYA_CHECK(it != j.end(), "{}: JSON object has no field \"{}\"", where, key);
        ZAYA_CHECK(it->is_string(), "{}: field \"{}\" must be a string, got {}", where, key,
                   it->type_name());
        text = it->get<std::string>();
      } else {
        text = std::move(d.text);
      }
      if (text.empty()) {
        b.skipped++;
        continue;
      }
      std::vector<int32_t> ids = tok.encode(text, false);
      if (append_eos) ids.push_back(tok.eos_id());
      b.tokens.insert(b.tokens.end(), ids.begin(), ids.end());
      b.lengths.push_back(int64_t(ids.size()));
    }
  } catch (...) {
    b.error = std::current_exception();
  }
  b.docs.clear();
  b.docs.shrink_to_fit();
}

// Produces documents from the inputs in order.
class DocReader {
 public:
  DocReader(const PrepareOptions& o, std::vector<std::string>& files) : o_(o), files_(files) {
    if (!o.brown_dir.empty()) {
      for (auto& d : read_brown_corpus(o.brown_dir)) {
        files_.push_back(o.brown_dir + "/" + d.name);
        pending_.push_back({std::move(d.text), false, int(files_.size()) - 1, 0});
      }
    }
    for (const auto& f : o.inputs) {
      ZAYA_CHECK(!std::filesystem::is_directory(f), "{}: is a directory (expected a file)", f);
      std::ifstream probe(f, std::ios::binary);
      ZAYA_CHECK(probe.good(), "{}: cannot open", f);
    }
  }

  // False at the end of all inputs.
  bool next(RawDoc& out) {
    while (true) {
      if (pend_pos_ < pending_.size()) {
        out = std::move(pending_[pend_pos_++]);
        return true;
      }
      if (!in_.is_open()) {
        if (next_input_ >= o_.inputs.size()) return false;
        const std::string& path = o_.inputs[next_input_++];
        files_.push_back(path);
        file_ = int(files_.size()) - 1;
        in_.open(path, std::ios::binary);
        ZAYA_CHECK(in_.good(), "{}: cannot open", path);
        json_ = ends_with(path, ".jsonl");
        line_ = 0;
        if (!json_ && o_.text_split == TextSplit::File) {
          std::string all((std::istreambuf_iterator<char>(in_)), std::istreambuf_iterator<char>());
          ZAYA_CHECK(!in_.bad(), "{}: read error", path);
          in_.close();
          out = {std::move(all), false, file_, 0};
          return true;
        }
      }
      std::string line, para;
      int64_t para_line = 0;
      while (std::getline(in_, line)) {
        line_++;
        if (json_ || o_.text_split == TextSplit::Line) {
          if (is_blank(line)) continue;
          out = {std::move(line), json_, file_, line_};
          return true;
        }
        // Paragraph mode.
        if (is_blank(line)) {
          if (!para.empty()) {
            out = {std::move(para), false, file_, para_line};
            return true;
          }
          continue;
        }
        if (para.empty())
          para_line = line_;
        else
          para.push_back('\n');
        para += line;
      }
      ZAYA_CHECK(!in_.bad(), "{}: read error", files_[size_t(file_)]);
      in_.close();
      if (!para.empty()) {
        out = {std::move(para), false, file_, para_line};
        return true;
      }
    }
  }

 private:
  const PrepareOptions& o_;
  std::vector<std::string>& files_;
  std::vector<RawDoc> pending_;
  size_t pend_pos_ = 0, next_input_ = 0;
  std::ifstream in_;
  bool json_ = false;
  int file_ = -1;
  int64_t line_ = 0;
};

}  // namespace

PrepareStats prepare_dataset(const PrepareOptions& o, const Tokenizer& tok,
                             const std::function<void(const PrepareStats&)>& progress) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  ZAYA_CHECK(!o.inputs.empty() || !o.brown_dir.empty(), "data prepare: no input files given");
  ZAYA_CHECK(!o.output_prefix.empty(), "data prepare: no output prefix given");
  ZAYA_CHECK(!o.jsonl_key.empty(), "data prepare: the JSONL key must not be empty");
  if (o.append_eos)
    ZAYA_CHECK(tok.eos_id() >= 0,
               "tokenizer {}: has no EOS token to append (disable EOS appending)", tok.name());
  const TokenDType dtype =
      o.dtype == "auto" ? token_dtype_for_vocab(tok.vocab_size()) : parse_token_dtype(o.dtype);
  int workers = o.workers > 0 ? o.workers : int(std::max(1u, std::thread::hardware_concurrency()));

  std::vector<std::string> files;
  DocReader reader(o, files);
  const auto parent = std::filesystem::path(o.output_prefix).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  IndexedDatasetWriter writer(o.output_prefix, dtype);

  PrepareStats st;
  auto last_report = clock::now();
  bool more = true;
  while (more) {
    std::vector<Batch> round(static_cast<size_t>(workers));
    size_t used = 0;
    for (; used < round.size() && more; used++) {
      Batch& b = round[used];
      RawDoc d;
      while (b.bytes < o.batch_bytes && (more = reader.next(d))) {
        b.bytes += d.text.size();
        b.docs.push_back(std::move(d));
      }
      if (b.docs.empty()) break;
    }
    round.resize(used);
    if (round.empty()) break;
    std::vector<std::thread> threads;
    for (size_t i = 1; i < round.size(); i++)
      threads.emplace_back(tokenize_batch, std::ref(round[i]), std::cref(tok), std::cref(files),
                           std::cref(o.jsonl_key), o.append_eos);
    tokenize_batch(round[0], tok, files, o.jsonl_key, o.append_eos);
    for (auto& t : threads) t.join();
    for (auto& b : round) {
      if (b.error) std::rethrow_exception(b.error);
      int64_t at = 0;
      for (int64_t len : b.lengths) {
        writer.add_document(std::span<const int32_t>(b.tokens.data() + at, size_t(len)));
        at += len;
      }
      st.documents += int64_t(b.lengths.size());
      st.tokens += at;
      st.skipped_empty += b.skipped;
      st.text_bytes += int64_t(b.bytes);
    }
    if (progress && clock::now() - last_report > std::chrono::seconds(1)) {
      last_report = clock::now();
      st.seconds = std::chrono::duration<double>(last_report - t0).count();
      progress(st);
    }
  }
  ZAYA_CHECK(st.documents > 0, "data prepare: the inputs hold no non-empty documents");
  writer.finish();
  st.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return st;
}

}  // namespace zaya
