// Summary of a decode trace (`zaya bench infer --trace`): the CUDA decode kernels stamp the global
// timer as each passes its programmatic-dependency wait (and the router after its stages); the time
// from one stamp to the next is what the first kernel costs on the step's critical path. Stamps
// are grouped into steps between consecutive step-end stamps and the gaps aggregated by transition
// ("residual_norm -> router" is the post-attention norm, "attention -> gemv" the attention, ...).
// Pure arithmetic on (event, ns) pairs, so it is unit-tested without a GPU.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zaya::bench {

struct TraceTransition {
  std::string from, to;
  double per_step = 0;  // occurrences per step
  double mean_us = 0;   // mean gap from a `from` stamp to the next stamp, when that is `to`
  double total_us = 0;  // per_step × mean_us: its share of the step
};

struct TraceSummary {
  int64_t steps = 0;                  // complete steps (between two step-end stamps)
  double step_us = 0;                 // mean time from one step-end stamp to the next
  std::vector<TraceTransition> rows;  // by total_us, largest first
};

// stamps: (event id, ns) in any order; names[id] names each event; step_end: the id of the last
// stamp of every step. Throws zaya::Error when fewer than two step-end stamps are present or an
// id has no name.
TraceSummary summarize_decode_trace(std::vector<std::pair<unsigned, uint64_t>> stamps,
                                    const std::vector<std::string>& names, unsigned step_end);

}  // namespace zaya::bench
