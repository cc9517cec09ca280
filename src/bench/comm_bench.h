// `zaya bench comm`: collective bandwidth in the manner of nccl-tests, on any zaya::Communicator
// (MPI on host buffers or NCCL on GPUs), over a size sweep, dtypes, reductions, in/out-of-place,
// and sub-communicators (first-k rank sweep, intra-node and inter-node groups). Every measured row
// also checks its result against exactly computable expected values and counts wrong elements.
// The timing loop is host-timed around `iters` back-to-back calls followed by one synchronize, the
// time being the maximum over the group's ranks (nccl-tests uses the same loop and reports the
// average; the maximum is what a training step waits for).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "dist/comm.h"

namespace zaya::bench {

struct CommBenchOptions {
  std::vector<CommOp> ops;
  std::vector<uint64_t> sizes;  // bytes
  std::vector<DType> dtypes;
  std::vector<RedOp> redops{RedOp::Sum};
  int iters = 20, warmup = 5;
  bool out_of_place = true, in_place = false;
  bool sweep_ranks = false;
  bool check = true;
};

struct CommRow {
  std::string op, group, backend;
  int ranks = 0;
  uint64_t bytes = 0, count = 0;
  std::string dtype, redop;  // redop "none" for non-reductions
  bool inplace = false;
  double time_us = 0, algbw_gbs = 0, busbw_gbs = 0;
  int64_t wrong = 0;  // -1: not checked
};

// Runs the benchmark; collective over `world`. Rows are returned on world rank 0 (empty
// elsewhere) and, when `print` is set, also printed there as a fixed-width table as they come.
std::vector<CommRow> run_comm_bench(Communicator& world, const CommBenchOptions& opt, bool print);

std::string comm_table_header();
std::string comm_table_row(const CommRow& r);
// JSON document {"schema":"zaya.bench.comm/1", "backend", "world_size", "hosts", "results":[...]},
// one record per row with name, size, count, dtype, redop, inplace, time_us, algbw, busbw, wrong,
// group and ranks.
std::string comm_rows_json(const std::vector<CommRow>& rows, const std::string& backend,
                           int world_size, const std::vector<std::string>& hosts);
std::string comm_rows_csv(const std::vector<CommRow>& rows);
// busbw vs size, one line per (op, group/ranks[, dtype][, placement]).
std::string comm_rows_svg(const std::vector<CommRow>& rows);

}  // namespace zaya::bench
