// Brown corpus untagging and unigram entropy (see corpus.h).
#include "data/corpus.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "data/indexed_dataset.h"

namespace zaya {

namespace {

bool is_one_of(std::string_view w, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), w) != set.end();
}

// Punctuation printed against the word before it.
bool attaches_left(std::string_view w) {
  return is_one_of(w, {",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "'s", "n't", "%"});
}
// Punctuation printed against the word after it.
bool attaches_right(std::string_view w) {
  return is_one_of(w, {"(", "[", "{", "``", "$"});
}

}  // namespace

std::string brown_untag_line(std::string_view line) {
  std::string out;
  bool glue_next = true;  // no space before the first word
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) i++;
    size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) j++;
    if (j == i) break;
    std::string_view tok = line.substr(i, j - i);
    i = j;
    // The tag follows the last slash; words may contain slashes themselves ("1/2/cd").
    const size_t slash = tok.rfind('/');
    std::string_view word = slash == std::string_view::npos ? tok : tok.substr(0, slash);
    if (word.empty() || word.substr(0, 2) == "**") continue;  // tag-only and placeholder tokens
    // "Jr./np ./." prints as "Jr." rather than "Jr..".
    if (word == "." && !out.empty() && out.back() == '.') continue;
    const bool left = attaches_left(word), right = attaches_right(word);
    if (!glue_next && !left) out.push_back(' ');
    if (word == "``" || word == "''")
      out.push_back('"');
    else
      out.append(word);
    glue_next = right;
  }
  return out;
}

std::string brown_untag_file(std::string_view contents) {
  std::string out, para;
  auto end_paragraph = [&] {
    if (para.empty()) return;
    if (!out.empty()) out += "\n\n";
    out += para;
    para.clear();
  };
  size_t pos = 0;
  while (pos <= contents.size()) {
    size_t nl = contents.find('\n', pos);
    if (nl == std::string_view::npos) nl = contents.size();
    std::string_view line = contents.substr(pos, nl - pos);
    pos = nl + 1;
    const bool blank = line.find_first_not_of(" \t\r") == std::string_view::npos;
    if (blank) {
      end_paragraph();
      continue;
    }
    if (line[0] == '\t' || line[0] == ' ') end_paragraph();
    std::string s = brown_untag_line(line);
    if (s.empty()) continue;
    if (!para.empty()) para.push_back(' ');
    para += s;
  }
  end_paragraph();
  return out;
}

std::vector<BrownDocument> read_brown_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  ZAYA_CHECK(fs::is_directory(dir), "{}: not a directory (expected the Brown corpus files)", dir);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() == 4 && n[0] == 'c' && n[1] >= 'a' && n[1] <= 'r' && std::isdigit(n[2]) &&
        std::isdigit(n[3]) && e.is_regular_file())
      names.push_back(n);
  }
  ZAYA_CHECK(!names.empty(),
             "{}: no Brown corpus files (named c[a-r][0-9][0-9], e.g. ca01) in this directory",
             dir);
  std::sort(names.begin(), names.end());
  std::vector<BrownDocument> docs;
  for (const auto& n : names) {
    const std::string path = (fs::path(dir) / n).string();
    std::ifstream f(path, std::ios::binary);
    ZAYA_CHECK(f.good(), "{}: cannot open", path);
    std::stringstream ss;
    ss << f.rdbuf();
    docs.push_back({n, brown_untag_file(ss.str())});
    ZAYA_CHECK(!docs.back().text.empty(), "{}: no words found (is this a Brown corpus file?)",
               path);
  }
  return docs;
}

namespace {

double entropy_from_counts(const std::vector<int64_t>& counts, int64_t n) {
  double h = 0;
  for (int64_t c : counts)
    if (c > 0) {
      const double p = double(c) / double(n);
      h -= p * std::log(p);
    }
  return h;
}

template <typename Get>
double entropy_of(int64_t n, Get get) {
  if (n == 0) return 0.0;
  // Dense counts for ids below 2^26 (every real vocabulary); a hash map past that.
  constexpr int64_t kDense = int64_t(1) << 26;
  std::vector<int64_t> dense;
  std::unordered_map<int64_t, int64_t> sparse;
  for (int64_t i = 0; i < n; i++) {
    const int64_t t = get(i);
    if (t >= 0 && t < kDense) {
      if (t >= int64_t(dense.size()))
        dense.resize(size_t(std::max<int64_t>(t + 1, 2 * dense.size())));
      dense[size_t(t)]++;
    } else {
      sparse[t]++;
    }
  }
  for (auto& [k, c] : sparse) dense.push_back(c);
  return entropy_from_counts(dense, n);
}

}  // namespace

double unigram_entropy_nats(const int32_t* tokens, int64_t n) {
  return entropy_of(n, [&](int64_t i) { return int64_t(tokens[i]); });
}

double unigram_entropy_nats(const IndexedDataset& ds) {
  return entropy_of(ds.num_tokens(), [&](int64_t i) { return ds.token(i); });
}

double unigram_entropy_nats(const IndexedDataset& ds, int64_t doc_begin, int64_t doc_end) {
  ZAYA_CHECK(0 <= doc_begin && doc_begin <= doc_end && doc_end <= ds.num_documents(),
             "{}: document range [{}, {}) is outside [0, {})", ds.prefix(), doc_begin, doc_end,
             ds.num_documents());
  const int64_t b = ds.document_begin(doc_begin), e = ds.document_begin(doc_end);
  return entropy_of(e - b, [&](int64_t i) { return ds.token(b + i); });
}

}  // namespace zaya
