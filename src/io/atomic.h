// Crash-safe file and directory commits, and file checksums, for checkpoints and exports.
//
// A file is written to `<path>.tmp.<pid>` in the same directory, fsync'd, renamed over `path`, and
// the directory is fsync'd, so after a crash a reader finds either the old file or the whole new
// one, never a prefix. A directory is built under `<parent>/.tmp-<name>-<tag>` and renamed into
// place the same way. Checksums are XXH64 (libxxhash), streamed so files of any size hash in
// constant memory.
//
// Deliberately not here: locking between concurrent writers of the same path (the last rename
// wins), and cleanup of staging leftovers from a crashed process (`.tmp-*` directories and
// `*.tmp.<pid>` files; readers never open them, and a pid alone cannot tell whether a writer on
// another node of a shared file system is still alive, so deleting them is left to the caller).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace zaya {

// Writes one file atomically. Every write is checked (a full disk is an Error naming the path);
// the destructor of an uncommitted writer removes the temporary file, so an exception anywhere
// between construction and commit() leaves `path` as it was.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path, unsigned mode = 0644);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync, close, rename over the destination, fsync the directory.
  void commit();
  // Removes the temporary file; `path` is untouched. Idempotent.
  void abort() noexcept;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool done_ = false;
};

// The whole of `contents` to `path`, atomically.
void write_file_atomic(const std::string& path, std::string_view contents);
// Whole file into a string; an Error names the path when it cannot be read.
std::string read_file(const std::string& path);
// Makes the directory entries of `dir` (creations, renames, deletions) durable.
void fsync_dir(const std::string& dir);
// fsyncs every regular file and directory under `dir`, `dir` included.
void fsync_tree(const std::string& dir);

// XXH64 (seed 0) of a file's contents, read in 4 MiB blocks.
uint64_t xxh64_file(const std::string& path);
uint64_t xxh64_bytes(const void* data, size_t n);
// 16 lowercase hex digits, the spelling used in manifests and messages ("0x" not included).
std::string hex64(uint64_t v);

// Whether a tool reading `input` may build its output directory at `out` (then committed with
// AtomicDirCommit, IfExists::Replace when `force`). Refuses, with an Error naming `out`: an
// existing path without force (user data is never replaced silently), an existing path that is not
// a directory, and any `out` that is `input`, lies inside it or contains it (replacing it would
// destroy the input).
void check_output_dir(const std::string& input, const std::string& out, bool force);

// Builds a directory somewhere readers never look, then moves it into place in one rename.
//   AtomicDirCommit c("/ckpt/step-000100");
//   write files under c.staging() ...
//   c.commit();
// The staging directory is `<parent>/.tmp-<name>-<tag>`; the tag defaults to the pid. Several
// processes that fill one directory (one file per rank) pass the same tag and let one of them
// commit. An uncommitted staging directory is removed by the destructor.
class AtomicDirCommit {
 public:
  enum class IfExists { Fail, Replace };
  explicit AtomicDirCommit(const std::string& final_dir, const std::string& tag = "");
  ~AtomicDirCommit();
  AtomicDirCommit(const AtomicDirCommit&) = delete;
  AtomicDirCommit& operator=(const AtomicDirCommit&) = delete;

  const std::string& staging() const { return staging_; }
  const std::string& final_dir() const { return final_; }
  // fsyncs the staged tree, renames it to final_dir, fsyncs the parent. With Replace, an existing
  // final_dir is swapped out in one renameat2(RENAME_EXCHANGE) (no instant without a directory at
  // that name) and then deleted; with Fail, an existing final_dir is an Error.
  void commit(IfExists if_exists = IfExists::Fail);
  // Deletes the staging directory; idempotent.
  void abort() noexcept;

 private:
  std::string final_, staging_;
  bool done_ = false;
};

}  // namespace zaya
