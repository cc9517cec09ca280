// The background checkpoint writer. See async_writer.h.
#include "ckpt/async_writer.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <new>
#include <set>
#include <system_error>

#include "core/error.h"
#include "dist/fault_inject.h"

namespace zaya {

namespace {

// The ring is filled and drained in pieces of at most this much, so the writer starts on the
// first piece while the snapshot copies the next.
constexpr size_t kPiece = size_t(16) << 20;
// Pieces at least this large are hashed on a second thread while they are written.
constexpr size_t kParallelHash = size_t(1) << 20;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// write(2) of all n bytes; "" or the reason it failed. With `enospc` (an injected disk_full
// fault, dist/fault_inject.h) it fails the way a full file system does: part written, then ENOSPC.
std::string write_all(int fd, const void* p, size_t n, bool enospc = false) {
  const char* c = static_cast<const char*>(p);
  if (enospc) {
    if (n / 2 > 0 && ::write(fd, c, n / 2) < 0) return std::strerror(errno);
    return std::strerror(ENOSPC);
  }
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return std::strerror(errno);
    c += w;
    n -= size_t(w);
  }
  return "";
}

}  // namespace

AsyncWriter::AsyncWriter(size_t ring_cap_bytes, StagingMemory mem)
    : cap_limit_(ring_cap_bytes), mem_(mem) {
  thread_ = std::thread([this] { run(); });
}

AsyncWriter::~AsyncWriter() {
  {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return !have_job_ && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  release_ring();
  if (bounce_) {
    if (mem_.bounce_free)
      mem_.bounce_free(bounce_);
    else
      ::operator delete(bounce_, std::align_val_t(64));
  }
}

void AsyncWriter::release_ring() {
  if (!ring_) return;
  if (mem_.free)
    mem_.free(ring_);
  else
    ::operator delete(ring_, std::align_val_t(64));
  ring_ = nullptr;
  cap_ = 0;
}

void AsyncWriter::ensure_ring(size_t total) {
  size_t want = cap_limit_ ? std::min(cap_limit_, total) : total;
  want = std::max<size_t>(want, 4096);
  if (ring_ && cap_ >= want) return;
  release_ring();
  void* p = mem_.alloc ? mem_.alloc(want) : ::operator new(want, std::align_val_t(64));
  ZAYA_CHECK(p != nullptr, "checkpoint: cannot allocate {} bytes of staging memory", want);
  ring_ = static_cast<unsigned char*>(p);
  cap_ = want;
}

void AsyncWriter::reserve(size_t total) {
  std::lock_guard<std::mutex> lk(m_);
  ZAYA_CHECK(!have_job_ && !busy_, "checkpoint: the staging ring was resized during a save");
  const bool fresh =
      !ring_ || cap_ < std::max<size_t>(cap_limit_ ? std::min(cap_limit_, total) : total, 4096);
  ensure_ring(total);
  if (fresh && !mem_.read) std::memset(ring_, 0, cap_);  // host pages faulted in now
}

void AsyncWriter::submit(std::vector<StreamFile> files) {
  size_t total = 0;
  for (const StreamFile& f : files)
    for (const StreamSource& s : f.sources) total += s.bytes;
  {
    std::lock_guard<std::mutex> lk(m_);
    ZAYA_CHECK(!have_job_ && !busy_, "checkpoint: a save was submitted while one is in flight");
    // Nobody reads the ring now: it may be replaced.
    ensure_ring(total);
    head_ = tail_ = 0;
    job_ = files;
    have_job_ = true;
    busy_ = true;
    error_.clear();
    written_.clear();
    // An injected disk_full fault belongs to the first save submitted from its step on.
    enospc_ = ft::take_disk_full();
  }
  cv_.notify_all();
  // The snapshot: copy every source into the ring, waiting for room when it is full.
  const std::function<void(void*, const void*, size_t)> copy =
      mem_.copy ? mem_.copy : [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); };
  for (const StreamFile& f : files)
    for (const StreamSource& s : f.sources) {
      const auto* src = static_cast<const unsigned char*>(s.data);
      size_t done = 0;
      while (done < s.bytes) {
        size_t pos, n;
        {
          std::unique_lock<std::mutex> lk(m_);
          cv_.wait(lk, [&] { return head_ - tail_ < cap_; });
          pos = size_t(head_ % cap_);
          n = std::min({s.bytes - done, size_t(cap_ - (head_ - tail_)), cap_ - pos, kPiece});
        }
        // [head, head + n) is free: the writer reads only [tail, head).
        copy(ring_ + pos, src + done, n);
        done += n;
        {
          std::lock_guard<std::mutex> lk(m_);
          head_ += n;
        }
        cv_.notify_all();
      }
    }
}

bool AsyncWriter::done() const {
  std::lock_guard<std::mutex> lk(m_);
  return !have_job_ && !busy_;
}

std::vector<WrittenFile> AsyncWriter::wait() {
  std::unique_lock<std::mutex> lk(m_);
  cv_.wait(lk, [&] { return !have_job_ && !busy_; });
  if (!error_.empty()) fail("{}", error_);
  return written_;
}

std::string AsyncWriter::error() const {
  std::lock_guard<std::mutex> lk(m_);
  return error_;
}

uint64_t AsyncWriter::last_bytes() const {
  std::lock_guard<std::mutex> lk(m_);
  return bytes_;
}

double AsyncWriter::last_write_seconds() const {
  std::lock_guard<std::mutex> lk(m_);
  return seconds_;
}

void AsyncWriter::run() {
  for (;;) {
    std::vector<StreamFile> files;
    bool enospc = false;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return have_job_ || stop_; });
      if (stop_ && !have_job_) return;
      files = std::move(job_);
      job_.clear();
      enospc = enospc_;
      enospc_ = false;
    }
    write_files(files, enospc);
    {
      std::lock_guard<std::mutex> lk(m_);
      have_job_ = false;
      busy_ = false;
    }
    cv_.notify_all();
  }
}

void AsyncWriter::write_files(const std::vector<StreamFile>& files, bool enospc) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;  // the first failure; the ring is drained regardless, so submit() never hangs
  std::vector<WrittenFile> out;
  std::set<std::string> dirs;
  uint64_t bytes = 0;
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> st(XXH64_createState(),
                                                                       XXH64_freeState);
  if (mem_.read && !bounce_) {
    try {
      void* p = mem_.bounce_alloc ? mem_.bounce_alloc(kPiece)
                                  : ::operator new(kPiece, std::align_val_t(64));
      bounce_ = static_cast<unsigned char*>(p);
    } catch (const std::exception& e) {
      err = fmt::format("cannot allocate the checkpoint writer's bounce buffer: {}", e.what());
    }
  }
  for (const StreamFile& f : files) {
    int fd = -1;
    if (err.empty()) {
      fd = ::open(f.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) err = fmt::format("cannot create {}: {}", f.path, std::strerror(errno));
    }
    XXH64_reset(st.get(), 0);
    uint64_t size = 0;
    const auto put = [&](const void* p, size_t n) {
      if (fd < 0) return;
      // The checksum of a large piece is computed beside its write (both only read it), so the
      // writer runs at the disk's pace rather than the disk's plus the hash's.
      std::future<void> hashing;
      if (n >= kParallelHash) {
        try {
          hashing = std::async(std::launch::async, [&st, p, n] { XXH64_update(st.get(), p, n); });
        } catch (const std::system_error&) {
          // No thread to be had: hash after the write instead.
        }
      }
      std::string e = write_all(fd, p, n, enospc);
      if (hashing.valid())
        hashing.get();
      else
        XXH64_update(st.get(), p, n);
      if (!e.empty()) {
        err = fmt::format("writing {} failed: {}", f.path, e);
        ::close(fd);
        fd = -1;
        return;
      }
      size += n;
    };
    put(f.prefix.data(), f.prefix.size());
    size_t remaining = 0;
    for (const StreamSource& s : f.sources) remaining += s.bytes;
    while (remaining > 0) {
      size_t pos, n;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return head_ > tail_; });
        pos = size_t(tail_ % cap_);
        n = std::min({remaining, size_t(head_ - tail_), cap_ - pos, kPiece});
      }
      if (mem_.read) {
        // A GPU ring: through the bounce buffer (skipped once a write failed; still drained).
        if (fd >= 0) {
          try {
            mem_.read(bounce_, ring_ + pos, n);
            put(bounce_, n);
          } catch (const std::exception& e) {
            err = fmt::format("reading the staging ring for {} failed: {}", f.path, e.what());
            ::close(fd);
            fd = -1;
          }
        }
      } else {
        put(ring_ + pos, n);
      }
      remaining -= n;
      {
        std::lock_guard<std::mutex> lk(m_);
        tail_ += n;
      }
      cv_.notify_all();
    }
    if (fd >= 0) {
      if (::fsync(fd) != 0)
        err = fmt::format("fsync of {} failed: {}", f.path, std::strerror(errno));
      if (::close(fd) != 0 && err.empty())
        err = fmt::format("closing {} failed: {}", f.path, std::strerror(errno));
      if (err.empty()) {
        out.push_back({f.rel, size, XXH64_digest(st.get())});
        bytes += size;
        dirs.insert(std::filesystem::path(f.path).parent_path().string());
      }
    }
  }
  // The files' directory entries are durable too.
  for (const std::string& d : dirs) {
    if (!err.empty()) break;
    int dfd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || ::fsync(dfd) != 0)
      err = fmt::format("fsync of the directory {} failed: {}", d, std::strerror(errno));
    if (dfd >= 0) ::close(dfd);
  }
  std::lock_guard<std::mutex> lk(m_);
  error_ = err;
  written_ = err.empty() ? std::move(out) : std::vector<WrittenFile>{};
  bytes_ = bytes;
  seconds_ = seconds_since(t0);
}

}  // namespace zaya
