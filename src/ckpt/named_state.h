// Named state: how stateful training components hand their state to checkpoints. Each piece is a
// tensor under a stable name (optim.adamw.exp_avg.<param>, balance.exp_avg.<layer bias>, ...)
// with where it sits in the global tensor of that name: the global shape and the piece's start
// in every dimension. A single process stores whole tensors (offset zero, shape = global shape);
// a data-parallel rank that owns part of a tensor stores its slice under the same name, so a
// checkpoint can be read back by any number of ranks.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace zaya {

struct NamedState {
  std::string name;
  Tensor tensor;                // the piece this process holds
  Shape global_shape;           // the whole tensor's shape
  std::vector<int64_t> offset;  // the piece's start in each dimension of the global tensor

  bool is_whole() const;
};

// Whole tensors (every piece is its global tensor).
std::vector<NamedState> whole_tensors(const std::vector<std::pair<std::string, Tensor>>& named);

}  // namespace zaya
