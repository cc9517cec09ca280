// The hardware profile, schema "zaya.hardware/1": what `zaya bench gemm|mem|comm --profile F` and
// `zaya bench profile` measure about a machine, for `zaya size` to plan with. Each benchmark
// merges its part into the file (creating it if needed), so one profile accumulates results of
// several runs. Layout (documented in docs/BENCHMARKS.md):
//   {"schema":"zaya.hardware/1","device","sm_count","peak_tflops":{"bf16","fp8"},
//    "hbm_capacity_gib","copy_bandwidth_gbs","read_bandwidth_gbs","h2d_pinned_gbs",
//    "d2h_pinned_gbs","measured_peak_tflops":{"bf16","fp8"},
//    "knee_gflop":{"p80","p90","reference_tflops","reference"},"knee_gflop_spec":{...},
//    "gemm_efficiency":[{"m","n","k","dtype","tflops","fraction"}],
//    "collectives":[{"op","ranks","bytes","busbw_gbs","backend","dtype","group"}],
//    "kernel_efficiency":[{"class","shape","work","tflops"|"gbs","fraction","source"}]}
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/comm_bench.h"
#include "bench/gemm_bench.h"
#include "bench/mem_bench.h"

namespace zaya::bench {

inline constexpr const char* kHardwareSchema = "zaya.hardware/1";

// Merges `update` into `profile`: scalar and object fields are replaced (objects key by key),
// "gemm_efficiency" entries are replaced when (m, n, k, dtype[, groups, method]) match and appended
// otherwise, "collectives" likewise keyed by (op, ranks, bytes, backend, dtype, group),
// "kernel_efficiency" by (class, shape).
void merge_profile(nlohmann::json& profile, const nlohmann::json& update);
// Reads `path` (an empty profile when it does not exist), merges, writes atomically. Throws
// zaya::Error when the file exists but is not a zaya.hardware/1 JSON document.
void merge_profile_file(const std::string& path, const nlohmann::json& update);

// The profile fields each benchmark contributes (see docs/BENCHMARKS.md for the table):
// gemm: device, sm_count, hbm_capacity_gib, peak_tflops (the peaks used; null when unknown),
// measured_peak_tflops (best single-call row per dtype), knee_gflop from the bf16 square sweep
// (else all bf16 single GEMMs) against the measured bf16 peak, knee_gflop_spec against
// peak_tflops.bf16 (null where never reached),
// gemm_efficiency (single and batched cuBLASLt rows). mem: device, sm_count, hbm_capacity_gib,
// copy/read bandwidth past 4x L2, pinned host copies. comm: out-of-place rows with busbw > 0.
nlohmann::json profile_from_gemm(const std::vector<GemmResult>& rs, const DeviceInfo& dev,
                                 double peak_bf16, double peak_fp8);
nlohmann::json profile_from_mem(const std::vector<MemResult>& rs, const DeviceInfo& dev);
nlohmann::json profile_from_comm(const std::vector<CommRow>& rows);

// Throws zaya::Error naming `flag` when `path` cannot be written: its folder does not exist.
// Called before a benchmark runs so a typo does not cost the whole run.
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace zaya::bench
