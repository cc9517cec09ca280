// Training forward + backward of the whole ZAYA1 model (ZAYA1.md §3) on the CPU reference ops:
// the forward of ZayaModel::forward without a cache (all positions), keeping the activations the
// backward needs, then reverse-mode through the tied LM head, every layer (MoE with the EDA router
// state chain, CCA attention) and the input affine/embedding. Gradients accumulate into a
// ModelGrads that mirrors ZayaModel::named_tensors(), in fp32.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/zaya.h"

namespace zaya {

// Gradients with the same names, shapes and order as model.named_tensors(), fp32.
struct ModelGrads {
  std::vector<std::pair<std::string, Tensor>> tensors;
  void zero();
  // The gradient of the named tensor; throws zaya::Error naming an unknown name.
  Tensor& get(const std::string& name);
};

// Zero-initialised gradients for every tensor of the model.
ModelGrads make_grads(const ZayaModel& m);

struct StepStats {
  double loss = 0;                           // mean cross-entropy over tokens with target >= 0
  int64_t tokens = 0;                        // number of such tokens
  std::vector<std::vector<int64_t>> routed;  // per layer, tokens per class 0..E (E = skip)
};

// ids, targets: [B,S] int32; targets[n] < 0 are ignored. Computes the mean cross-entropy and
// ACCUMULATES (+=) loss_scale * d(mean loss)/d(param) into grads (loss_scale = 1/micro_batches for
// gradient accumulation). Balancing biases get no gradient (the choice is discrete). Every weight
// must be fp32 (training keeps fp32 master weights); anything else is refused with an error.
// Deterministic: the result does not depend on the thread count. Scratch memory (about one step's
// activations) is kept by the calling thread between calls, so repeated steps do not reallocate.
StepStats forward_backward(const ZayaModel& m, const int32_t* ids, const int32_t* targets,
                           int64_t B, int64_t S, ModelGrads& grads, float loss_scale = 1.0f);

}  // namespace zaya
