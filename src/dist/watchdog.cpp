// The in-rank watchdog; see watchdog.h.
#include "dist/watchdog.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "dist/heartbeat.h"
#include "dist/launch.h"

namespace zaya::ft {

namespace {

std::mutex g_mutex;
std::map<int, std::function<void()>> g_callbacks;
int g_next_id = 0;
std::atomic<bool> g_running{false};

[[noreturn]] void fire(const Where& w, double timeout_s, int rank, const std::string& host) {
  const std::string op = w.op ? w.op : "collective";
  const std::string msg = fmt::format(
      "rank {} on {}: watchdog: {} of step {} made no progress for {:.1f} s (collective timeout "
      "{:g} s): aborting the job",
      rank, host, op, w.step, w.seconds, timeout_s);
  fmt::print(stderr, "zaya: {}\n", msg);
  std::fflush(stderr);
  send_event(
      "watchdog_abort",
      {{"collective", op}, {"seconds", w.seconds}, {"timeout_s", timeout_s}, {"message", msg}});
  finish_reporting("error", kExitWatchdog, 1.0);
  std::map<int, std::function<void()>> cbs;
  {
    std::lock_guard<std::mutex> lk(g_mutex);
    cbs.swap(g_callbacks);
  }
  for (auto& [id, fn] : cbs) {
    try {
      fn();
    } catch (...) {
    }
  }
  abort_all_ranks(kExitWatchdog);
}

}  // namespace

double collective_timeout_from_env() {
  const char* v = std::getenv(kEnvCollectiveTimeout);
  if (!v || !*v) return 0;
  char* end = nullptr;
  errno = 0;
  const double t = std::strtod(v, &end);
  if (!(end && *end == '\0' && errno == 0 && std::isfinite(t) && t >= 0))
    throw ConfigError(
        fmt::format("{}='{}': expected a number of seconds >= 0 (0 turns the watchdog off)",
                    kEnvCollectiveTimeout, v));
  return t;
}

void start_watchdog(double timeout_s, int rank, const std::string& host) {
  if (!(timeout_s > 0) || g_running.exchange(true)) return;
  const double tick = std::clamp(timeout_s / 10, 0.01, 0.25);
  std::thread([=] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::duration<double>(tick));
      const Where w = where_now();
      if (w.section == kCollective && !w.in_checkpoint && w.seconds >= timeout_s)
        fire(w, timeout_s, rank, host);
    }
  }).detach();
}

bool watchdog_running() {
  return g_running.load();
}

int on_watchdog_abort(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(g_mutex);
  g_callbacks.emplace(g_next_id, std::move(fn));
  return g_next_id++;
}

void remove_watchdog_abort(int id) {
  std::lock_guard<std::mutex> lk(g_mutex);
  g_callbacks.erase(id);
}

}  // namespace zaya::ft
