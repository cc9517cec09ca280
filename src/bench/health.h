// `zaya health`: the checks a node passes before a (re)start of a supervised job, per rank: GEMM
// throughput (the CPU reference gemm, or cuBLASLt through bench/gemm_bench.h with device cuda),
// memory bandwidth (a host copy, or the device copy kernel of bench/mem_bench.h), a small
// all-reduce across the job through bench/comm_bench.h (result checked, time against a bound),
// and the checkpoint directory: writable (a file written, fsynced and removed) with enough free
// space. Thresholds are given, or come from a hardware profile (`zaya bench ... --profile`: a
// fraction of its measured bf16 peak and copy bandwidth), or are defaults meant to catch a broken
// node, not to grade a healthy one. Quick by design: about a second of probes.
// Not here: deciding what to do about a failing node (the supervisor's), GPU health counters.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace zaya::bench {

struct HealthOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  int device_index = 0;
  std::string dir = ".";     // the checkpoint directory to check (created when missing)
  double min_free_gb = 1.0;  // free space it must have (GiB)
  // Thresholds; negative: from the profile, else the defaults (kDefault* below).
  double min_gemm_gflops = -1, min_mem_gbs = -1, max_allreduce_ms = -1;
  std::string profile;            // a zaya.hardware/1 profile ("": none)
  double profile_fraction = 0.5;  // of the profile's measured figures that a rank must reach
  double probe_seconds = 0.2;     // per throughput probe
};

// Defaults when neither a flag nor a profile gives a threshold: CPU GFLOP/s and GB/s per rank,
// GPU TFLOP/s (bf16) and GB/s, and the all-reduce bound.
inline constexpr double kDefaultCpuGemmGflops = 0.5, kDefaultCpuMemGbs = 0.5;
inline constexpr double kDefaultGpuGemmGflops = 50e3, kDefaultGpuMemGbs = 300;
inline constexpr double kDefaultAllReduceMs = 2000;

struct HealthCheck {
  std::string name;  // "gemm", "memory", "all_reduce", "checkpoint_dir", "free_space"
  bool pass = false;
  double measured = 0, threshold = 0;
  std::string unit;      // "GFLOP/s", "GB/s", "ms", "GiB", ""
  bool at_least = true;  // measured must be >= threshold (else <=)
  std::string detail;    // what was run, or why it failed
};

struct HealthReport {
  int rank = 0, world = 1;
  std::string host;
  std::vector<HealthCheck> checks;
  bool ok() const;
  nlohmann::json to_json() const;
  static HealthReport from_json(const nlohmann::json& j);
};

// Runs every check on this rank; `world` (nullptr: one process) takes part in the all-reduce
// check, which is collective. Throws zaya::Error only for bad options or an unreadable profile.
HealthReport run_health(const HealthOptions& opt, Communicator* world);

// "rank R on HOST: CHECK failed: measured M UNIT, threshold >= T UNIT (detail)", one per failed
// check of every report.
std::vector<std::string> health_failures(const std::vector<HealthReport>& all);
// A fixed-width table: one row per rank and check.
std::string health_table(const std::vector<HealthReport>& all);
// {"schema":"zaya.health/1","ok":...,"ranks":[report.to_json()...]}.
nlohmann::json health_json(const std::vector<HealthReport>& all);

}  // namespace zaya::bench
