// The hardware profile, schema "zaya.hardware/1": what `zaya bench gemm|mem|comm --profile F` and
// `zaya bench profile` measure about a machine, for `zaya size` to plan with. Each benchmark
// merges its part into the file (creating it if needed), so one profile accumulates results of
// several runs. Layout (documented in docs/BENCHMARKS.md):
//   {"schema":"zaya.hardware/1","device","sm_count","peak_tflops":{"bf16","fp8"},
//    "hbm_capacity_gib","copy_bandwidth_gbs","read_bandwidth_gbs","h2d_pinned_gbs",
//    "d2h_pinned_gbs","knee_gflop":{"p80","p90"},
//    "gemm_efficiency":[{"m","n","k","dtype","tflops","fraction"}],
//    "collectives":[{"op","ranks","bytes","busbw_gbs","backend","dtype","group"}]}
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace zaya::bench {

inline constexpr const char* kHardwareSchema = "zaya.hardware/1";

// Merges `update` into `profile`: scalar and object fields are replaced (objects key by key),
// "gemm_efficiency" entries are replaced when (m, n, k, dtype[, groups, method]) match and appended
// otherwise, "collectives" likewise keyed by (op, ranks, bytes, backend, dtype, group).
void merge_profile(nlohmann::json& profile, const nlohmann::json& update);
// Reads `path` (an empty profile when it does not exist), merges, writes atomically. Throws
// zaya::Error when the file exists but is not a zaya.hardware/1 JSON document.
void merge_profile_file(const std::string& path, const nlohmann::json& update);

// Throws zaya::Error naming `flag` when `path` cannot be written: its folder does not exist.
// Called before a benchmark runs so a typo does not cost the whole run.
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace zaya::bench
