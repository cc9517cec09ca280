// Named state pieces. See named_state.h.
#include "ckpt/named_state.h"

#include <algorithm>

namespace zaya {

bool NamedState::is_whole() const {
  return tensor.shape() == global_shape &&
         std::all_of(offset.begin(), offset.end(), [](int64_t o) { return o == 0; });
}

std::vector<NamedState> whole_tensors(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<NamedState> out;
  out.reserve(named.size());
  for (const auto& [name, t] : named)
    out.push_back({name, t, t.shape(), std::vector<int64_t>(t.shape().size(), 0)});
  return out;
}

}  // namespace zaya
