// ZeRO-1 ownership (zero1.h): LPT-greedy assignment and the bucketed packed layout.
#include "dist/zero1.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace zaya {

double newton_schulz_flops(const std::vector<int64_t>& shape, int ns_steps) {
  if (shape.size() < 2) return 0;
  const double rows = double(shape[shape.size() - 2]), cols = double(shape[shape.size() - 1]);
  const double mats = shape.size() == 3 ? double(shape[0]) : 1.0;
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  return mats * double(ns_steps) * (4.0 * m * m * n + 2.0 * m * m * m);
}

int64_t state_floats(const Zero1Item& it) {
  switch (it.kind) {
    case OwnedKind::AdamW: return 2 * it.numel;
    case OwnedKind::Muon: return it.numel;
    default: return 0;
  }
}

std::vector<bool> Zero1Plan::mask(int rank) const {
  std::vector<bool> m(owner.size());
  for (size_t i = 0; i < owner.size(); i++) m[i] = owner[i] == rank;
  return m;
}

std::string Zero1Plan::describe(const std::vector<Zero1Item>& items) const {
  std::string out;
  for (int r = 0; r < world; r++) {
    int64_t tensors = 0;
    for (size_t i = 0; i < owner.size(); i++) tensors += owner[i] == r;
    out += fmt::format(
        "  rank {:>3}: {:>4} tensors, {:>12} gradient elements, {:>4} Muon matrices "
        "({:.3g} NS GFLOP), optimizer state {:.2f} MiB\n",
        r, tensors, segment_floats[size_t(r)], muon_matrices[size_t(r)],
        ns_flops[size_t(r)] / 1e9, double(state_floats[size_t(r)]) * 4.0 / double(1 << 20));
  }
  (void)items;
  return out;
}

Zero1Plan plan_zero1(const std::vector<Zero1Item>& items, int world, int64_t bucket_elems) {
  ZAYA_CHECK(world >= 1, "ZeRO-1: world size {} must be >= 1", world);
  ZAYA_CHECK(bucket_elems >= 1, "ZeRO-1: bucket of {} elements must hold at least one", bucket_elems);
  Zero1Plan p;
  p.world = world;
  p.bucket_elems = bucket_elems;
  p.owner.assign(items.size(), -1);
  p.ns_flops.assign(size_t(world), 0);
  p.state_floats.assign(size_t(world), 0);
  p.segment_floats.assign(size_t(world), 0);
  p.muon_matrices.assign(size_t(world), 0);
  auto assign = [&](size_t i, int r) {
    const Zero1Item& it = items[i];
    p.owner[i] = r;
    p.state_floats[size_t(r)] += state_floats(it);
    p.segment_floats[size_t(r)] += it.numel;
    if (it.kind == OwnedKind::Muon) {
      p.ns_flops[size_t(r)] += newton_schulz_flops(it.shape, it.muon_ns_steps);
      p.muon_matrices[size_t(r)] += it.shape.size() == 3 ? it.shape[0] : 1;
    }
  };
  std::vector<size_t> muon, rest;
  for (size_t i = 0; i < items.size(); i++) {
    if (items[i].kind == OwnedKind::NoGrad) continue;
    (items[i].kind == OwnedKind::Muon ? muon : rest).push_back(i);
  }
  // Muon: largest Newton–Schulz cost first, to the rank with the least so far.
  std::vector<double> cost(items.size(), 0);
  for (size_t i : muon) cost[i] = newton_schulz_flops(items[i].shape, items[i].muon_ns_steps);
  std::stable_sort(muon.begin(), muon.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  for (size_t i : muon) {
    int best = 0;
    for (int r = 1; r < world; r++)
      if (p.ns_flops[size_t(r)] < p.ns_flops[size_t(best)]) best = r;
    assign(i, best);
  }
  // The rest: largest state first, to the rank with the least state so far (Muon's included);
  // tensors without state (trained by nothing) balance the gradient elements instead.
  auto weight = [&](size_t i) {
    const int64_t s = state_floats(items[i]);
    return s > 0 ? s : items[i].numel;
  };
  std::stable_sort(rest.begin(), rest.end(),
                   [&](size_t a, size_t b) { return weight(a) > weight(b); });
  for (size_t i : rest) {
    const bool stateful = state_floats(items[i]) > 0;
    int best = 0;
    for (int r = 1; r < world; r++) {
      const auto& load = stateful ? p.state_floats : p.segment_floats;
      if (load[size_t(r)] < load[size_t(best)]) best = r;
    }
    assign(i, best);
  }
  p.seg = std::max<int64_t>(1, *std::max_element(p.segment_floats.begin(), p.segment_floats.end()));
  return p;
}

std::vector<SegmentPiece> segment_pieces(const Zero1Plan& plan, const std::vector<Zero1Item>& items,
                                         const std::vector<int64_t>& flat_offsets, int rank) {
  ZAYA_CHECK(flat_offsets.size() == items.size() && plan.owner.size() == items.size(),
             "ZeRO-1: {} offsets and {} owners for {} tensors", flat_offsets.size(),
             plan.owner.size(), items.size());
  std::vector<SegmentPiece> out;
  int64_t j = 0;
  for (size_t i = 0; i < items.size(); i++) {
    if (plan.owner[i] != rank) continue;
    out.push_back({flat_offsets[i], j, items[i].numel});
    j += items[i].numel;
  }
  return out;
}

void for_each_packed_run(const Zero1Plan& plan, int rank, const SegmentPiece& p,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  int64_t done = 0;
  while (done < p.len) {
    const int64_t j = p.seg_offset + done;
    const int64_t bucket_end = (j / plan.bucket_elems + 1) * plan.bucket_elems;
    const int64_t n = std::min(p.len - done, bucket_end - j);
    fn(plan.packed_offset(rank, j), p.flat_offset + done, n);
    done += n;
  }
}

}  // namespace zaya
