// The node health checks; see health.h.
#include "bench/health.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/gemm.h"
#include "bench/bench_common.h"
#include "bench/comm_bench.h"
#include "bench/gemm_bench.h"
#include "bench/mem_bench.h"
#include "core/error.h"
#include "core/json.h"
#include "dist/launch.h"

namespace zaya::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kCpuGemmDim = 256;                // square CPU GEMM of the probe
constexpr size_t kCpuCopyBytes = size_t(64) << 20;  // per buffer, past the caches
constexpr int64_t kGpuGemmDim = 4096;
constexpr uint64_t kGpuCopyBytes = uint64_t(256) << 20;
constexpr uint64_t kAllReduceBytes = uint64_t(1) << 20;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs fn repeatedly for at least `seconds` (once at least); returns runs / elapsed seconds.
template <typename Fn>
double rate(double seconds, Fn&& fn) {
  fn();  // warm-up: first touch, thread start-up
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n = 0;
  double el = 0;
  do {
    fn();
    n++;
    el = seconds_since(t0);
  } while (el < seconds);
  return double(n) / el;
}

// The thresholds a profile gives (0 where it has none): GFLOP/s and GB/s.
struct ProfileFigures {
  double gemm_gflops = 0, mem_gbs = 0;
};
ProfileFigures read_profile(const std::string& path, double fraction) {
  ProfileFigures p;
  if (path.empty()) return p;
  std::ifstream in(path);
  ZAYA_CHECK(in.good(), "--profile: cannot read '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = parse_json(ss.str(), "--profile: '" + path + "'", nullptr, "is not JSON");
  ZAYA_CHECK(j.is_object() && j.value("schema", "") == "zaya.hardware/1",
             "--profile: '{}' is not a zaya.hardware/1 profile (zaya bench ... --profile)", path);
  if (j.contains("measured_peak_tflops") && j["measured_peak_tflops"].is_object() &&
      j["measured_peak_tflops"].value("bf16", json()).is_number())
    p.gemm_gflops = fraction * j["measured_peak_tflops"]["bf16"].get<double>() * 1e3;
  if (j.value("copy_bandwidth_gbs", json()).is_number())
    p.mem_gbs = fraction * j["copy_bandwidth_gbs"].get<double>();
  return p;
}

double pick(double flag, double from_profile, double fallback) {
  if (flag >= 0) return flag;
  return from_profile > 0 ? from_profile : fallback;
}

HealthCheck check_at_least(const std::string& name, double measured, double threshold,
                           const std::string& unit, const std::string& detail) {
  HealthCheck c;
  c.name = name;
  c.measured = measured;
  c.threshold = threshold;
  c.unit = unit;
  c.detail = detail;
  c.pass = measured >= threshold;
  return c;
}

// A check that could not measure (the probe failed, or its result was wrong).
HealthCheck failed(const std::string& name, const std::string& unit, double threshold,
                   const std::string& why) {
  HealthCheck c = check_at_least(name, 0, threshold, unit, why);
  c.pass = false;
  return c;
}

HealthCheck gemm_check(const HealthOptions& o, double threshold) {
  try {
    if (o.device == "cuda") {
      GemmBenchOptions g;
      g.shapes = {parse_gemm_shape(fmt::format("health={0}x{0}x{0}", kGpuGemmDim), "health")};
      g.autotune = 4;
      g.search_per_algo = 0;
      g.check = false;
      g.grouped_methods = false;
      g.timing.min_iters = 5;
      g.timing.max_iters = 50;
      g.timing.warm_ms = 5;
      g.timing.min_time_ms = 1000 * o.probe_seconds;
      g.device = o.device_index;
      double best = 0;
      for (const GemmResult& r : run_gemm_bench(g)) best = std::max(best, r.tflops);
      return check_at_least("gemm", best * 1e3, threshold, "GFLOP/s",
                            fmt::format("cuBLASLt bf16 {0}x{0}x{0}", kGpuGemmDim));
    }
    const int64_t n = kCpuGemmDim;
    std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
    const double per_s = rate(o.probe_seconds, [&] {
      cpu::gemm(c.data(), n, cpu::rows_of(a.data(), n), cpu::rows_of(b.data(), n), n, n, n);
    });
    // Every element is n · 0.125: a wrong result is a broken node too.
    const float want = float(n) * 0.125f;
    for (float v : c)
      if (v != want)
        return failed("gemm", "GFLOP/s", threshold,
                      fmt::format("CPU gemm {0}x{0}x{0} gave {1}, expected {2}", n, v, want));
    return check_at_least("gemm", per_s * 2.0 * double(n * n * n) / 1e9, threshold, "GFLOP/s",
                          fmt::format("CPU reference gemm fp32 {0}x{0}x{0}", n));
  } catch (const std::exception& e) {
    return failed("gemm", "GFLOP/s", threshold, e.what());
  }
}

HealthCheck memory_check(const HealthOptions& o, double threshold) {
  try {
    if (o.device == "cuda") {
      MemBenchOptions m;
      m.tests = {"copy"};
      m.sizes = {kGpuCopyBytes};
      m.iters = 10;
      m.warmup = 2;
      m.device = o.device_index;
      double best = 0;
      int64_t wrong = 0;
      for (const MemResult& r : run_mem_bench(m, 0)) {
        best = std::max(best, r.gbs);
        wrong += std::max<int64_t>(0, r.wrong);
      }
      if (wrong > 0)
        return failed("memory", "GB/s", threshold,
                      fmt::format("the device copy got {} elements wrong", wrong));
      return check_at_least("memory", best, threshold, "GB/s",
                            fmt::format("device copy of {}", format_size(kGpuCopyBytes)));
    }
    std::vector<char> src(kCpuCopyBytes, 1), dst(kCpuCopyBytes, 0);
    const double per_s =
        rate(o.probe_seconds, [&] { std::memcpy(dst.data(), src.data(), kCpuCopyBytes); });
    if (std::memcmp(dst.data(), src.data(), kCpuCopyBytes) != 0)
      return failed("memory", "GB/s", threshold, "the host copy's destination differs");
    return check_at_least("memory", per_s * double(mem_bytes_moved("copy", kCpuCopyBytes)) / 1e9,
                          threshold, "GB/s",
                          fmt::format("host memcpy of {}", format_size(kCpuCopyBytes)));
  } catch (const std::exception& e) {
    return failed("memory", "GB/s", threshold, e.what());
  }
}

// Collective: every rank calls it.
HealthCheck all_reduce_check(Communicator* world, double max_ms) {
  HealthCheck c;
  c.name = "all_reduce";
  c.unit = "ms";
  c.at_least = false;
  c.threshold = max_ms;
  if (!world || world->size() < 2) {
    c.pass = true;
    c.detail = "one process: nothing to reduce";
    return c;
  }
  CommBenchOptions cb;
  cb.ops = {CommOp::AllReduce};
  cb.sizes = {kAllReduceBytes};
  cb.dtypes = {DType::F32};
  cb.iters = 5;
  cb.warmup = 2;
  const auto rows = run_comm_bench(*world, cb, false);
  // Rank 0 holds the row (its time is the slowest rank's); every rank gets it.
  double v[2] = {0, 0};
  if (!rows.empty()) {
    v[0] = rows.front().time_us / 1e3;
    v[1] = double(std::max<int64_t>(0, rows.front().wrong));
  }
  world->host_all_reduce(v, 2, RedOp::Sum);
  c.measured = v[0];
  c.pass = v[1] == 0 && v[0] <= max_ms;
  c.detail = fmt::format("{} over {} ranks ({}){}", format_size(kAllReduceBytes), world->size(),
                         world->backend(),
                         v[1] > 0 ? fmt::format(", {} wrong elements", int64_t(v[1])) : "");
  return c;
}

void dir_checks(const HealthOptions& o, int rank, std::vector<HealthCheck>& out) {
  HealthCheck w;
  w.name = "checkpoint_dir";
  w.detail = o.dir;
  try {
    fs::create_directories(o.dir);
    const std::string probe =
        fmt::format("{}/.zaya-health-{}-{}-{}", o.dir, local_host_name(), rank, ::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ZAYA_CHECK(fd >= 0, "cannot create {}: {}", probe, std::strerror(errno));
    const std::string bytes(4096, 'z');
    const bool ok =
        ::write(fd, bytes.data(), bytes.size()) == ssize_t(bytes.size()) && ::fsync(fd) == 0;
    const int err = errno;
    ::close(fd);
    fs::remove(probe);
    ZAYA_CHECK(ok, "cannot write {}: {}", probe, std::strerror(err));
    w.pass = true;
    w.measured = 1;
    w.threshold = 1;
  } catch (const std::exception& e) {
    w.detail = e.what();
  }
  out.push_back(w);
  struct statvfs sv {};
  if (::statvfs(o.dir.c_str(), &sv) == 0) {
    const double gib = double(sv.f_bavail) * double(sv.f_frsize) / double(1ull << 30);
    out.push_back(check_at_least("free_space", gib, o.min_free_gb, "GiB", o.dir));
  } else {
    out.push_back(failed("free_space", "GiB", o.min_free_gb,
                         fmt::format("statvfs {}: {}", o.dir, std::strerror(errno))));
  }
}

}  // namespace

bool HealthReport::ok() const {
  return std::all_of(checks.begin(), checks.end(), [](const HealthCheck& c) { return c.pass; });
}

json HealthReport::to_json() const {
  json cs = json::array();
  for (const HealthCheck& c : checks)
    cs.push_back({{"name", c.name},
                  {"pass", c.pass},
                  {"measured", c.measured},
                  {"threshold", c.threshold},
                  {"unit", c.unit},
                  {"at_least", c.at_least},
                  {"detail", c.detail}});
  return {{"rank", rank}, {"world", world}, {"host", host}, {"ok", ok()}, {"checks", cs}};
}

HealthReport HealthReport::from_json(const json& j) {
  HealthReport r;
  r.rank = j.at("rank").get<int>();
  r.world = j.at("world").get<int>();
  r.host = j.at("host").get<std::string>();
  for (const json& c : j.at("checks")) {
    HealthCheck h;
    h.name = c.at("name").get<std::string>();
    h.pass = c.at("pass").get<bool>();
    h.measured = c.at("measured").get<double>();
    h.threshold = c.at("threshold").get<double>();
    h.unit = c.at("unit").get<std::string>();
    h.at_least = c.at("at_least").get<bool>();
    h.detail = c.at("detail").get<std::string>();
    r.checks.push_back(h);
  }
  return r;
}

HealthReport run_health(const HealthOptions& o, Communicator* world) {
  ZAYA_CHECK(o.device == "cpu" || o.device == "cuda", "--device {}: expected cpu or cuda",
             o.device);
  ZAYA_CHECK(o.min_free_gb >= 0, "--min-free-gb must be >= 0, got {}", o.min_free_gb);
  ZAYA_CHECK(o.profile_fraction > 0 && o.profile_fraction <= 1,
             "--profile-fraction must be in (0, 1], got {}", o.profile_fraction);
  ZAYA_CHECK(o.probe_seconds > 0 && o.probe_seconds <= 60,
             "--probe-seconds must be in (0, 60], got {}", o.probe_seconds);
  const bool gpu = o.device == "cuda";
  // Read (and so validated) on every device, but a profile's figures describe its GPU: a CPU run
  // keeps the defaults.
  ProfileFigures pf = read_profile(o.profile, o.profile_fraction);
  if (!gpu) pf = ProfileFigures{};
  HealthReport r;
  r.rank = world ? world->rank() : 0;
  r.world = world ? world->size() : 1;
  r.host = world ? world->host_name() : local_host_name();
  r.checks.push_back(gemm_check(o, pick(o.min_gemm_gflops, pf.gemm_gflops,
                                        gpu ? kDefaultGpuGemmGflops : kDefaultCpuGemmGflops)));
  r.checks.push_back(memory_check(
      o, pick(o.min_mem_gbs, pf.mem_gbs, gpu ? kDefaultGpuMemGbs : kDefaultCpuMemGbs)));
  r.checks.push_back(
      all_reduce_check(world, o.max_allreduce_ms >= 0 ? o.max_allreduce_ms : kDefaultAllReduceMs));
  dir_checks(o, r.rank, r.checks);
  return r;
}

std::vector<std::string> health_failures(const std::vector<HealthReport>& all) {
  std::vector<std::string> out;
  for (const HealthReport& r : all)
    for (const HealthCheck& c : r.checks) {
      if (c.pass) continue;
      if (c.name == "checkpoint_dir") {
        out.push_back(
            fmt::format("rank {} on {}: checkpoint_dir failed: {}", r.rank, r.host, c.detail));
        continue;
      }
      out.push_back(
          fmt::format("rank {} on {}: {} failed: measured {:.4g} {}, threshold {} {:.4g} {} ({})",
                      r.rank, r.host, c.name, c.measured, c.unit,
                      c.at_least ? ">=" : "<=", c.threshold, c.unit, c.detail));
    }
  return out;
}

std::string health_table(const std::vector<HealthReport>& all) {
  std::string s = fmt::format("{:<5} {:<20} {:<15} {:>14} {:>16} {:<5} {}\n", "#rank", "host",
                              "check", "measured", "threshold", "pass", "detail");
  for (const HealthReport& r : all)
    for (const HealthCheck& c : r.checks)
      s += fmt::format("{:<5} {:<20} {:<15} {:>14} {:>16} {:<5} {}\n", r.rank, r.host, c.name,
                       fmt::format("{:.4g} {}", c.measured, c.unit),
                       fmt::format("{} {:.4g} {}", c.at_least ? ">=" : "<=", c.threshold, c.unit),
                       c.pass ? "yes" : "NO", c.detail);
  return s;
}

json health_json(const std::vector<HealthReport>& all) {
  json ranks = json::array();
  bool ok = true;
  for (const HealthReport& r : all) {
    ranks.push_back(r.to_json());
    ok = ok && r.ok();
  }
  return {{"schema", "zaya.health/1"}, {"ok", ok}, {"ranks", ranks}};
}

}  // namespace zaya::bench
