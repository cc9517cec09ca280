// ZeRO-1 ownership (zero1.h): LPT-greedy assignment and the in-place bucketed layout.
#include "dist/zero1.h"

#include <algorithm>
#include <functional>
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
  for (size_t i = 0; i < owner.size(); i++)
    m[i] = owner[i] == rank || (owner[i] == kSplit && slices[i][size_t(rank)].count > 0);
  return m;
}

std::pair<int64_t, int64_t> Zero1Plan::part(const std::vector<Zero1Item>& items, size_t i,
                                            int r) const {
  if (owner[i] == r) return {0, items[i].numel};
  if (owner[i] != kSplit) return {0, 0};
  const int64_t per = items[i].numel / items[i].shape[0];
  const Dim0Slice& e = slices[i][size_t(r)];
  return {e.first * per, e.count * per};
}

std::string Zero1Plan::describe(const std::vector<Zero1Item>& items) const {
  std::string out;
  for (int r = 0; r < world; r++) {
    int64_t tensors = 0, sliced = 0;
    for (size_t i = 0; i < owner.size(); i++) {
      tensors += owner[i] == r;
      sliced += owner[i] == kSplit && slices[i][size_t(r)].count > 0;
    }
    out += fmt::format(
        "  rank {:>3}: {:>4} tensors + {:>3} slices, {:>12} gradient elements, {:>4} Muon "
        "matrices ({:.3g} NS GFLOP), optimizer state {:.2f} MiB\n",
        r, tensors, sliced, segment_floats[size_t(r)], muon_matrices[size_t(r)],
        ns_flops[size_t(r)] / 1e9, double(state_floats[size_t(r)]) * 4.0 / double(1 << 20));
  }
  (void)items;
  return out;
}

int64_t Zero1Bucket::elements(int world) const {
  if (rooted.empty()) return int64_t(world) * chunk;
  int64_t first = rooted.front().first, end = first;
  for (const auto& [off, n] : rooted) {
    if (n == 0) continue;
    first = std::min(first, off);
    end = std::max(end, off + n);
  }
  return end - first;
}

int64_t Zero1Plan::padding(const std::vector<Zero1Item>& items) const {
  int64_t used = 0;
  for (const Zero1Item& it : items) used += it.numel;
  return flat_numel - used;
}

namespace {

// A bucket of whole tensors whose chunks would be more than 1/kRootedPad padding is rooted.
constexpr int64_t kRootedPad = 8;

int64_t align_up(int64_t n, int64_t a) {
  return (n + a - 1) / a * a;
}

// An item and its followers (Zero1Item::follows_previous) form a group, owned and placed
// together: last[i] is the last item of the group that item i starts.
std::vector<size_t> group_last(const std::vector<Zero1Item>& items) {
  std::vector<size_t> last(items.size());
  for (size_t i = items.size(); i-- > 0;)
    last[i] = i + 1 < items.size() && items[i + 1].follows_previous ? last[i + 1] : i;
  return last;
}

// The layout of a plan whose ownership is set (zero1.h): buckets of whole owned groups (an item
// and its followers) taken in backward order from every rank in lockstep, one bucket per split
// tensor, then the items no rank owns.
void lay_out(Zero1Plan& p, const std::vector<Zero1Item>& items) {
  const size_t n = items.size();
  p.offset.assign(n, -1);
  p.bucket_list.clear();
  // Groups: [first, last] item ranges, in item order.
  const std::vector<size_t> last = group_last(items);
  std::vector<std::pair<size_t, size_t>> groups;
  for (size_t i = 0; i < n; i = last[i] + 1) groups.emplace_back(i, last[i]);
  auto group_elems = [&](const std::pair<size_t, size_t>& g) {
    int64_t e = 0;
    for (size_t i = g.first; i <= g.second; i++) e += items[i].numel;
    return e;
  };
  // Per rank, its whole groups in the order the backward completes them (last item first).
  std::vector<std::vector<size_t>> mine(size_t(p.world));
  std::vector<size_t> split, unowned;
  for (size_t gi = groups.size(); gi-- > 0;) {
    const int o = p.owner[groups[gi].first];
    if (o >= 0)
      mine[size_t(o)].push_back(gi);
    else if (o == Zero1Plan::kSplit)
      split.push_back(groups[gi].first);  // never grouped (plan_zero1)
    else
      unowned.push_back(gi);
  }
  int64_t at = 0;
  std::vector<size_t> cursor(size_t(p.world), 0);
  auto left = [&] {
    for (int r = 0; r < p.world; r++)
      if (cursor[size_t(r)] < mine[size_t(r)].size()) return true;
    return false;
  };
  while (left()) {
    Zero1Bucket b;
    b.start = at;
    // Each rank's next groups, up to bucket_elems (at least one).
    std::vector<std::vector<std::pair<size_t, int64_t>>> take(size_t(p.world));  // group, local
    std::vector<int64_t> used_by(size_t(p.world), 0);
    int64_t chunk = 0;
    for (int r = 0; r < p.world; r++) {
      int64_t& used = used_by[size_t(r)];
      auto& c = cursor[size_t(r)];
      const auto& list = mine[size_t(r)];
      while (c < list.size()) {
        const int64_t e = align_up(group_elems(groups[list[c]]), kZero1AlignFloats);
        if (used > 0 && used + e > p.bucket_elems) break;
        take[size_t(r)].emplace_back(list[c], used);
        used += e;
        c++;
      }
      chunk = std::max(chunk, used);
    }
    // Padding every chunk to the largest costs little while the ranks' loads are alike; where
    // they are not (many ranks, few tensors each) the chunks are packed back to back in rank
    // order instead, and the bucket is rooted.
    int64_t total = 0;
    for (int64_t u : used_by) total += u;
    const bool rooted = int64_t(p.world) * chunk - total > int64_t(p.world) * chunk / kRootedPad;
    int64_t chunk_at = b.start;
    for (int r = 0; r < p.world; r++) {
      const int64_t base = rooted ? chunk_at : b.start + int64_t(r) * chunk;
      if (rooted) b.rooted.emplace_back(base, used_by[size_t(r)]);
      for (const auto& [gi, local] : take[size_t(r)]) {
        int64_t off = base + local;
        for (size_t i = groups[gi].first; i <= groups[gi].second; i++) {
          p.offset[i] = off;
          off += items[i].numel;
          b.items.push_back(i);
        }
      }
      chunk_at += used_by[size_t(r)];
    }
    b.chunk = rooted ? 0 : chunk;
    std::sort(b.items.begin(), b.items.end());
    at += rooted ? total : int64_t(p.world) * chunk;
    p.bucket_list.push_back(std::move(b));
  }
  for (size_t i : split) {
    const Zero1Item& it = items[i];
    const int64_t per = it.numel / it.shape[0];
    const auto& sl = p.slices[i];
    bool even = true;
    for (int r = 0; r < p.world; r++)
      even = even && sl[size_t(r)].count == sl[0].count && sl[size_t(r)].first == r * sl[0].count;
    Zero1Bucket b;
    b.start = at;
    b.items = {i};
    p.offset[i] = at;
    if (even) {
      b.chunk = sl[0].count * per;
    } else {
      for (int r = 0; r < p.world; r++)
        b.rooted.emplace_back(at + sl[size_t(r)].first * per, sl[size_t(r)].count * per);
    }
    at += align_up(it.numel, kZero1AlignFloats);
    p.bucket_list.push_back(std::move(b));
  }
  for (auto gi = unowned.rbegin(); gi != unowned.rend(); ++gi) {
    for (size_t i = groups[*gi].first; i <= groups[*gi].second; i++) {
      p.offset[i] = at;
      at += items[i].numel;
    }
    at = align_up(at, kZero1AlignFloats);
  }
  p.flat_numel = std::max<int64_t>(at, 1);
}

}  // namespace

Zero1Plan plan_zero1(const std::vector<Zero1Item>& items, int world, int64_t bucket_elems,
                     bool split_slices) {
  ZAYA_CHECK(world >= 1, "ZeRO-1: world size {} must be >= 1", world);
  ZAYA_CHECK(bucket_elems >= 1, "ZeRO-1: bucket of {} elements must hold at least one",
             bucket_elems);
  Zero1Plan p;
  p.world = world;
  p.bucket_elems = bucket_elems;
  p.owner.assign(items.size(), -1);
  p.slices.assign(items.size(), {});
  p.ns_flops.assign(size_t(world), 0);
  p.state_floats.assign(size_t(world), 0);
  p.segment_floats.assign(size_t(world), 0);
  p.muon_matrices.assign(size_t(world), 0);
  const std::vector<size_t> last = group_last(items);  // groups are owned together
  for (size_t i = 1; i < items.size(); i++)
    ZAYA_CHECK(!items[i].follows_previous ||
                   (items[i].kind == OwnedKind::NoGrad) == (items[i - 1].kind == OwnedKind::NoGrad),
               "ZeRO-1: '{}' follows '{}' but only one of them has a gradient", items[i].name,
               items[i - 1].name);
  auto assign = [&](size_t first, int r) {
    for (size_t i = first; i <= last[first]; i++) {
      const Zero1Item& it = items[i];
      p.owner[i] = r;
      p.state_floats[size_t(r)] += state_floats(it);
      p.segment_floats[size_t(r)] += it.numel;
      if (it.kind == OwnedKind::Muon) {
        p.ns_flops[size_t(r)] += newton_schulz_flops(it.shape, it.muon_ns_steps);
        p.muon_matrices[size_t(r)] += it.shape.size() == 3 ? it.shape[0] : 1;
      }
    }
  };
  auto group_sum = [&](size_t first, const std::function<double(const Zero1Item&)>& f) {
    double v = 0;
    for (size_t i = first; i <= last[first]; i++) v += f(items[i]);
    return v;
  };
  // Big AdamW tensors (state above an eighth of a rank's share) are sliced too: one whole
  // embedding can otherwise exceed the share by itself.
  int64_t total_state = 0;
  for (const Zero1Item& it : items) total_state += state_floats(it);
  const int64_t big = total_state / (8 * int64_t(world));
  std::vector<size_t> muon, rest, split, split_adamw;
  for (size_t i = 0; i < items.size(); i++) {
    const Zero1Item& it = items[i];
    if (it.kind == OwnedKind::NoGrad || it.follows_previous) continue;
    const bool sliceable =
        split_slices && world > 1 && it.shape.size() >= 1 && it.shape[0] > 1 && last[i] == i;
    if (sliceable && it.kind == OwnedKind::Muon && it.shape.size() == 3)
      split.push_back(i);
    else if (sliceable && it.kind == OwnedKind::AdamW && state_floats(it) > big)
      split_adamw.push_back(i);
    else
      (it.kind == OwnedKind::Muon ? muon : rest).push_back(i);
  }
  // Which of two ranks has the lighter Newton–Schulz load; equal loads (equal matrices are
  // common) go to the one with less optimizer state, so the FLOP balance does not skew the bytes.
  auto lighter = [&](int a, int b) {
    const double fa = p.ns_flops[size_t(a)], fb = p.ns_flops[size_t(b)];
    if (fa != fb) return fa < fb;
    return p.state_floats[size_t(a)] < p.state_floats[size_t(b)];
  };
  auto less_state = [&](int a, int b) {
    return p.state_floats[size_t(a)] < p.state_floats[size_t(b)];
  };
  // Cuts item i along dim 0 into min(D, N) contiguous slices whose sizes differ by at most one;
  // slice j (in dim-0 order; the first D%k one larger) goes to the j-th rank of `by`'s order, or
  // to rank j when every rank gets an equal slice (the layout's scatter bucket).
  auto slice = [&](size_t i, const std::function<bool(int, int)>& by) {
    const Zero1Item& it = items[i];
    const int64_t D = it.shape[0], k = std::min<int64_t>(D, world), per = it.numel / D;
    const bool muon = it.kind == OwnedKind::Muon;
    const double mat_flops =
        muon ? newton_schulz_flops({it.shape[1], it.shape[2]}, it.muon_ns_steps) : 0.0;
    std::vector<int> order(static_cast<size_t>(world));
    std::iota(order.begin(), order.end(), 0);
    if (D % world != 0) std::stable_sort(order.begin(), order.end(), by);
    p.owner[i] = Zero1Plan::kSplit;
    p.slices[i].assign(size_t(world), Dim0Slice{});
    int64_t first = 0;
    for (int64_t j = 0; j < k; j++) {
      const int64_t count = D / k + (j < D % k ? 1 : 0);
      const int r = order[size_t(j)];
      p.slices[i][size_t(r)] = {first, count};
      p.state_floats[size_t(r)] += (muon ? 1 : 2) * count * per;
      p.segment_floats[size_t(r)] += count * per;
      if (muon) {
        p.ns_flops[size_t(r)] += double(count) * mat_flops;
        p.muon_matrices[size_t(r)] += count;
      }
      first += count;
    }
  };
  // Expert tensors first, the costliest first, balancing Newton–Schulz FLOPs.
  std::stable_sort(split.begin(), split.end(), [&](size_t a, size_t b) {
    return newton_schulz_flops(items[a].shape, items[a].muon_ns_steps) >
           newton_schulz_flops(items[b].shape, items[b].muon_ns_steps);
  });
  for (size_t i : split) slice(i, lighter);
  // Muon: largest Newton–Schulz cost first, to the rank with the least so far.
  std::vector<double> cost(items.size(), 0);
  for (size_t i : muon)
    cost[i] = group_sum(
        i, [](const Zero1Item& it) { return newton_schulz_flops(it.shape, it.muon_ns_steps); });
  std::stable_sort(muon.begin(), muon.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  for (size_t i : muon) {
    int best = 0;
    for (int r = 1; r < world; r++)
      if (lighter(r, best)) best = r;
    assign(i, best);
  }
  // The rest: largest state first, to the rank with the least state so far (Muon's included);
  // tensors without state (trained by nothing) balance the gradient elements instead.
  auto weight = [&](size_t i) {
    const double s = group_sum(i, [](const Zero1Item& it) { return double(state_floats(it)); });
    return s > 0 ? s : group_sum(i, [](const Zero1Item& it) { return double(it.numel); });
  };
  std::stable_sort(split_adamw.begin(), split_adamw.end(),
                   [&](size_t a, size_t b) { return weight(a) > weight(b); });
  for (size_t i : split_adamw) slice(i, less_state);
  std::stable_sort(rest.begin(), rest.end(),
                   [&](size_t a, size_t b) { return weight(a) > weight(b); });
  for (size_t i : rest) {
    const bool stateful =
        group_sum(i, [](const Zero1Item& it) { return double(state_floats(it)); }) > 0;
    int best = 0;
    for (int r = 1; r < world; r++) {
      const auto& load = stateful ? p.state_floats : p.segment_floats;
      if (load[size_t(r)] < load[size_t(best)]) best = r;
    }
    assign(i, best);
  }
  lay_out(p, items);
  return p;
}

std::vector<int> weight_writers(const Zero1Plan& plan) {
  std::vector<int> w(plan.owner.size(), 0);
  for (size_t i = 0; i < plan.owner.size(); i++) {
    const int owner = plan.owner[i];
    if (owner >= 0) {
      w[i] = owner;
    } else if (owner == Zero1Plan::kSplit) {
      int64_t best = -1;
      for (int r = 0; r < plan.world; r++)
        if (plan.slices[i][size_t(r)].count > best) {
          best = plan.slices[i][size_t(r)].count;
          w[i] = r;
        }
    }
  }
  return w;
}

std::vector<std::string> state_names(const Zero1Item& it) {
  if (it.kind == OwnedKind::Muon) return {"optim.muon.momentum." + it.name};
  if (it.kind == OwnedKind::AdamW)
    return {"optim.adamw.exp_avg." + it.name, "optim.adamw.exp_avg_sq." + it.name};
  return {};
}

std::vector<OwnedStatePiece> owned_state_pieces(const Zero1Plan& plan,
                                                const std::vector<Zero1Item>& items, int rank) {
  ZAYA_CHECK(plan.owner.size() == items.size(), "ZeRO-1: {} owners for {} tensors",
             plan.owner.size(), items.size());
  ZAYA_CHECK(rank >= 0 && rank < plan.world, "ZeRO-1: rank {} of a plan for {} ranks", rank,
             plan.world);
  std::vector<OwnedStatePiece> out;
  for (size_t i = 0; i < items.size(); i++) {
    std::vector<int64_t> offset(items[i].shape.size(), 0), shape = items[i].shape;
    if (plan.owner[i] == Zero1Plan::kSplit) {
      const Dim0Slice e = plan.slices[i][size_t(rank)];
      if (e.count == 0) continue;
      offset[0] = e.first;
      shape[0] = e.count;
    } else if (plan.owner[i] != rank) {
      continue;
    }
    const bool whole = plan.owner[i] == rank;
    for (std::string& nm : state_names(items[i]))
      out.push_back({std::move(nm), i, offset, shape, whole});
  }
  return out;
}

}  // namespace zaya
