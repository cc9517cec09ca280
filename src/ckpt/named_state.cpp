// Named state pieces. See named_state.h.
#include "ckpt/named_state.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

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

Tensor StateSource::read_whole(const std::string& name) const {
  const Shape& g = global_shape(name);
  return read(name, std::vector<int64_t>(g.size(), 0), g);
}

Tensor StateSource::read_rows(const std::string& name, int64_t first, int64_t count) const {
  Shape sh = global_shape(name);
  ZAYA_CHECK(!sh.empty(), "state '{}' is a scalar; it has no rows", name);
  sh[0] = count;
  std::vector<int64_t> off(sh.size(), 0);
  off[0] = first;
  return read(name, off, sh);
}

int64_t copy_box_overlap(const Tensor& piece, const std::vector<int64_t>& piece_offset, Tensor& out,
                         const std::vector<int64_t>& out_offset) {
  const Shape& ps = piece.shape();
  const Shape& os = out.shape();
  const size_t nd = ps.size();
  ZAYA_ASSERT(os.size() == nd && piece_offset.size() == nd && out_offset.size() == nd);
  ZAYA_ASSERT(piece.dtype() == DType::F32 && out.dtype() == DType::F32);
  ZAYA_ASSERT(piece.is_contiguous() && out.is_contiguous());
  // The intersection [lo, hi) in global coordinates.
  std::vector<int64_t> lo(nd), hi(nd);
  for (size_t d = 0; d < nd; d++) {
    lo[d] = std::max(piece_offset[d], out_offset[d]);
    hi[d] = std::min(piece_offset[d] + ps[d], out_offset[d] + os[d]);
    if (hi[d] <= lo[d]) return 0;
  }
  if (nd == 0) {
    *out.f32() = *piece.f32();
    return 1;
  }
  // Row-major strides of both.
  std::vector<int64_t> pst(nd, 1), ost(nd, 1);
  for (size_t d = nd - 1; d > 0; d--) {
    pst[d - 1] = pst[d] * ps[d];
    ost[d - 1] = ost[d] * os[d];
  }
  const int64_t run = hi[nd - 1] - lo[nd - 1];  // contiguous elements in the last dimension
  std::vector<int64_t> idx(lo.begin(), lo.end());
  const float* src = piece.f32();
  float* dst = out.f32();
  int64_t copied = 0;
  for (;;) {
    int64_t ps_off = 0, os_off = 0;
    for (size_t d = 0; d < nd; d++) {
      ps_off += (idx[d] - piece_offset[d]) * pst[d];
      os_off += (idx[d] - out_offset[d]) * ost[d];
    }
    std::memcpy(dst + os_off, src + ps_off, size_t(run) * sizeof(float));
    copied += run;
    // Next index over every dimension but the last.
    size_t d = nd - 1;
    while (d > 0) {
      d--;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return copied;
    }
    if (nd == 1) return copied;
  }
}

WholeStateSource::WholeStateSource(std::vector<std::pair<std::string, Tensor>> named)
    : named_(std::move(named)) {
  std::sort(named_.begin(), named_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
}

std::vector<std::string> WholeStateSource::names() const {
  std::vector<std::string> out;
  for (const auto& kv : named_) out.push_back(kv.first);
  return out;
}

bool WholeStateSource::has(const std::string& name) const {
  return std::binary_search(named_.begin(), named_.end(), std::make_pair(name, Tensor()),
                            [](const auto& a, const auto& b) { return a.first < b.first; });
}

const Tensor& WholeStateSource::at(const std::string& name) const {
  auto it = std::lower_bound(named_.begin(), named_.end(), name,
                             [](const auto& a, const std::string& n) { return a.first < n; });
  ZAYA_CHECK(it != named_.end() && it->first == name, "no state named '{}'", name);
  return it->second;
}

const Shape& WholeStateSource::global_shape(const std::string& name) const {
  return at(name).shape();
}

Tensor WholeStateSource::read(const std::string& name, const std::vector<int64_t>& offset,
                              const Shape& shape) const {
  Tensor whole = at(name).to(DType::F32);
  const Shape& g = whole.shape();
  ZAYA_CHECK(offset.size() == g.size() && shape.size() == g.size(),
             "state '{}' has {} dimensions; a box of {} was asked for", name, g.size(),
             shape.size());
  for (size_t d = 0; d < g.size(); d++)
    ZAYA_CHECK(offset[d] >= 0 && shape[d] >= 0 && offset[d] + shape[d] <= g[d],
               "state '{}': the box at {} of shape {} is outside its shape {}", name,
               shape_str(offset), shape_str(shape), shape_str(g));
  Tensor out = Tensor::zeros(shape);
  copy_box_overlap(whole, std::vector<int64_t>(g.size(), 0), out, offset);
  return out;
}

}  // namespace zaya
