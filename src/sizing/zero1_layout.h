// The ZeRO-1 plan (dist/zero1.h) of a model from its tensor shapes alone: the items the
// data-parallel step plans over (engine/data_parallel_step.h builds its own with this), and a
// summary of the layout it would use at a world size, for `zaya size`.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "dist/zero1.h"
#include "model/config.h"
#include "optim/optimizer.h"

namespace zaya {

// The ZeRO-1 items of tensors (name, shape) in the model's tensor order under these optimizer
// settings: balancing biases without a gradient, the qkv continuations following q_proj.
std::vector<Zero1Item> zero1_items(const std::vector<std::pair<std::string, Shape>>& tensors,
                                   const OptimizerSettings& optim);

namespace sizing {

struct Zero1LayoutSummary {
  int ranks = 1;
  int64_t buckets = 0, rooted = 0;   // buckets, and those reduced and broadcast per owner
  int64_t flat_elems = 0;            // fp32 elements of each flat buffer (gradients, masters)
  int64_t padding_elems = 0;         // of them, between tensors
  double state_max_over_mean = 1.0;  // optimizer state of the most loaded rank over the mean
};
// The plan of the data-parallel step for config `c` over `ranks` ranks with buckets of
// bucket_elems fp32 elements per rank (dim-0 slices on, as the step plans).
Zero1LayoutSummary zero1_layout(const ZayaConfig& c, int ranks, const OptimizerSettings& optim,
                                int64_t bucket_elems);

}  // namespace sizing
}  // namespace zaya
