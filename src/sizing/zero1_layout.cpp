// zero1_items and the layout summary (zero1_layout.h).
#include "sizing/zero1_layout.h"

#include <algorithm>

#include "model/zaya.h"
#include "optim/param_rules.h"

namespace zaya {

std::vector<Zero1Item> zero1_items(const std::vector<std::pair<std::string, Shape>>& tensors,
                                   const OptimizerSettings& optim) {
  const auto rules = optim.effective_rules();
  std::vector<Zero1Item> items;
  for (const auto& [name, shape] : tensors) {
    Zero1Item it;
    it.name = name;
    it.shape = shape;
    it.numel = 1;
    for (int64_t d : shape) it.numel *= d;
    it.muon_ns_steps = optim.muon.ns_steps;
    it.follows_previous = continues_packed_qkv(name);
    if (is_balancing_bias(name)) {
      it.kind = OwnedKind::NoGrad;
    } else {
      switch (assign_param(name, shape, rules, optim.weight_decay).optimizer) {
        case OptimizerKind::Muon: it.kind = OwnedKind::Muon; break;
        case OptimizerKind::AdamW: it.kind = OwnedKind::AdamW; break;
        case OptimizerKind::None: it.kind = OwnedKind::None; break;
      }
    }
    items.push_back(std::move(it));
  }
  return items;
}

namespace sizing {

Zero1LayoutSummary zero1_layout(const ZayaConfig& c, int ranks, const OptimizerSettings& optim,
                                int64_t bucket_elems) {
  const auto items = zero1_items(tensor_shapes_in_order(c), optim);
  const Zero1Plan p = plan_zero1(items, ranks, bucket_elems, true);
  Zero1LayoutSummary s;
  s.ranks = ranks;
  s.buckets = p.buckets();
  for (const Zero1Bucket& b : p.bucket_list) s.rooted += !b.rooted.empty();
  s.flat_elems = p.flat_numel;
  s.padding_elems = p.padding(items);
  double total = 0, most = 0;
  for (int64_t f : p.state_floats) {
    total += double(f);
    most = std::max(most, double(f));
  }
  s.state_max_over_mean = total > 0 ? most / (total / ranks) : 1.0;
  return s;
}

}  // namespace sizing
}  // namespace zaya
