// The CPU reference TrainStep (engine/cpu_step.cpp); make_train_step picks it for device "cpu".
#pragma once
#include <memory>

#include "engine/train_step.h"

namespace zaya {

// Trains `model`'s tensors in place (re-homed into the step's flat master buffer as owned fp32).
std::unique_ptr<TrainStep> make_cpu_step(ZayaModel& model, const OptimizerSettings& optim,
                                         const BalancingSettings& balancing);

}  // namespace zaya
