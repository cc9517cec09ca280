// The CPU reference TrainStep (engine/cpu_step.cpp); make_train_step picks it for device "cpu".
#pragma once
#include <memory>

#include "engine/train_step.h"

namespace zaya {

// Trains `model`'s tensors in place (re-homed into the step's flat master buffer as owned fp32).
// Of the options it reads the ZeRO-1 ones: with a non-empty `owned_state` (one entry per tensor
// slot) the optimizer keeps state for, and updates, only those parameters (a ZeRO-1 rank); its
// named state is theirs only; owned_slices narrows one to its dim-0 slice; flat_offsets places
// the tensors in the flat buffers (TrainStepOptions).
std::unique_ptr<TrainStep> make_cpu_step(ZayaModel& model, const OptimizerSettings& optim,
                                         const BalancingSettings& balancing,
                                         const TrainStepOptions& options = {});

}  // namespace zaya
