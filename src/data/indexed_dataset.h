// Megatron-LM "MMIDIDX" indexed datasets: a `.bin` of raw token ids and an `.idx` describing the
// sequences and documents in it (byte layout in docs/DATA_FORMAT.md). The writer streams tokens to
// disk and commits both files by rename; the reader memory-maps both and validates every field of
// the index against the data file before handing out a single token, so a truncated, mismatched or
// corrupt pair fails at open with the file and field named.
//
// Token ids wider than 16 bits are stored with Megatron's int32 code (4): Megatron has no uint32
// code, and for ids below 2^31 the int32 and uint32 little-endian bytes are identical, so a
// Megatron reader and ours see the same ids. Deliberately not here: Megatron's multimodal
// `sequence_modes` trailer (rejected with a message), float datasets (rejected: tokens are
// integers), merging.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace zaya {

// Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
enum class TokenDType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};
// Bytes per element; 0 for a code that is not in Megatron's table.
int token_dtype_size(uint8_t code);
const char* token_dtype_name(uint8_t code);
// Parses "uint8", "uint16", "int16", "int32", "int64" (also "uint32", stored as int32).
TokenDType parse_token_dtype(const std::string& name);
// The narrowest dtype holding ids [0, vocab_size): uint16 up to 65536, else int32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kIndexHeaderBytes = 34;  // magic 9 + version 8 + dtype 1 + counts 16

// Streams sequences into `<prefix>.bin` and writes `<prefix>.idx` at finish(). Both are written
// under temporary names (`<file>.tmp.<pid>`) and renamed into place only when the whole dataset
// is on disk (the .bin first, then the .idx); destroying a writer that was not finished removes
// the temporaries and leaves any previous dataset at `prefix` untouched.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one sequence. Every id must fit the dtype (an Error names the id and the dtype).
  void add_sequence(std::span<const int32_t> tokens);
  // Closes the current document (the sequences added since the previous end_document).
  void end_document();
  void add_document(std::span<const int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  // Closes a pending document, writes the index, fsyncs and renames both files into place.
  void finish();
  // Removes the temporaries; idempotent.
  void abort() noexcept;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return int64_t(lengths_.size()); }
  int64_t num_documents() const { return int64_t(doc_idx_.size()) - 1; }
  const std::string& prefix() const { return prefix_; }

 private:
  void flush_buffer();
  std::string prefix_, bin_tmp_, idx_tmp_;
  TokenDType dtype_;
  int elem_ = 4;
  int bin_fd_ = -1;
  bool done_ = false;
  int64_t num_tokens_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<char> buf_;
};

// A read-only, memory-mapped, fully validated dataset. Token positions are global element indices
// into the .bin (the reader requires sequences to be contiguous and in order, as Megatron's writer
// makes them), so a document is the token range [document_begin(d), document_end(d)).
class IndexedDataset {
 public:
  // Opens `<prefix>.idx` and `<prefix>.bin`.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  const std::string& idx_path() const { return idx_path_; }
  const std::string& bin_path() const { return bin_path_; }
  TokenDType dtype() const { return dtype_; }
  int element_size() const { return elem_; }

  int64_t num_sequences() const { return seq_count_; }
  // Documents as Megatron counts them: document_indices has num_documents()+1 entries.
  int64_t num_documents() const { return doc_count_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  // The raw index arrays (read with unaligned loads: the int32 array starts at byte 34).
  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;  // bytes into .bin
  int64_t document_index(int64_t i) const;    // i in [0, num_documents()]

  int64_t sequence_begin(int64_t i) const { return sequence_pointer(i) / elem_; }
  int64_t document_begin(int64_t d) const;
  int64_t document_end(int64_t d) const { return document_begin(d + 1); }
  int64_t document_length(int64_t d) const { return document_end(d) - document_begin(d); }

  // Copies tokens [pos, pos+count) to out as int32 (an id that does not fit int32 is an Error).
  void read(int64_t pos, int64_t count, int32_t* out) const;
  std::vector<int32_t> read(int64_t pos, int64_t count) const;
  std::vector<int32_t> sequence(int64_t i) const;
  std::vector<int32_t> document(int64_t d) const;
  int64_t token(int64_t pos) const;

  // Scans the whole .bin (in parallel). max_token_id() is -1 for an empty dataset.
  int64_t max_token_id() const;
  // Errors "<prefix>.bin: token id 300000 at position N >= vocab_size 262272" at the first
  // offending position (or names the first negative id).
  void check_vocab(int64_t vocab_size) const;

 private:
  std::string prefix_, idx_path_, bin_path_;
  TokenDType dtype_ = TokenDType::Int32;
  int elem_ = 4;
  int64_t seq_count_ = 0, doc_count_ = 0, num_tokens_ = 0;
  const uint8_t* idx_ = nullptr;
  const uint8_t* bin_ = nullptr;
  size_t idx_size_ = 0, bin_size_ = 0;
};

}  // namespace zaya
