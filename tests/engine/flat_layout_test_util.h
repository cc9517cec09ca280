// The training step the flat-layout tests (tests/engine/test_flat_layout.cpp on the CPU,
// tests/gpu/test_flat_layout_gpu.cpp on the GPU) give two steps alike.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/train_step.h"

namespace zaya::test_util {

// Step `step` of both a and b on the same B×S ids: zero_grads, forward_backward, the loss and the
// squared gradient norm compared bit for bit, one optimizer update. Targets shift by
// step·target_shift.
inline void train_step_both(TrainStep& a, TrainStep& b, int64_t vocab, int64_t B, int64_t S,
                            int step, int target_shift) {
  std::vector<int32_t> ids(size_t(B * S)), tgt(size_t(B * S));
  for (int64_t i = 0; i < B * S; i++) {
    ids[size_t(i)] = int32_t((i * 37 + step * 11) % vocab);
    tgt[size_t(i)] = int32_t((i * 53 + 7 + step * target_shift) % vocab);
  }
  a.zero_grads();
  b.zero_grads();
  const StepStats sa = a.forward_backward(ids.data(), tgt.data(), B, S, 1.0f);
  const StepStats sb = b.forward_backward(ids.data(), tgt.data(), B, S, 1.0f);
  EXPECT_EQ(sa.loss, sb.loss) << "step " << step;
  EXPECT_EQ(a.grad_sq_norm(), b.grad_sq_norm()) << "step " << step;
  a.optimizer_step(1e-2, 1.0f);
  b.optimizer_step(1e-2, 1.0f);
}

}  // namespace zaya::test_util
