// ZeRO-1 ownership and the bucketed layout of the gradient reduce-scatter / weight all-gather.
//
// Ownership is by whole tensor, so Muon always sees a whole, fully reduced matrix (a matrix whose
// gradient straddles two ranks' contiguous shards, orthogonalised from a partly reduced gradient,
// cannot happen by construction). Muon tensors are assigned first, longest-processing-time greedy
// on their Newton–Schulz FLOPs (largest first, to the least loaded rank); then AdamW (and
// untrained) tensors, LPT-greedy on optimizer-state floats, so that the state bytes per rank come
// out close to total / N. Tensors without a gradient (the balancing biases) are owned by no rank:
// every rank updates them identically from all-reduced routing counts.
//
// Layout: rank r's segment is its owned tensors' elements in layout order, padded to the longest
// segment `seg`; the packed buffer is `buckets` buckets, bucket k holding chunk k (bucket_elems
// elements, the last one shorter) of every rank's segment in rank order, so each bucket is one
// reduce_scatter (recvcount = chunk) and one all_gather with the communicator's block layout.
// Deliberately not here: moving bytes (engine/data_parallel_step.cpp) or splitting a 3-D expert
// tensor between ranks (its E matrices stay with one owner).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zaya {

enum class OwnedKind { Muon, AdamW, None, NoGrad };

struct Zero1Item {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  OwnedKind kind = OwnedKind::AdamW;
  int muon_ns_steps = 5;
};

// Newton–Schulz FLOPs of one Muon update of a [.., rows, cols] tensor (E matrices for 3-D): per
// iteration A = XXᵀ, B = bA + cA², X = aX + BX on the m×n orientation with m = min(rows, cols).
double newton_schulz_flops(const std::vector<int64_t>& shape, int ns_steps);
// Optimizer-state floats of a tensor: 2·numel (AdamW), numel (Muon momentum), 0 otherwise.
int64_t state_floats(const Zero1Item& it);

struct Zero1Plan {
  int world = 1;
  std::vector<int> owner;               // per item; -1: owned by none (no gradient)
  std::vector<double> ns_flops;         // per rank: Newton–Schulz FLOPs of its Muon matrices
  std::vector<int64_t> state_floats;    // per rank: optimizer-state floats
  std::vector<int64_t> segment_floats;  // per rank: gradient elements it owns
  std::vector<int64_t> muon_matrices;   // per rank: matrices it orthogonalises per step
  int64_t seg = 1;                      // the padded segment length (max over ranks, >= 1)
  int64_t bucket_elems = 1;
  int64_t buckets() const { return (seg + bucket_elems - 1) / bucket_elems; }
  int64_t chunk(int64_t k) const { return std::min(bucket_elems, seg - k * bucket_elems); }
  // Where element j of a rank's segment sits in the packed buffer of world·seg elements.
  int64_t packed_offset(int rank, int64_t j) const {
    const int64_t k = j / bucket_elems;
    return int64_t(world) * k * bucket_elems + int64_t(rank) * chunk(k) + (j - k * bucket_elems);
  }
  std::vector<bool> mask(int rank) const;  // owned[i] for this rank
  std::string describe(const std::vector<Zero1Item>& items) const;  // per-rank loads
};

// LPT-greedy ownership of `items` over `world` ranks (deterministic: ties go to the lower index
// and the lower rank). bucket_elems >= 1.
Zero1Plan plan_zero1(const std::vector<Zero1Item>& items, int world, int64_t bucket_elems);

// A contiguous run of one owned tensor inside a rank's segment.
struct SegmentPiece {
  int64_t flat_offset = 0;  // in the step's flat buffers
  int64_t seg_offset = 0;   // in the rank's segment
  int64_t len = 0;
};
// Rank r's owned tensors in layout order; flat_offsets[i] is item i's offset in the flat buffers.
std::vector<SegmentPiece> segment_pieces(const Zero1Plan& plan, const std::vector<Zero1Item>& items,
                                         const std::vector<int64_t>& flat_offsets, int rank);
// Calls fn(packed_offset, flat_offset, len) for the parts of `p` of rank r, split at bucket ends.
void for_each_packed_run(const Zero1Plan& plan, int rank, const SegmentPiece& p,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn);

}  // namespace zaya
