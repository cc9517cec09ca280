// The CUDA TrainStep (engine/cuda/cuda_step_cuda.cpp): a CudaModel and a CudaOptimizer on one
// device. This header needs no CUDA header, so the factory compiles everywhere; a build without
// the CUDA backend gets engine/train_step.cpp's definitions, which explain themselves.
#pragma once
#include <memory>

#include "engine/train_step.h"

namespace zaya {

// Throws zaya::Error unless CUDA device `device` can train: the build has the CUDA backend and
// the machine has the device.
void check_cuda_step_available(int device);

// The step over `host` (its weights are uploaded; `host` stays the model of record for the
// balancing biases, updated on the host and uploaded, and must outlive the step).
std::unique_ptr<TrainStep> make_cuda_step(ZayaModel& host, const OptimizerSettings& optim,
                                          const BalancingSettings& balancing,
                                          const TrainStepOptions& options);

}  // namespace zaya
