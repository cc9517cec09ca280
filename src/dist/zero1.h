// ZeRO-1 ownership and the bucketed layout of the gradient reduce-scatter / weight all-gather.
//
// Ownership is by whole matrix, so Muon always sees a whole, fully reduced matrix (a matrix whose
// gradient straddles two ranks' contiguous shards, orthogonalised from a partly reduced gradient,
// cannot happen by construction). With split_slices, a 3-D Muon tensor [E, rows, cols] (E whole
// matrices) is cut along dim 0 into min(E, N) contiguous expert slices of sizes differing by at
// most one, the larger slices to the ranks with the least Newton–Schulz load, each rank at most
// one slice (so its part is one contiguous run). Then the other Muon tensors, longest-processing-
// time greedy on their Newton–Schulz FLOPs (largest first, to the least loaded rank; equal loads
// to the one with less state); then AdamW tensors whose state is above an eighth of a rank's
// share are sliced the same way (by rows, to the ranks with the least state), and the other AdamW
// (and untrained) tensors go LPT-greedy on optimizer-state floats, so that the state bytes per
// rank come out close to total / N. Tensors without a gradient (the balancing biases) are owned
// by no rank: every rank updates them identically from all-reduced routing counts.
//
// Layout: the plan places every tensor in the step's flat buffers (gradients and masters share
// it) so that the collectives run in place on them, with no packing copies. Bucket k is
// [start, start + world·chunk): rank r's chunk at start + r·chunk holds whole tensors that r owns
// (each one contiguous, 64-float aligned; the packed qkv matrix's parts adjacent), padded to the
// bucket's largest chunk, so a bucket is one reduce_scatter (recvcount = chunk) and one
// all_gather with the communicator's block layout. A split tensor is a bucket of its own: with
// equal slices on every rank, in rank order, a scatter bucket like the others; with unequal ones
// (dim 0 not a multiple of the world) a rooted bucket, one reduce and one broadcast per slice, to
// and from its owner (grouped, so NCCL runs them at once). A bucket of whole tensors whose chunks
// would be more than an eighth padding (many ranks owning few, unequal tensors) is rooted too,
// its ranks' parts back to back in rank order. Buckets take each rank's tensors in the order the
// backward completes them (last layer first), so they fill as the backward goes on.
// Tensors without a gradient follow the buckets. At one rank nothing is padded but alignment.
// Sharded checkpoints follow the plan: who writes each weight and which boxes of which optimizer
// state each rank stores (weight_writers, owned_state_pieces).
// Deliberately not here: moving bytes (engine/data_parallel_step.cpp); splitting a Muon matrix
// itself, or slicing along any dimension but the first.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace zaya {

enum class OwnedKind { Muon, AdamW, None, NoGrad };

struct Zero1Item {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  OwnedKind kind = OwnedKind::AdamW;
  int muon_ns_steps = 5;
  // Must sit right after the previous item in the flat buffers, owned with it (the k and v parts
  // of the packed qkv matrix the CUDA step multiplies as one).
  bool follows_previous = false;
};

// Alignment of every tensor start (but a follower's) in the packed layout, in floats (256 bytes).
constexpr int64_t kZero1AlignFloats = 64;

// Newton–Schulz FLOPs of one Muon update of a [.., rows, cols] tensor (E matrices for 3-D): per
// iteration A = XXᵀ, B = bA + cA², X = aX + BX on the m×n orientation with m = min(rows, cols).
double newton_schulz_flops(const std::vector<int64_t>& shape, int ns_steps);
// Optimizer-state floats of a tensor: 2·numel (AdamW), numel (Muon momentum), 0 otherwise.
int64_t state_floats(const Zero1Item& it);

// The dim-0 indices [first, first + count) of a tensor that one rank owns (count 0: none): the
// experts of a 3-D Muon tensor, the rows of an AdamW one.
struct Dim0Slice {
  int64_t first = 0, count = 0;
};

// One bucket of the layout (see above).
struct Zero1Bucket {
  int64_t start = 0;  // flat offset
  int64_t chunk = 0;  // scatter bucket: elements per rank (world·chunk in all)
  // Rooted bucket (a split tensor with unequal slices, or whole tensors whose chunks differ too
  // much): per rank {flat offset, elements} of its part (0 elements: none); empty for a scatter
  // bucket.
  std::vector<std::pair<int64_t, int64_t>> rooted;
  std::vector<size_t> items;          // the items with elements in it
  int64_t elements(int world) const;  // the extent in the flat buffers
};

struct Zero1Plan {
  static constexpr int kSplit = -2;
  int world = 1;
  std::vector<int> owner;  // per item; -1: owned by none (no gradient); kSplit: by dim-0 slices
  std::vector<std::vector<Dim0Slice>> slices;  // per item: per rank when kSplit, else empty
  std::vector<double> ns_flops;         // per rank: Newton–Schulz FLOPs of its Muon matrices
  std::vector<int64_t> state_floats;    // per rank: optimizer-state floats
  std::vector<int64_t> segment_floats;  // per rank: gradient elements it owns
  std::vector<int64_t> muon_matrices;   // per rank: matrices it orthogonalises per step
  int64_t bucket_elems = 1;
  // The layout: per item its offset in the step's flat buffers, the buffers' length, the buckets.
  std::vector<int64_t> offset;
  int64_t flat_numel = 1;
  std::vector<Zero1Bucket> bucket_list;
  int64_t buckets() const { return int64_t(bucket_list.size()); }
  int64_t padding(const std::vector<Zero1Item>& items) const;  // flat elements holding no tensor
  std::vector<bool> mask(int rank) const;  // owned[i] for this rank (all or part of item i)
  // Rank r's part of item i in elements of the tensor: {offset, length}; {0, 0} when none.
  std::pair<int64_t, int64_t> part(const std::vector<Zero1Item>& items, size_t i, int r) const;
  std::string describe(const std::vector<Zero1Item>& items) const;  // per-rank loads
};

// LPT-greedy ownership of `items` over `world` ranks (deterministic: ties go to the lower index
// and the lower rank; an item and its followers as one), and the layout. bucket_elems >= 1: a
// bucket's chunk grows by whole tensors up to it (a tensor larger than it is a chunk by itself).
// split_slices: expert tensors and big AdamW tensors by dim-0 slices (see above).
Zero1Plan plan_zero1(const std::vector<Zero1Item>& items, int world, int64_t bucket_elems,
                     bool split_slices = false);

// Sharded checkpoints (ckpt/sharded.h) under a plan, shared by the training step that writes and
// reads them and the offline tools that reshape them (`zaya ckpt reshard`):
// Which rank writes each item's weight: its owner when owned whole, the rank with the largest
// slice (the lowest such rank on a tie) when split, rank 0 for items no rank owns (balancing
// biases). Every rank holds every weight after the all-gather, so this only spreads the writing.
std::vector<int> weight_writers(const Zero1Plan& plan);
// The optimizer-state names of an item, as the one-process optimizer names them:
// optim.muon.momentum.<name> (Muon), optim.adamw.exp_avg.<name> and optim.adamw.exp_avg_sq.<name>
// (AdamW), none for the others.
std::vector<std::string> state_names(const Zero1Item& it);
// A box of an item's optimizer state that one rank owns: the whole tensor (offset 0, the item's
// shape) or its dim-0 slice (offset [first, 0, ...], shape [count, ...]).
struct OwnedStatePiece {
  std::string name;  // the state name (state_names)
  size_t item = 0;   // index into the items
  std::vector<int64_t> offset, shape;
  bool whole = false;  // owned whole (else a dim-0 slice)
};
// Rank r's pieces under the plan, in item order and, per item, state_names order. The balancing
// state (every rank holds it alike; rank 0 stores it) is not the plan's and is not among them.
std::vector<OwnedStatePiece> owned_state_pieces(const Zero1Plan& plan,
                                                const std::vector<Zero1Item>& items, int rank);

}  // namespace zaya
