// `zaya data prepare`: text and JSONL files (and optionally the Brown corpus) tokenized in
// parallel into one Megatron indexed dataset.
//
// Inputs: a file ending in .jsonl is JSON Lines, one document per line taken from a string field
// (default "text"); blank lines are skipped; a line that is not a JSON object with that string
// field is an Error naming file:line. Any other file is plain text, split into documents by
// `text_split`: File (the whole file is one document; the default), Paragraph (blocks separated by
// blank lines), or Line (each non-blank line). Documents whose text is empty are skipped.
//
// Each document is encoded without special tokens and, with append_eos, followed by the
// tokenizer's EOS, then written as one sequence and one document (Megatron's GPT layout).
// Workers tokenize batches of documents concurrently; batches are written in input order, so the
// output is byte-identical for any worker count. The output is committed only when complete.
//
// Deliberately not here: sentence splitting, deduplication, filtering, and sharding the output.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace zaya {

enum class TextSplit { File, Paragraph, Line };
TextSplit parse_text_split(const std::string& s);  // "file", "paragraph", "line"

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string brown_dir;  // non-empty: the Brown corpus documents come first
  std::string output_prefix;
  std::string jsonl_key = "text";
  TextSplit text_split = TextSplit::File;
  int workers = 0;  // 0: one per hardware thread
  bool append_eos = true;
  std::string dtype = "auto";    // "auto" picks uint16 for vocabularies up to 65536, else int32
  size_t batch_bytes = 1 << 22;  // text per worker batch
};

struct PrepareStats {
  int64_t documents = 0, tokens = 0, skipped_empty = 0, text_bytes = 0;
  double seconds = 0;
};

// progress (optional) is called about once a second with the running totals.
PrepareStats prepare_dataset(const PrepareOptions& opts, const Tokenizer& tok,
                             const std::function<void(const PrepareStats&)>& progress = {});

}  // namespace zaya
