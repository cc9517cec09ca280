// ParamRef: how the optimizers see a model parameter: its Hugging Face name, its fp32 master value
// and its fp32 gradient (same shape, contiguous, host memory). The optimizers update `value` in
// place through the shared storage; they never allocate or own parameters, and they do not know the
// model's layout beyond these names and shapes.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zaya {

struct ParamRef {
  std::string name;
  Tensor value;  // fp32 master weight, updated in place
  Tensor grad;   // fp32 gradient of the loss, same shape
};

// Throws zaya::Error unless value and grad are defined, fp32, contiguous, host-resident, writable
// and of equal shape; `who` names the caller in the message.
void check_param(const ParamRef& p, const char* who);

}  // namespace zaya
