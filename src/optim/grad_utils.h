// Gradient bookkeeping between backward and the optimizer step: zeroing, averaging accumulated
// micro-batch gradients, and clipping by global norm. Sums of squares are taken in double over
// fixed blocks and added in a fixed order, so the norm does not depend on the thread count.
// Parameters without a gradient tensor (balancing biases) are skipped. Not here: the all-reduce of
// gradients or of the squared norm across ranks (dist/): with sharded gradients, all-reduce
// grad_sq_norm() over ranks and pass its square root to clip_grads_to_norm().
#pragma once
#include <vector>

#include "optim/param.h"

namespace zaya {

void zero_grads(const std::vector<ParamRef>& params);
void scale_grads(const std::vector<ParamRef>& params, float factor);
// Turns gradients summed over `micro_batches` backward passes into their mean (scale
// 1/micro_batches). Call once after the last micro-batch, before clipping.
void average_accumulated_grads(const std::vector<ParamRef>& params, int64_t micro_batches);

// Σ g² over every element of every gradient, in double.
double grad_sq_norm(const std::vector<ParamRef>& params);
// Scales all gradients by max_norm/(norm + 1e-6) when norm > max_norm; max_norm <= 0 disables
// clipping; a non-finite norm leaves the gradients alone (the loop's NaN guard decides).
void clip_grads_to_norm(const std::vector<ParamRef>& params, double max_norm, double norm);
// Computes the global norm, clips to max_norm, and returns the pre-clip norm (for logging).
double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm);

}  // namespace zaya
