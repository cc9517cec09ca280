// The section state and the supervisor reporter; see heartbeat.h.
#include "dist/heartbeat.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace zaya::ft {

namespace {

using json = nlohmann::json;

constexpr double kConnectTimeout = 1.0;  // seconds per connection attempt
constexpr double kSendTimeout = 2.0;     // a write that takes longer drops the connection
constexpr double kRetryInterval = 5.0;   // between connection attempts
constexpr size_t kMaxPending = 512;      // queued messages kept while disconnected

double mono_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Where the process is. Written by whichever thread enters a section (the training thread in
// practice), read by the reporter and the watchdog.
struct SectionState {
  std::atomic<int> section{kStartup};
  std::atomic<const char*> op{nullptr};
  std::atomic<double> entered{mono_now()};
  std::atomic<int> checkpoint_depth{0};  // checkpoint sections open (collectives nest in them)
  std::atomic<int64_t> step{0};
  std::atomic<double> step_s{NAN};
  std::atomic<SectionHook> hook{nullptr};
};

SectionState& state() {
  static SectionState s;
  return s;
}

class Reporter;
std::atomic<Reporter*> g_reporter{nullptr};

// "HOST:PORT" (HOST may be "[v6 address]") into its parts; throws zaya::Error otherwise.
std::pair<std::string, std::string> split_address(const std::string& a) {
  const size_t colon = a.rfind(':');
  std::string host = colon == std::string::npos ? "" : a.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : a.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  ZAYA_CHECK(
      !host.empty() && ec == std::errc() && end == port.data() + port.size() && p > 0 && p < 65536,
      "{}='{}': expected HOST:PORT (the supervisor's address, e.g. node01:29400)", kEnvAddress, a);
  return {host, port};
}

// One TCP connection to host:port, or -1 with the reason in `why`. Non-blocking connect bounded by
// kConnectTimeout; the socket is then blocking with a send timeout.
int connect_to(const std::string& host, const std::string& port, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    *why = fmt::format("cannot resolve {}: {}", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      *why = std::strerror(errno);
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      rc = ::poll(&pfd, 1, int(kConnectTimeout * 1000));
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      } else {
        *why = rc == 0 ? std::string("connection timed out") : std::strerror(err ? err : errno);
        rc = -1;
      }
    } else if (rc != 0) {
      *why = std::strerror(errno);
    }
    if (rc != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return -1;
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  timeval tv{};
  tv.tv_sec = time_t(kSendTimeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool send_all(int fd, const std::string& s, std::string* why) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *why = w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? "send timed out"
                                                                : std::strerror(errno);
      return false;
    }
    off += size_t(w);
  }
  return true;
}

// The background sender: one thread, one connection, a queue of serialized messages.
class Reporter {
 public:
  Reporter(std::string host, std::string port, RankIdentity id)
      : host_(std::move(host)), port_(std::move(port)), id_(std::move(id)) {
    thread_ = std::thread([this] { run(); });
  }

  const RankIdentity& id() const { return id_; }

  void enqueue(std::string line) {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (stopped_) return;
      if (queue_.size() >= kMaxPending) queue_.pop_front();
      queue_.push_back(std::move(line));
      queued_++;
    }
    cv_.notify_all();
  }

  void section_changed() {
    if (changed_.exchange(true)) return;  // the thread already knows
    std::lock_guard<std::mutex> lk(m_);
    cv_.notify_all();
  }

  bool flush(double timeout_s) {
    std::unique_lock<std::mutex> lk(m_);
    const uint64_t target = queued_;
    return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] {
      return done_ >= target || exited_;
    }) && done_ >= target;
  }

  // Stops after the queue is written (or `timeout_s` passes: the thread is then left to finish).
  void stop(double timeout_s) {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    flush(timeout_s);
    std::unique_lock<std::mutex> lk(m_);
    const bool exited =
        cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return exited_; });
    stopped_ = true;
    lk.unlock();
    if (exited)
      thread_.join();
    else
      thread_.detach();
  }

 private:
  std::string beat_line() const {
    const Where w = where_now();
    const double s = state().step_s.load(std::memory_order_relaxed);
    // A collective inside a checkpoint (its commit waits for the slowest rank's writes) is
    // reported as the checkpoint, which the supervisor gives its longer timeout.
    json f = {{"step", w.step},
              {"section", section_name(w.in_checkpoint ? kCheckpoint : w.section)},
              {"step_s", std::isfinite(s) ? json(s) : json(nullptr)},
              {"section_s", w.seconds}};
    if (w.op) f["op"] = w.op;
    return make_message("beat", id_, f).dump() + "\n";
  }

  void warn(const std::string& what) {
    if (warned_) return;
    warned_ = true;
    ZAYA_WARN("rank {}: the supervisor at {}:{} {}; training carries on (retrying every {:.0f} s)",
              id_.rank, host_, port_, what, kRetryInterval);
  }

  void disconnect() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void run() {
    double next_connect = 0, last_beat = -1e30;
    const std::string hello =
        make_message("hello", id_, {{"step", id_.start_step}, {"kind", id_.kind}}).dump() + "\n";
    std::deque<std::string> pending;  // events and bye taken from the queue, not yet written
    for (;;) {
      bool stopping = false;
      {
        std::unique_lock<std::mutex> lk(m_);
        for (;;) {
          const double now = mono_now();
          if (stopping_ || !queue_.empty()) break;
          double due = last_beat + (changed_ ? kBeatMinInterval : kBeatInterval);
          if (fd_ < 0) due = std::max(due, next_connect);
          if (now >= due) break;
          cv_.wait_for(lk, std::chrono::duration<double>(due - now));
        }
        while (!queue_.empty()) {
          pending.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        stopping = stopping_;
      }
      double now = mono_now();
      if (fd_ < 0 && (now >= next_connect || stopping)) {
        std::string why;
        fd_ = connect_to(host_, port_, &why);
        if (fd_ < 0) {
          warn(fmt::format("cannot be reached ({})", why));
          next_connect = mono_now() + kRetryInterval;
        } else if (!send_all(fd_, hello, &why)) {
          warn(fmt::format("closed the connection ({})", why));
          disconnect();
          next_connect = mono_now() + kRetryInterval;
        } else if (warned_) {
          ZAYA_INFO("rank {}: reconnected to the supervisor at {}:{}", id_.rank, host_, port_);
          warned_ = false;
        }
      }
      // The beat first, so that nothing follows a bye; none once stopping.
      now = mono_now();
      if (fd_ >= 0 && !stopping &&
          (now - last_beat >= kBeatInterval || (changed_ && now - last_beat >= kBeatMinInterval))) {
        changed_ = false;
        last_beat = now;
        std::string why;
        if (!send_all(fd_, beat_line(), &why)) {
          warn(fmt::format("closed the connection ({})", why));
          disconnect();
          next_connect = mono_now() + kRetryInterval;
        }
      }
      while (fd_ >= 0 && !pending.empty()) {
        std::string why;
        if (!send_all(fd_, pending.front(), &why)) {
          warn(fmt::format("closed the connection ({})", why));
          disconnect();
          next_connect = mono_now() + kRetryInterval;
          break;
        }
        pending.pop_front();
      }
      // Beats are made afresh; only events and bye wait for a connection, and only so many (all
      // are dropped when stopping without one).
      while (pending.size() > kMaxPending || (stopping && fd_ < 0 && !pending.empty()))
        pending.pop_front();
      {
        std::lock_guard<std::mutex> lk(m_);
        done_ = queued_ - queue_.size() - pending.size();
        if (stopping && queue_.empty() && pending.empty()) {
          exited_ = true;
          disconnect();
        }
      }
      cv_.notify_all();
      if (exited_) return;
    }
  }

  std::string host_, port_;
  RankIdentity id_;
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  uint64_t queued_ = 0, done_ = 0;
  bool stopping_ = false, stopped_ = false, exited_ = false;
  std::atomic<bool> changed_{false};
  int fd_ = -1;          // the reporter thread's only
  bool warned_ = false;  // likewise
};

std::mutex g_start_mutex;
bool g_started = false, g_finished = false;

}  // namespace

const char* section_name(SectionId s) {
  return s >= 0 && s < kSectionCount ? kSections[s] : "?";
}

SectionId section_from_name(const std::string& name, const std::string& what) {
  for (int i = 0; i < kSectionCount; i++)
    if (name == kSections[i]) return SectionId(i);
  std::string known;
  for (int i = 0; i < kSectionCount; i++) known += (i ? ", " : "") + std::string(kSections[i]);
  fail("{}: unknown section '{}' (expected one of {})", what, name, known);
}

SectionGuard::SectionGuard(SectionId s, const char* op) {
  SectionState& st = state();
  if (s == kCheckpoint) st.checkpoint_depth.fetch_add(1, std::memory_order_relaxed);
  prev_ = SectionId(st.section.exchange(s, std::memory_order_relaxed));
  prev_op_ = st.op.exchange(op, std::memory_order_relaxed);
  st.entered.store(mono_now(), std::memory_order_release);
  if (prev_ != s)
    if (Reporter* r = g_reporter.load(std::memory_order_acquire)) r->section_changed();
  // After the switch, so that a fault that hangs here hangs inside the section.
  if (SectionHook h = st.hook.load(std::memory_order_acquire))
    h(s, st.step.load(std::memory_order_relaxed), false);
}

SectionGuard::~SectionGuard() {
  SectionState& st = state();
  const int was = st.section.exchange(prev_, std::memory_order_relaxed);
  if (was == kCheckpoint) st.checkpoint_depth.fetch_sub(1, std::memory_order_relaxed);
  st.op.store(prev_op_, std::memory_order_relaxed);
  st.entered.store(mono_now(), std::memory_order_release);
  if (was != prev_)
    if (Reporter* r = g_reporter.load(std::memory_order_acquire)) r->section_changed();
}

Where where_now() {
  const SectionState& st = state();
  Where w;
  const double entered = st.entered.load(std::memory_order_acquire);
  w.section = SectionId(st.section.load(std::memory_order_relaxed));
  w.op = st.op.load(std::memory_order_relaxed);
  w.step = st.step.load(std::memory_order_relaxed);
  w.in_checkpoint = st.checkpoint_depth.load(std::memory_order_relaxed) > 0;
  w.seconds = std::max(0.0, mono_now() - entered);
  return w;
}

void set_step(int64_t step) {
  SectionState& st = state();
  st.step.store(step, std::memory_order_relaxed);
  if (SectionHook h = st.hook.load(std::memory_order_acquire))
    h(SectionId(st.section.load(std::memory_order_relaxed)), step, true);
}

int64_t current_step() {
  return state().step.load(std::memory_order_relaxed);
}

void step_finished(double seconds) {
  state().step_s.store(seconds, std::memory_order_relaxed);
}

void set_section_hook(SectionHook hook) {
  state().hook.store(hook, std::memory_order_release);
}

bool supervised() {
  const char* v = std::getenv(kEnvAddress);
  return v && *v;
}

int attempt() {
  const char* v = std::getenv(kEnvAttempt);
  if (!v || !*v) return 0;
  int a = 0;
  const char* end = v + std::strlen(v);
  auto [p, ec] = std::from_chars(v, end, a);
  ZAYA_CHECK(ec == std::errc() && p == end && a >= 0, "{}='{}': expected an integer >= 0",
             kEnvAttempt, v);
  return a;
}

json make_message(const std::string& type, const RankIdentity& id, const json& fields) {
  json m = {{"type", type},
            {"rank", id.rank},
            {"world", id.world},
            {"host", id.host},
            {"pid", int64_t(::getpid())},
            {"attempt", attempt()},
            {"t", unix_now()}};
  for (auto it = fields.begin(); it != fields.end(); ++it) m[it.key()] = it.value();
  return m;
}

void start_reporting(const RankIdentity& id) {
  std::lock_guard<std::mutex> lk(g_start_mutex);
  if (g_started || !supervised()) return;
  auto [host, port] = split_address(std::getenv(kEnvAddress));
  attempt();  // a malformed attempt number is an error now, not in the background thread
  g_started = true;
  g_reporter.store(new Reporter(host, port, id), std::memory_order_release);  // lives to the end
}

void send_event(const std::string& event, const json& fields) {
  Reporter* r = g_reporter.load(std::memory_order_acquire);
  if (!r) return;
  json f = {{"event", event}, {"step", current_step()}};
  for (auto it = fields.begin(); it != fields.end(); ++it) f[it.key()] = it.value();
  r->enqueue(make_message("event", r->id(), f).dump() + "\n");
}

bool flush_reporting(double timeout_s) {
  Reporter* r = g_reporter.load(std::memory_order_acquire);
  return !r || r->flush(timeout_s);
}

void finish_reporting(const std::string& status, int code, double timeout_s) {
  Reporter* r = nullptr;
  {
    std::lock_guard<std::mutex> lk(g_start_mutex);
    if (g_finished) return;
    g_finished = true;
    r = g_reporter.load(std::memory_order_acquire);
  }
  if (!r) return;
  r->enqueue(
      make_message("bye", r->id(), {{"status", status}, {"step", current_step()}, {"code", code}})
          .dump() +
      "\n");
  r->stop(timeout_s);
  g_reporter.store(nullptr, std::memory_order_release);
}

}  // namespace zaya::ft
