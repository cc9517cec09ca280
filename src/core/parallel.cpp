#include "core/parallel.h"

#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace zaya {

namespace {

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return int(workers_.size()) + 1; }

  void resize(int n) {
    stop();
    stopping_ = false;
    // New workers start at the current generation so they never re-run a finished job.
    for (int i = 1; i < n; i++) workers_.emplace_back([this, i, g = generation_] { loop(i, g); });
  }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
    int parts =
        int(std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk))));
    if (parts <= 1 || busy_) {  // nested calls run inline
      fn(0, n);
      return;
    }
    std::unique_lock<std::mutex> lk(m_);
    busy_ = true;
    fn_ = &fn;
    n_ = n;
    parts_ = parts;
    pending_ = parts - 1;
    error_ = nullptr;
    generation_++;
    lk.unlock();
    cv_.notify_all();
    try {
      fn(0, chunk_end(0));
    } catch (...) {
      std::lock_guard<std::mutex> g(m_);
      if (!error_) error_ = std::current_exception();
    }
    lk.lock();
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    busy_ = false;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  int64_t chunk_begin(int p) const { return n_ * p / parts_; }
  int64_t chunk_end(int p) const { return n_ * (p + 1) / parts_; }

  void loop(int id, uint64_t seen) {
    for (;;) {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (id >= parts_) continue;
      auto fn = fn_;
      int64_t b = chunk_begin(id), e = chunk_end(id);
      lk.unlock();
      try {
        (*fn)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> g(m_);
        if (!error_) error_ = std::current_exception();
      }
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> g(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false, busy_ = false;
  std::exception_ptr error_;
};

}  // namespace

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

namespace {

int default_threads() {
  if (const char* s = std::getenv("ZAYA_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return usable_cpus();
}

Pool& pool() {
  static Pool p(default_threads());
  return p;
}

}  // namespace

int num_threads() {
  return pool().size();
}
void set_num_threads(int n) {
  pool().resize(std::max(1, n));
}

void zero_bytes(void* p, size_t bytes) {
  constexpr size_t kParallelBytes = size_t(64) << 20, kMinPerThread = size_t(16) << 20;
  const size_t nt =
      std::min<size_t>({size_t(std::max(1, num_threads())), bytes / kMinPerThread, size_t(64)});
  if (bytes < kParallelBytes || nt <= 1) {
    std::memset(p, 0, bytes);
    return;
  }
  const size_t per = (bytes / nt + 4095) / 4096 * 4096;
  auto part = [p, bytes, per](size_t i) {
    const size_t b = std::min(bytes, i * per), e = std::min(bytes, b + per);
    if (e > b) std::memset(static_cast<char*>(p) + b, 0, e - b);
  };
  std::vector<std::thread> ts;
  for (size_t i = 1; i < nt; i++) ts.emplace_back(part, i);
  part(0);
  for (auto& t : ts) t.join();
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  pool().run(n, fn, min_chunk);
}

}  // namespace zaya
