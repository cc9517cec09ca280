// AsyncWriter: the background half of an asynchronous checkpoint save on one rank. submit() takes
// the snapshot: it copies every source's bytes (host or GPU memory, through copy_step_bytes) into
// a staging ring that the writer owns and returns as soon as the last byte is in the ring, so the
// caller may change the sources (train on) right away. A thread drains the ring into the files
// (prefix bytes, then the sources in order), hashing each file (XXH64) as it writes (a large
// piece on a second thread beside its write), fsyncs every file and the directories holding
// them, and reports what it wrote. The ring is never refilled where the writer has not finished
// reading, so a checkpoint can never hold bytes of a later snapshot; when the ring is smaller
// than a save (the memory budget), submit() blocks until the writer has drained enough of it,
// and the save is only partly asynchronous.
// The ring may live in GPU memory (StagingMemory::read set): the snapshot is then a device-to-
// device copy, which is what keeps the loop's stall short for state on a GPU, and the writer
// reads the ring a piece at a time through a page-locked bounce buffer of its own.
//
// Deliberately not here: what the files mean (ckpt/sharded.h), committing a save or deciding when
// one is durable across ranks (ckpt/checkpoint.h), and O_DIRECT or several writer threads.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zaya {

// How the ring is allocated, filled and read: ordinary memory and memcpy by default; for state on
// a GPU the trainer passes page-locked host memory and a copy that reads GPU memory, or a ring in
// GPU memory (engine/train_step.h, checkpoint_staging).
struct StagingMemory {
  std::function<void*(size_t bytes)> alloc;  // empty: operator new (64-byte aligned)
  std::function<void(void* p)> free;
  // Into the ring, complete on return (the sources may change right after). Empty: memcpy.
  std::function<void(void* dst, const void* src, size_t bytes)> copy;
  // Set when the ring is not host memory (a GPU ring): the writer thread reads ring bytes into
  // host memory with it (complete on return), into a bounce buffer from bounce_alloc (empty:
  // operator new), freed with bounce_free.
  std::function<void(void* host_dst, const void* ring_src, size_t bytes)> read;
  std::function<void*(size_t bytes)> bounce_alloc;
  std::function<void(void* p)> bounce_free;
  std::string where = "host";  // for messages: "host", "pinned host", "GPU"
};

// Bytes to copy into a file, in memory that StagingMemory::copy can read.
struct StreamSource {
  const void* data = nullptr;
  size_t bytes = 0;
};

// One file of a save: `prefix` (a safetensors header, or a whole small file), then the sources.
struct StreamFile {
  std::string path;  // where to write it (its directory must exist)
  std::string rel;   // the name reported back (the path relative to the checkpoint)
  std::string prefix;
  std::vector<StreamSource> sources;
};

// A file as written: its reported name, size and XXH64 over exactly the bytes written.
struct WrittenFile {
  std::string rel;
  uint64_t size = 0, xxh64 = 0;
};

class AsyncWriter {
 public:
  // ring_cap_bytes: the most host memory the staging ring may take (0: as much as the largest
  // save, so every save is fully asynchronous).
  explicit AsyncWriter(size_t ring_cap_bytes, StagingMemory mem = {});
  // Waits for the save in flight (its result is dropped), then stops the thread.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Starts writing `files` and copies their sources into the ring; returns when every source byte
  // is in the ring. A previous save must be finished (wait() or done()); else an Error.
  void submit(std::vector<StreamFile> files);
  // Allocates (and touches) the ring for saves of `total` bytes now, so the first snapshot does
  // not pay for the allocation and page faults. Must not be called with a save in flight.
  void reserve(size_t total);
  // True when no save is in flight (the last one finished, well or not).
  bool done() const;
  // Waits for the last save. Returns its files, or throws zaya::Error with the first failure
  // (the file and the system's reason); its files may then be partial.
  std::vector<WrittenFile> wait();
  // The last finished save's failure ("" when none), without throwing.
  std::string error() const;

  // Figures of the last finished save: bytes written and the writer's wall time (first byte to
  // the last fsync).
  uint64_t last_bytes() const;
  double last_write_seconds() const;
  size_t ring_bytes() const { return cap_; }
  const std::string& ring_where() const { return mem_.where; }

 private:
  void run();
  // enospc: fail the first write with ENOSPC (an injected disk_full fault).
  void write_files(const std::vector<StreamFile>& files, bool enospc);
  void ensure_ring(size_t total);

  void release_ring();

  size_t cap_limit_ = 0, cap_ = 0;
  StagingMemory mem_;
  unsigned char* ring_ = nullptr;
  unsigned char* bounce_ = nullptr;  // the writer's, with mem_.read (one piece)
  uint64_t head_ = 0, tail_ = 0;     // bytes put into / taken out of the ring, ever

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::vector<StreamFile> job_;
  bool have_job_ = false, busy_ = false, stop_ = false, enospc_ = false;
  std::vector<WrittenFile> written_;
  std::string error_;
  uint64_t bytes_ = 0;
  double seconds_ = 0;
  std::thread thread_;
};

}  // namespace zaya
