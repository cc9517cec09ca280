// `zaya bench mem`: device memory bandwidth (read, write, copy and triad kernels over sizes from
// L2-resident to multi-GB), host<->device copies from pinned and pageable memory, and
// device-to-device cudaMemcpy. Bytes moved per iteration count every byte read plus every byte
// written (copy: 2N, triad: 3N, memcpy d2d: 2N; host<->device: N), STREAM's convention. The
// measurement (run_mem_bench) exists only in CUDA builds; names, parsing and writers are plain C++.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/gemm_bench.h"

namespace zaya::bench {

// All tests in the order they run.
const std::vector<std::string>& mem_test_names();
// A comma-separated list of test names or "all"; throws zaya::Error naming --tests.
std::vector<std::string> parse_mem_tests(const std::string& list);
// Bytes moved per iteration by `test` on buffers of `bytes` each.
uint64_t mem_bytes_moved(const std::string& test, uint64_t bytes);

struct MemResult {
  std::string test;
  uint64_t bytes = 0;                         // size of each buffer
  uint64_t moved = 0;                         // bytes read + written per iteration
  double time_us = 0, gbs = 0, fraction = 0;  // fraction: of the peak for device tests
  int64_t wrong = -1;  // copy/memcpy tests verify the destination (-1: not checked)
};

struct MemBenchOptions {
  std::vector<std::string> tests;
  std::vector<uint64_t> sizes;
  int iters = 20, warmup = 3;
  int device = 0;
};

// Defined in the *_cuda.cpp files; in a build without CUDA, bench/cpu_only_standins.cpp has stand-ins that throw.
std::vector<MemResult> run_mem_bench(const MemBenchOptions& opt, double peak_gbs);

std::string mem_table_header();
std::string mem_table_row(const MemResult& r);
std::string mem_results_json(const std::vector<MemResult>& rs, const DeviceInfo& dev,
                             double peak_gbs);
std::string mem_results_csv(const std::vector<MemResult>& rs);
std::string mem_results_svg(const std::vector<MemResult>& rs, const std::string& device);
// The best GB/s of `test` over all sizes >= min_bytes (the plateau), or 0 when not measured.
double mem_best_gbs(const std::vector<MemResult>& rs, const std::string& test, uint64_t min_bytes);

}  // namespace zaya::bench
