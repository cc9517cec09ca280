// Storage sizing for the training data loader (ZAYA1.md §5): how many random reads per second the
// file system must sustain so that reading one step's tokens does not stall the step.
//   required IOPS         = σ·G·s·b / (P·t)
//   break-even step time  = σ·G·s·b / (P·I_max)
// with G sequences per step, s tokens per sequence, b bytes per token, P the page (read) size,
// t the step time, I_max the storage's sustainable IOPS and σ ≥ 1 the scatter factor (how many
// pages a page's worth of tokens touches once documents are shuffled).
// Deliberately not here: caching, prefetch depth, or throughput (bytes/s) limits of the storage.
#pragma once
#include <nlohmann/json_fwd.hpp>

namespace zaya::sizing {

struct IoInput {
  double global_batch = 0;     // G, sequences per step
  double seq = 0;              // s, tokens per sequence
  double bytes_per_token = 0;  // b
  double page = 0;             // P, bytes
  double step_time = 0;        // t, seconds
  double iops = 0;             // I_max
  double scatter = 1;          // σ
  void validate() const;       // names the flag of a bad value
};

struct IoSizing {
  double bytes_per_step = 0;
  double pages_per_step = 0;  // σ·G·s·b / P
  double required_iops = 0;
  double break_even_step_s = 0;
  double headroom = 0;  // I_max / required
  nlohmann::json to_json() const;
};

IoSizing size_io(const IoInput& in);

}  // namespace zaya::sizing
