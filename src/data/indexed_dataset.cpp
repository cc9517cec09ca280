// Writer and validating mmap reader for Megatron MMIDIDX datasets (see indexed_dataset.h).
// Validation is exhaustive but linear: every length and pointer is checked once at open, which is
// cheap next to a training run and turns a bad file into one message instead of a wrong sample
// hours later.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>

#include "core/error.h"
#include "core/parallel.h"

namespace zaya {

int token_dtype_size(uint8_t code) {
  switch (code) {
    case 1:
    case 2: return 1;
    case 3:
    case 8: return 2;
    case 4:
    case 7: return 4;
    case 5:
    case 6: return 8;
    default: return 0;
  }
}

const char* token_dtype_name(uint8_t code) {
  static const char* names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                "int64", "float64", "float32", "uint16"};
  return code <= 8 ? names[code] : "?";
}

TokenDType parse_token_dtype(const std::string& n) {
  if (n == "uint8") return TokenDType::UInt8;
  if (n == "uint16") return TokenDType::UInt16;
  if (n == "int16") return TokenDType::Int16;
  if (n == "int32" || n == "uint32") return TokenDType::Int32;
  if (n == "int64") return TokenDType::Int64;
  fail("unknown token dtype \"{}\" (expected uint8, uint16, int16, int32, uint32 or int64)", n);
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  ZAYA_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 31),
             "vocab_size {} cannot be stored as token ids (expected 1..2^31)", vocab_size);
  return vocab_size <= 65536 ? TokenDType::UInt16 : TokenDType::Int32;
}

namespace {

std::string sys_err() {
  return std::strerror(errno);
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("{}: write failed: {}", path, sys_err());
    c += w;
    n -= size_t(w);
  }
}

void fsync_close(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("{}: fsync failed: {}", path, sys_err());
  }
  if (::close(fd) != 0) fail("{}: close failed: {}", path, sys_err());
}

void fsync_parent(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Token at element i of a .bin of the given dtype, widened to int64.
inline int64_t load_token(const uint8_t* bin, TokenDType dt, int64_t i) {
  switch (dt) {
    case TokenDType::UInt8: return bin[i];
    case TokenDType::Int8: return int8_t(bin[i]);
    case TokenDType::Int16: return load<int16_t>(bin + 2 * i);
    case TokenDType::UInt16: return load<uint16_t>(bin + 2 * i);
    case TokenDType::Int32: return load<int32_t>(bin + 4 * i);
    case TokenDType::Int64: return load<int64_t>(bin + 8 * i);
    default: return 0;  // float codes are rejected at open
  }
}

// Maps a whole file read-only; a zero-length file maps to nullptr.
const uint8_t* map_file(const std::string& path, size_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("{}: cannot open: {}", path, sys_err());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat: {}", path, sys_err());
  }
  *size = size_t(st.st_size);
  if (*size == 0) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, *size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail("{}: mmap failed: {}", path, sys_err());
  return static_cast<const uint8_t*>(p);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  elem_ = token_dtype_size(uint8_t(dtype));
  ZAYA_CHECK(elem_ > 0 && dtype != TokenDType::Float32 && dtype != TokenDType::Float64,
             "{}: token dtype code {} is not an integer dtype", prefix_, int(dtype));
  const std::string pid = std::to_string(::getpid());
  bin_tmp_ = prefix_ + ".bin.tmp." + pid;
  idx_tmp_ = prefix_ + ".idx.tmp." + pid;
  bin_fd_ = ::open(bin_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (bin_fd_ < 0) fail("{}: cannot create: {}", bin_tmp_, sys_err());
  buf_.reserve(1 << 22);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  abort();
}

void IndexedDatasetWriter::abort() noexcept {
  if (done_) return;
  done_ = true;
  if (bin_fd_ >= 0) ::close(bin_fd_);
  bin_fd_ = -1;
  ::unlink(bin_tmp_.c_str());
  ::unlink(idx_tmp_.c_str());
}

void IndexedDatasetWriter::flush_buffer() {
  write_all(bin_fd_, buf_.data(), buf_.size(), bin_tmp_);
  buf_.clear();
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  ZAYA_CHECK(!done_, "{}: add_sequence after finish/abort", prefix_);
  ZAYA_CHECK(tokens.size() <= size_t(std::numeric_limits<int32_t>::max()),
             "{}: sequence of {} tokens exceeds the int32 sequence_lengths field", prefix_,
             tokens.size());
  int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case TokenDType::UInt8: lo = 0, hi = 255; break;
    case TokenDType::Int8: lo = -128, hi = 127; break;
    case TokenDType::Int16: lo = -32768, hi = 32767; break;
    case TokenDType::UInt16: lo = 0, hi = 65535; break;
    default: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  }
  const size_t at = buf_.size();
  buf_.resize(at + tokens.size() * size_t(elem_));
  char* out = buf_.data() + at;
  for (size_t i = 0; i < tokens.size(); i++) {
    const int32_t t = tokens[i];
    if (t < lo || t > hi) {
      buf_.resize(at);
      fail("{}.bin: token id {} does not fit dtype {} (range {}..{})", prefix_, t,
           token_dtype_name(uint8_t(dtype_)), lo, hi);
    }
    switch (dtype_) {
      case TokenDType::UInt8:
      case TokenDType::Int8: out[i] = char(t); break;
      case TokenDType::Int16:
      case TokenDType::UInt16: {
        uint16_t v = uint16_t(t);
        std::memcpy(out + 2 * i, &v, 2);
        break;
      }
      case TokenDType::Int64: {
        int64_t v = t;
        std::memcpy(out + 8 * i, &v, 8);
        break;
      }
      default: std::memcpy(out + 4 * i, &t, 4);
    }
  }
  lengths_.push_back(int32_t(tokens.size()));
  num_tokens_ += int64_t(tokens.size());
  if (buf_.size() >= (1u << 22)) flush_buffer();
}

void IndexedDatasetWriter::end_document() {
  ZAYA_CHECK(!done_, "{}: end_document after finish/abort", prefix_);
  doc_idx_.push_back(int64_t(lengths_.size()));
}

void IndexedDatasetWriter::finish() {
  ZAYA_CHECK(!done_, "{}: finish called twice or after abort", prefix_);
  if (doc_idx_.back() != int64_t(lengths_.size())) end_document();
  flush_buffer();
  fsync_close(bin_fd_, bin_tmp_);
  bin_fd_ = -1;

  int fd = ::open(idx_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot create: {}", idx_tmp_, sys_err());
  uint8_t h[kIndexHeaderBytes];
  const uint64_t version = 1, seqs = lengths_.size(), docs = doc_idx_.size();
  std::memcpy(h, kIndexMagic, 9);
  std::memcpy(h + 9, &version, 8);
  h[17] = uint8_t(dtype_);
  std::memcpy(h + 18, &seqs, 8);
  std::memcpy(h + 26, &docs, 8);
  try {
    write_all(fd, h, sizeof(h), idx_tmp_);
    write_all(fd, lengths_.data(), lengths_.size() * 4, idx_tmp_);
    std::vector<int64_t> ptr(lengths_.size());
    int64_t p = 0;
    for (size_t i = 0; i < lengths_.size(); i++) {
      ptr[i] = p;
      p += int64_t(lengths_[i]) * elem_;
    }
    write_all(fd, ptr.data(), ptr.size() * 8, idx_tmp_);
    write_all(fd, doc_idx_.data(), doc_idx_.size() * 8, idx_tmp_);
    fsync_close(fd, idx_tmp_);
  } catch (...) {
    ::close(fd);
    throw;
  }
  const std::string bin = prefix_ + ".bin", idx = prefix_ + ".idx";
  if (::rename(bin_tmp_.c_str(), bin.c_str()) != 0)
    fail("{}: cannot rename to {}: {}", bin_tmp_, bin, sys_err());
  if (::rename(idx_tmp_.c_str(), idx.c_str()) != 0)
    fail("{}: cannot rename to {}: {}", idx_tmp_, idx, sys_err());
  fsync_parent(idx);
  done_ = true;
}

// ---------------------------------------------------------------------------------------------
// Reader

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_path_(prefix + ".idx"), bin_path_(prefix + ".bin") {
  try {
    idx_ = map_file(idx_path_, &idx_size_);
    bin_ = map_file(bin_path_, &bin_size_);
    const std::string& ip = idx_path_;
    ZAYA_CHECK(idx_size_ >= size_t(kIndexHeaderBytes),
               "{}: file is {} bytes, shorter than the {}-byte header (truncated?)", ip, idx_size_,
               kIndexHeaderBytes);
    ZAYA_CHECK(std::memcmp(idx_, kIndexMagic, 9) == 0,
               "{}: magic: expected \"MMIDIDX\\x00\\x00\" (a Megatron mmap index), found other "
               "bytes",
               ip);
    const uint64_t version = load<uint64_t>(idx_ + 9);
    ZAYA_CHECK(version == 1, "{}: version: expected 1, found {}", ip, version);
    const uint8_t code = idx_[17];
    elem_ = token_dtype_size(code);
    ZAYA_CHECK(elem_ > 0, "{}: dtype code: {} is not a Megatron DType code (expected 1..8)", ip,
               int(code));
    ZAYA_CHECK(code != 6 && code != 7,
               "{}: dtype code: {} ({}) is a float dtype; token datasets need an integer dtype", ip,
               int(code), token_dtype_name(code));
    dtype_ = TokenDType(code);
    const uint64_t seqs = load<uint64_t>(idx_ + 18), docs = load<uint64_t>(idx_ + 26);
    const uint64_t body = idx_size_ - kIndexHeaderBytes;
    // Bounds before products, so a garbage count cannot overflow the size arithmetic.
    ZAYA_CHECK(seqs <= body / 12,
               "{}: sequence_count: {} sequences need 12 bytes each, but only {} bytes follow the "
               "header",
               ip, seqs, body);
    ZAYA_CHECK(docs <= body / 8, "{}: document_count: {} is larger than the file can hold", ip,
               docs);
    const uint64_t want = kIndexHeaderBytes + seqs * 12 + docs * 8;
    if (idx_size_ == want + seqs && seqs > 0)
      fail(
          "{}: file has {} trailing bytes, one per sequence: a multimodal index "
          "(sequence_modes), which zaya does not read",
          ip, seqs);
    ZAYA_CHECK(idx_size_ == want,
               "{}: size: expected {} bytes for sequence_count {} and document_count {}, file has "
               "{} (truncated or corrupt)",
               ip, want, seqs, docs, idx_size_);
    ZAYA_CHECK(docs >= 1, "{}: document_count: expected at least 1 (a leading 0), found 0", ip);
    seq_count_ = int64_t(seqs);
    doc_count_ = int64_t(docs);

    ZAYA_CHECK(bin_size_ % size_t(elem_) == 0,
               "{}: size {} is not a multiple of the {}-byte dtype {}", bin_path_, bin_size_, elem_,
               token_dtype_name(code));
    int64_t expect_ptr = 0;
    for (int64_t i = 0; i < seq_count_; i++) {
      const int32_t len = sequence_length(i);
      const int64_t ptr = sequence_pointer(i);
      ZAYA_CHECK(len >= 0, "{}: sequence_lengths[{}] = {} is negative", ip, i, len);
      ZAYA_CHECK(ptr == expect_ptr,
                 "{}: sequence_pointers[{}] = {}, expected {} (sequences must be contiguous and "
                 "in order)",
                 ip, i, ptr, expect_ptr);
      expect_ptr = ptr + int64_t(len) * elem_;
      ZAYA_CHECK(uint64_t(expect_ptr) <= bin_size_,
                 "{}: sequence {} (sequence_pointers[{}] = {}, sequence_lengths[{}] = {}) ends at "
                 "byte {}, beyond the end of {} ({} bytes)",
                 ip, i, i, ptr, i, len, expect_ptr, bin_path_, bin_size_);
    }
    ZAYA_CHECK(uint64_t(expect_ptr) == bin_size_,
               "{}: size {} bytes, but {} describes {} bytes of sequences (mismatched pair?)",
               bin_path_, bin_size_, ip, expect_ptr);
    num_tokens_ = expect_ptr / elem_;
    ZAYA_CHECK(document_index(0) == 0, "{}: document_indices[0] = {}, expected 0", ip,
               document_index(0));
    for (int64_t d = 1; d < doc_count_; d++) {
      const int64_t a = document_index(d - 1), b = document_index(d);
      ZAYA_CHECK(b >= a && b <= seq_count_,
                 "{}: document_indices[{}] = {}: expected non-decreasing values in [{}, {}]", ip, d,
                 b, a, seq_count_);
    }
    ZAYA_CHECK(document_index(doc_count_ - 1) == seq_count_,
               "{}: document_indices[{}] = {}, expected sequence_count {} (the last document "
               "must end at the last sequence)",
               ip, doc_count_ - 1, document_index(doc_count_ - 1), seq_count_);
  } catch (...) {
    // The destructor does not run for a constructor that throws; unmap here.
    if (idx_) ::munmap(const_cast<uint8_t*>(idx_), idx_size_);
    if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_) ::munmap(const_cast<uint8_t*>(idx_), idx_size_);
  if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
  idx_ = bin_ = nullptr;
}

int32_t IndexedDataset::sequence_length(int64_t i) const {
  ZAYA_ASSERT(i >= 0 && i < seq_count_);
  return load<int32_t>(idx_ + kIndexHeaderBytes + 4 * i);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  ZAYA_ASSERT(i >= 0 && i < seq_count_);
  return load<int64_t>(idx_ + kIndexHeaderBytes + 4 * seq_count_ + 8 * i);
}

int64_t IndexedDataset::document_index(int64_t i) const {
  ZAYA_ASSERT(i >= 0 && i < doc_count_);
  return load<int64_t>(idx_ + kIndexHeaderBytes + 12 * seq_count_ + 8 * i);
}

int64_t IndexedDataset::document_begin(int64_t d) const {
  ZAYA_ASSERT(d >= 0 && d <= num_documents());
  const int64_t s = document_index(d);
  return s == seq_count_ ? num_tokens_ : sequence_begin(s);
}

int64_t IndexedDataset::token(int64_t pos) const {
  ZAYA_ASSERT(pos >= 0 && pos < num_tokens_);
  return load_token(bin_, dtype_, pos);
}

void IndexedDataset::read(int64_t pos, int64_t count, int32_t* out) const {
  ZAYA_ASSERT(pos >= 0 && count >= 0 && pos <= num_tokens_ - count);
  // An empty range may come with null pointers (an empty .bin maps to nullptr, an empty vector's
  // data() may be null), and memcpy from null is undefined behaviour even for zero bytes.
  if (count == 0) return;
  switch (dtype_) {
    case TokenDType::Int32: std::memcpy(out, bin_ + 4 * pos, size_t(count) * 4); return;
    case TokenDType::UInt16:
      for (int64_t i = 0; i < count; i++) out[i] = load<uint16_t>(bin_ + 2 * (pos + i));
      return;
    default:
      for (int64_t i = 0; i < count; i++) {
        const int64_t t = load_token(bin_, dtype_, pos + i);
        ZAYA_CHECK(
            t >= std::numeric_limits<int32_t>::min() && t <= std::numeric_limits<int32_t>::max(),
            "{}: token id {} at position {} does not fit int32", bin_path_, t, pos + i);
        out[i] = int32_t(t);
      }
  }
}

std::vector<int32_t> IndexedDataset::read(int64_t pos, int64_t count) const {
  std::vector<int32_t> v(static_cast<size_t>(count));
  read(pos, count, v.data());
  return v;
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  return read(sequence_begin(i), sequence_length(i));
}

std::vector<int32_t> IndexedDataset::document(int64_t d) const {
  return read(document_begin(d), document_length(d));
}

namespace {
struct Extreme {
  int64_t value, pos;
};
}  // namespace

int64_t IndexedDataset::max_token_id() const {
  std::mutex mu;
  int64_t best = -1;
  parallel_for(
      num_tokens_,
      [&](int64_t b, int64_t e) {
        int64_t m = std::numeric_limits<int64_t>::min();
        for (int64_t i = b; i < e; i++) m = std::max(m, load_token(bin_, dtype_, i));
        std::lock_guard<std::mutex> g(mu);
        best = std::max(best, m);
      },
      1 << 16);
  return best;
}

void IndexedDataset::check_vocab(int64_t vocab_size) const {
  // Each chunk reports its first bad position; the smallest wins, so the message does not depend
  // on the thread count.
  std::mutex mu;
  Extreme first{0, std::numeric_limits<int64_t>::max()};
  parallel_for(
      num_tokens_,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) {
          const int64_t t = load_token(bin_, dtype_, i);
          if (t < 0 || t >= vocab_size) {
            std::lock_guard<std::mutex> g(mu);
            if (i < first.pos) first = {t, i};
            return;
          }
        }
      },
      1 << 16);
  if (first.pos == std::numeric_limits<int64_t>::max()) return;
  if (first.value < 0)
    fail("{}: token id {} at position {} is negative (expected ids in [0, vocab_size {}))",
         bin_path_, first.value, first.pos, vocab_size);
  fail("{}: token id {} at position {} >= vocab_size {}", bin_path_, first.value, first.pos,
       vocab_size);
}

}  // namespace zaya
