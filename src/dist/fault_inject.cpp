// Fault injection; see fault_inject.h.
#include "dist/fault_inject.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace zaya::ft {

namespace {

using json = nlohmann::json;

constexpr const char* kGrammar = "KIND@rank=R,step=S[,section=SEC][,arg=V]";
constexpr int kKindCount = int(sizeof(kFaultKinds) / sizeof(kFaultKinds[0]));
static_assert(kKindCount == int(FaultKind::DiskFull) + 1, "FaultKind follows kFaultKinds");

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

template <typename T>
bool parse_int(const std::string& s, T* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

// The armed faults of this process and what has fired.
struct Armed {
  std::mutex m;
  std::vector<Fault> faults;
  std::vector<bool> fired;
  int64_t slow_step = -1;  // the last step a slow fault slept in
  std::atomic<bool> disk_full{false};
};

Armed& armed() {
  static Armed a;
  return a;
}

void announce(const Fault& f, const std::string& what) {
  json fields = {{"fault", fault_kind_name(f.kind)}, {"spec", f.text}, {"message", what}};
  if (f.section) fields["section"] = section_name(*f.section);
  send_event("fault_injected", fields);
  fmt::print(stderr, "zaya: rank {}: injected fault {}: {}\n", f.rank, f.text, what);
  std::fflush(stderr);
}

// The end of a process that "dies": the event gets a moment to reach the supervisor first.
void flush_for_death() {
  flush_reporting(1.0);
  std::fflush(stdout);
  std::fflush(stderr);
}

[[noreturn]] void hang_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void act(const Fault& f, int64_t step) {
  switch (f.kind) {
    case FaultKind::Kill:
      announce(f, fmt::format("SIGKILL at step {}", step));
      flush_for_death();
      ::kill(::getpid(), SIGKILL);
      hang_forever();
    case FaultKind::Exit:
      announce(f, fmt::format("exit {} at step {}", int(f.arg), step));
      flush_for_death();
      std::_Exit(int(f.arg));
    case FaultKind::Hang:
      announce(f, fmt::format("hanging in {} at step {}", section_name(where_now().section), step));
      flush_reporting(1.0);
      hang_forever();
    case FaultKind::Error:
      announce(f, fmt::format("raising an error at step {}", step));
      fail("injected failure ({}) at step {}", f.text, step);
    default: break;
  }
}

// The section hook: kill/exit/hang/error at their point, slow in every forward section of a step
// from its first, disk_full armed from its step on.
void on_section(SectionId entered, int64_t step, bool step_start) {
  Armed& a = armed();
  std::unique_lock<std::mutex> lk(a.m);
  for (size_t i = 0; i < a.faults.size(); i++) {
    const Fault& f = a.faults[i];
    switch (f.kind) {
      case FaultKind::Kill:
      case FaultKind::Exit:
      case FaultKind::Hang:
      case FaultKind::Error: {
        const bool here = f.section ? !step_start && *f.section == entered : step_start;
        if (a.fired[i] || f.step != step || !here) break;
        a.fired[i] = true;
        const Fault copy = f;
        lk.unlock();
        act(copy, step);  // kill/exit/hang do not return; error throws
        return;
      }
      case FaultKind::Slow:
        if (step_start || entered != kForward || step < f.step || a.slow_step == step) break;
        a.slow_step = step;
        if (!a.fired[i]) {
          a.fired[i] = true;
          announce(f, fmt::format("sleeping {:g} s per step from step {}", f.arg, step));
        }
        {
          const double s = f.arg;
          lk.unlock();
          std::this_thread::sleep_for(std::chrono::duration<double>(s));
          return;
        }
      case FaultKind::DiskFull:
        if (step_start && step >= f.step && !a.fired[i]) {
          a.fired[i] = true;
          a.disk_full.store(true);
          announce(f,
                   fmt::format("the next checkpoint write from step {} fails with ENOSPC", step));
        }
        break;
      default: break;
    }
  }
}

}  // namespace

const char* fault_kind_name(FaultKind k) {
  return int(k) >= 0 && int(k) < kKindCount ? kFaultKinds[int(k)] : "?";
}

std::vector<Fault> parse_faults(const std::string& spec, const std::string& where) {
  std::vector<Fault> out;
  size_t pos = 0, index = 0;
  while (pos <= spec.size()) {
    size_t semi = spec.find(';', pos);
    if (semi == std::string::npos) semi = spec.size();
    const std::string item = trim(spec.substr(pos, semi - pos));
    pos = semi + 1;
    if (item.empty()) continue;
    index++;
    const auto bad = [&](const std::string& why) {
      fail("{}: fault {} '{}': {} (expected {}; kinds: {})", where, index, item, why, kGrammar,
           fmt::join(std::begin(kFaultKinds), std::end(kFaultKinds), ", "));
    };
    Fault f;
    f.text = item;
    const size_t at = item.find('@');
    if (at == std::string::npos) bad("no '@' after the kind");
    const std::string kind = trim(item.substr(0, at));
    bool known = false;
    for (int k = 0; k < kKindCount; k++)
      if (kind == kFaultKinds[k]) {
        f.kind = FaultKind(k);
        known = true;
      }
    if (!known) bad(fmt::format("unknown kind '{}'", kind));
    bool has_rank = false, has_step = false, has_arg = false;
    std::string rest = item.substr(at + 1);
    size_t p = 0;
    while (p <= rest.size()) {
      size_t comma = rest.find(',', p);
      if (comma == std::string::npos) comma = rest.size();
      const std::string kv = trim(rest.substr(p, comma - p));
      p = comma + 1;
      if (kv.empty()) bad("an empty field");
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) bad(fmt::format("field '{}' has no '='", kv));
      const std::string k = trim(kv.substr(0, eq)), v = trim(kv.substr(eq + 1));
      if (k == "rank") {
        if (!parse_int(v, &f.rank) || f.rank < 0)
          bad(fmt::format("rank={} is not an integer >= 0", v));
        has_rank = true;
      } else if (k == "step") {
        if (!parse_int(v, &f.step) || f.step < 1)
          bad(fmt::format("step={} is not an integer >= 1", v));
        has_step = true;
      } else if (k == "section") {
        try {
          f.section = section_from_name(v, "section");
        } catch (const Error& e) {
          bad(e.what());
        }
      } else if (k == "arg") {
        char* end = nullptr;
        f.arg = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !std::isfinite(f.arg))
          bad(fmt::format("arg={} is not a number", v));
        has_arg = true;
      } else {
        bad(fmt::format("unknown field '{}'", k));
      }
    }
    if (!has_rank) bad("missing rank=");
    if (!has_step) bad("missing step=");
    const bool placed =
        f.kind == FaultKind::Kill || f.kind == FaultKind::Exit || f.kind == FaultKind::Hang;
    if (f.section && !placed) bad(fmt::format("{} takes no section", kind));
    if (f.kind == FaultKind::Exit) {
      if (!has_arg) f.arg = 1;
      if (f.arg != std::floor(f.arg) || f.arg < 0 || f.arg > 255)
        bad(fmt::format("exit needs arg = an exit code in [0, 255], got {:g}", f.arg));
    } else if (f.kind == FaultKind::Slow) {
      if (!has_arg || !(f.arg > 0)) bad("slow needs arg = seconds per step > 0");
    } else if (has_arg) {
      bad(fmt::format("{} takes no arg", kind));
    }
    out.push_back(f);
  }
  return out;
}

void install_faults(const std::vector<Fault>& faults, int rank) {
  Armed& a = armed();
  std::lock_guard<std::mutex> lk(a.m);
  a.faults.clear();
  for (const Fault& f : faults)
    if (f.rank == rank) a.faults.push_back(f);
  a.fired.assign(a.faults.size(), false);
  a.slow_step = -1;
  a.disk_full.store(false);
  set_section_hook(a.faults.empty() ? nullptr : on_section);
}

size_t install_faults(int rank) {
  static std::once_flag once;
  static size_t n = 0;
  std::call_once(once, [&] {
    try {
      std::vector<Fault> fs;
      if (const char* v = std::getenv(kEnvFaults); v && *v) fs = parse_faults(v);
      // The older test hook "RANK:STEP": an error at the start of that step.
      if (const char* v = std::getenv("ZAYA_TEST_FAIL_AT"); v && *v) {
        const std::string s = v;
        const size_t colon = s.find(':');
        ZAYA_CHECK(colon != std::string::npos, "ZAYA_TEST_FAIL_AT='{}': expected RANK:STEP", s);
        for (Fault& f : parse_faults(
                 fmt::format("error@rank={},step={}", s.substr(0, colon), s.substr(colon + 1)),
                 "ZAYA_TEST_FAIL_AT"))
          fs.push_back(f);
      }
      install_faults(fs, rank);
      n = size_t(
          std::count_if(fs.begin(), fs.end(), [&](const Fault& f) { return f.rank == rank; }));
    } catch (const Error& e) {
      throw ConfigError(e.what());  // the launch command is wrong, like a bad flag
    }
  });
  return n;
}

bool poison_gradients(int64_t step) {
  Armed& a = armed();
  std::lock_guard<std::mutex> lk(a.m);
  for (size_t i = 0; i < a.faults.size(); i++) {
    if (a.faults[i].kind != FaultKind::NaN || a.fired[i] || a.faults[i].step != step) continue;
    a.fired[i] = true;
    announce(a.faults[i], fmt::format("NaN gradients at step {}", step));
    return true;
  }
  return false;
}

void after_checkpoint_commit(int64_t step, const std::string& dir) {
  Armed& a = armed();
  std::unique_lock<std::mutex> lk(a.m);
  for (size_t i = 0; i < a.faults.size(); i++) {
    const Fault f = a.faults[i];
    if (f.kind != FaultKind::CorruptCkpt || a.fired[i] || step < f.step) continue;
    a.fired[i] = true;
    lk.unlock();
    // The data files (safetensors) of the checkpoint, sorted; this rank takes one by its rank.
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors")
        files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    ZAYA_CHECK(!files.empty(), "corrupt_ckpt: checkpoint {} has no .safetensors file", dir);
    const std::string victim = files[size_t(f.rank) % files.size()];
    const uint64_t size = std::filesystem::file_size(victim);
    announce(f, fmt::format("flipping 16 bytes in the middle of {} (checkpoint of step {}), then "
                            "exiting as if the node died",
                            victim, step));
    const int fd = ::open(victim.c_str(), O_RDWR | O_CLOEXEC);
    ZAYA_CHECK(fd >= 0, "corrupt_ckpt: cannot open {}", victim);
    unsigned char buf[16];
    const off_t off = off_t(size / 2);
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    for (ssize_t j = 0; j < n; j++) buf[j] ^= 0xFF;
    if (n > 0 && ::pwrite(fd, buf, size_t(n), off) == n) ::fsync(fd);
    ::close(fd);
    flush_for_death();
    std::_Exit(kExitError);
  }
}

bool take_disk_full() {
  Armed& a = armed();
  return a.disk_full.load(std::memory_order_relaxed) && a.disk_full.exchange(false);
}

}  // namespace zaya::ft
