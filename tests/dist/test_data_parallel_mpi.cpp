// ZeRO-1 data parallelism against one process, under `mpirun -np N zaya_tests
// --gtest_filter='DataParallelMpi.*'` (tests/cli/train_dp_mpi.sh runs N = 2, 3, 4; a plain run
// skips these). Every rank builds the same tiny model twice: a DataParallelStep over the world
// communicator and a one-process reference step. Each step, rank r's gradients are values k/64
// (|k| <= 64) whose sum over any N <= 4 ranks is exact in fp32, whatever order the reduce-scatter
// adds them in, and the reference gets that sum: so the distributed update must equal the
// one-process update bit for bit. That rules out a Muon matrix whose gradient straddles two
// ranks' contiguous shards being orthogonalised from a partly reduced gradient (the test checks
// that such matrices exist under contiguous sharding and that buckets split tensors), and a
// matrix orthogonalised twice or never (counted every step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "engine/data_parallel_step.h"
#include "engine/train_step.h"
#include "optim/param_rules.h"

namespace zaya {
namespace {

float grad_value(int rank, int step, size_t slot, int64_t e) {
  const uint64_t h = (uint64_t(rank) * 1000003u + uint64_t(step) * 7919u + slot * 104729u +
                      uint64_t(e) * 2654435761u) %
                     129u;
  return float(int(h) - 64) / 64.0f;
}

uint64_t fnv1a(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

int64_t optim_state_bytes(const NamedTensors& st) {
  int64_t b = 0;
  for (auto& [n, t] : st)
    if (n.rfind("optim.", 0) == 0) b += t.numel() * 4;
  return b;
}

TEST(DataParallelMpi, ZeroOneMatchesOneProcessBitForBit) {
  if (detect_launch().world < 2) GTEST_SKIP() << "run under mpirun -np N (N >= 2)";
  auto comm = make_world_communicator("mpi");
  const int N = comm->size(), R = comm->rank();
  ZayaConfig cfg = ZayaConfig::preset("tiny");
  OptimizerSettings os;
  BalancingSettings bs;
  ZayaModel mdp = ZayaModel::init(cfg, 7), mref = ZayaModel::init(cfg, 7);
  TrainStepOptions so;
  const int64_t bucket = 3000;  // small: many buckets, tensors split across bucket ends
  auto dp = make_data_parallel_step(mdp, os, bs, so, *comm, *comm, bucket);
  auto ref = make_train_step(mref, os, bs, so);
  const auto& lay = ref->layout();
  const auto& dlay = dp->layout();  // the plan's in-place layout
  const Zero1Plan& plan = dp->plan();
  EXPECT_GT(plan.buckets(), 1);
  // Both kinds of bucket are exercised: reduce-scatter / all-gather chunks, and rooted reduces /
  // broadcasts (uneven expert slices, or whole tensors too unequal to pad).
  int64_t rooted = 0;
  for (const Zero1Bucket& b : plan.bucket_list) rooted += !b.rooted.empty();
  EXPECT_GT(rooted, 0);
  EXPECT_LT(rooted, plan.buckets());

  // Under contiguous sharding of the flat buffer some Muon matrix would straddle two shards.
  const int64_t total = ref->grads().numel, shard = (total + N - 1) / N;
  int straddling = 0;
  for (size_t i = 0; i < lay.size(); i++)
    if (dp->items()[i].kind == OwnedKind::Muon &&
        lay[i].offset / shard != (lay[i].offset + lay[i].numel - 1) / shard)
      straddling++;
  EXPECT_GT(straddling, 0) << "no Muon tensor straddles a contiguous shard boundary";

  // Optimizer state per rank: only what the rank owns, ≈ total / N.
  const int64_t total_state = optim_state_bytes(ref->state());
  double mine = double(dp->memory().optimizer_state), sum = mine, mx = mine;
  comm->host_all_reduce(&sum, 1, RedOp::Sum);
  comm->host_all_reduce(&mx, 1, RedOp::Max);
  EXPECT_EQ(int64_t(sum), total_state);
  // Expert tensors split by expert (a whole one is ~40% of a tiny 4-rank share) and the embedding
  // by rows (alone ~30% of a 4-rank share): LPT lands within a few per cent of total/N.
  int64_t split = 0;
  for (int o : plan.owner) split += o == Zero1Plan::kSplit;
  EXPECT_GT(split, 0) << "no expert tensor was split";
  EXPECT_LE(mx, 1.02 * double(total_state) / N) << "optimizer state per rank far above total/N";
  if (R == 0)
    std::printf(
        "ZeRO-1 over %d ranks: optimizer state %lld bytes in all, at most %.0f per rank "
        "(total/N = %.0f, %+.2f%%)\n",
        N, (long long)total_state, mx, double(total_state) / N,
        100.0 * (mx * N / double(total_state) - 1));
  if (R == 0) std::printf("%s", plan.describe(dp->items()).c_str());

  int64_t muon_total = 0;
  for (int r = 0; r < N; r++) muon_total += plan.muon_matrices[size_t(r)];
  std::vector<std::vector<int64_t>> counts;
  for (auto& s : lay)
    if (is_balancing_bias(s.name))
      counts.push_back(std::vector<int64_t>(size_t(cfg.num_experts + 1)));

  for (int step = 0; step < 4; step++) {
    dp->zero_grads();
    ref->zero_grads();
    FlatBuffer g = dp->grads(), gr = ref->grads();
    for (size_t i = 0; i < lay.size(); i++) {
      if (!lay[i].has_grad) continue;
      for (int64_t e = 0; e < lay[i].numel; e++) {
        g.data[dlay[i].offset + e] = grad_value(R, step, i, e);
        float s = 0;
        for (int r = 0; r < N; r++) s += grad_value(r, step, i, e);
        gr.data[lay[i].offset + e] = s;
      }
    }
    const double sq = dp->grad_sq_norm(), sqr = ref->grad_sq_norm();
    EXPECT_NEAR(sq, sqr, 1e-12 * sqr);
    dp->optimizer_step(1e-2, 1.0f);
    ref->optimizer_step(1e-2, 1.0f);
    // Every Muon matrix orthogonalised exactly once: each rank its own, the sum all of them.
    double ns = double(dp->muon_matrices_last_step());
    EXPECT_EQ(int64_t(ns), plan.muon_matrices[size_t(R)]);
    comm->host_all_reduce(&ns, 1, RedOp::Sum);
    EXPECT_EQ(int64_t(ns), muon_total);
    EXPECT_EQ(int64_t(ns), ref->muon_matrices_last_step());
    for (size_t l = 0; l < counts.size(); l++)
      for (size_t e = 0; e < counts[l].size(); e++)
        counts[l][e] = int64_t((l * 7 + e * 13 + step) % 11);
    dp->update_balancing(counts);
    ref->update_balancing(counts);
    // Balancing biases identical on every rank (hash gathered from all).
    uint64_t h = 1469598103934665603ull;
    FlatBuffer m = dp->masters();
    for (auto& s : dlay)
      if (!s.has_grad) h = fnv1a(m.data + s.offset, size_t(s.numel) * 4, h);
    auto all = comm->host_all_gather(std::to_string(h));
    for (auto& x : all)
      EXPECT_EQ(x, all[0]) << "balancing biases differ between ranks at step " << step;
    // Weights bit for bit equal to the one-process update.
    FlatBuffer mr = ref->masters();
    int64_t differ = 0;
    for (size_t i = 0; i < lay.size(); i++)
      differ += std::memcmp(m.data + dlay[i].offset, mr.data + lay[i].offset,
                            size_t(lay[i].numel) * 4) != 0;
    EXPECT_EQ(differ, 0) << "rank " << R << ": " << differ << " tensors differ at step " << step;
  }
  // The gathered checkpoint state (rank 0) is the one-process state, bit for bit.
  NamedTensors st = dp->state();
  if (R == 0) {
    NamedTensors want = ref->state();
    ASSERT_EQ(st.size(), want.size());
    for (size_t i = 0; i < st.size(); i++) {
      EXPECT_EQ(st[i].first, want[i].first);
      EXPECT_EQ(
          std::memcmp(st[i].second.f32(), want[i].second.f32(), size_t(want[i].second.numel()) * 4),
          0)
          << st[i].first;
    }
  } else {
    EXPECT_TRUE(st.empty());
  }
  // load_state keeps each rank's own tensors and slices: loading the one-process state into a
  // fresh step and gathering it again gives it back bit for bit.
  ZayaModel m2 = ZayaModel::init(cfg, 8);
  auto dp2 = make_data_parallel_step(m2, os, bs, so, *comm, *comm, bucket);
  const NamedTensors want = ref->state();
  dp2->load_state(want, ref->optimizer_steps(), ref->balancing_steps());
  NamedTensors back = dp2->state();
  if (R == 0) {
    ASSERT_EQ(back.size(), want.size());
    for (size_t i = 0; i < back.size(); i++)
      EXPECT_EQ(std::memcmp(back[i].second.f32(), want[i].second.f32(),
                            size_t(want[i].second.numel()) * 4),
                0)
          << back[i].first;
  }
}

// Overlap: buckets started during the last micro-batch's backward, as the layers they hold are
// done, give the same bits as every bucket reduced after the backward; that fails if a bucket were
// packed before the backward had finished writing any of its gradients (a layer reported done too
// early). Real forward_backward on rank-specific tokens, two micro-batches per step (the first
// one's backward must not start anything), small buckets so that most start inside the backward.
TEST(DataParallelMpi, OverlappedReductionMatchesDeferredBitForBit) {
  if (detect_launch().world < 2) GTEST_SKIP() << "run under mpirun -np N (N >= 2)";
  auto comm = make_world_communicator("mpi");
  const int N = comm->size(), R = comm->rank();
  ZayaConfig cfg = ZayaConfig::preset("tiny");
  OptimizerSettings os;
  BalancingSettings bs;
  ZayaModel ma = ZayaModel::init(cfg, 11), mb = ZayaModel::init(cfg, 11);
  TrainStepOptions so;
  const int64_t bucket = 2000;
  auto over = make_data_parallel_step(ma, os, bs, so, *comm, *comm, bucket, true);
  auto after = make_data_parallel_step(mb, os, bs, so, *comm, *comm, bucket, false);
  const Zero1Plan& plan = over->plan();
  const auto& lay = over->layout();
  ASSERT_GT(plan.buckets(), 4);
  std::vector<std::vector<int64_t>> counts;
  for (auto& sl : lay)
    if (is_balancing_bias(sl.name))
      counts.push_back(std::vector<int64_t>(size_t(cfg.num_experts + 1)));
  const int64_t B = 2, S = 16, micro = 2;
  std::vector<int32_t> ids(size_t(B * S)), tgt(size_t(B * S));
  for (int step = 0; step < 3; step++) {
    for (auto* d : {over.get(), after.get()}) {
      d->zero_grads();
      d->begin_accumulation(micro);
    }
    for (int64_t m = 0; m < micro; m++) {
      for (int64_t i = 0; i < B * S; i++) {
        ids[size_t(i)] = int32_t((uint64_t(R) * 7919u + uint64_t(step) * 104729u +
                                  uint64_t(m) * 15485863u + uint64_t(i) * 2654435761u) %
                                 uint64_t(cfg.vocab_size));
        tgt[size_t(i)] = i % 7 == 3 ? -1 : ids[size_t((i * 5 + 1) % (B * S))];
      }
      const float scale = 1.0f / float(micro * N);
      const StepStats a = over->forward_backward(ids.data(), tgt.data(), B, S, scale);
      const StepStats b = after->forward_backward(ids.data(), tgt.data(), B, S, scale);
      EXPECT_EQ(a.loss, b.loss) << "step " << step << " micro-batch " << m;
    }
    const double sa = over->grad_sq_norm(), sb = after->grad_sq_norm();
    EXPECT_EQ(sa, sb) << "step " << step;
    // Most buckets started inside the backward (those holding the embedding or the final norm
    // wait for its end); none without overlap; every bucket reduced once either way.
    const int64_t early = over->last_times().buckets_in_backward;
    EXPECT_GT(early, plan.buckets() / 2) << "of " << plan.buckets() << " buckets";
    EXPECT_LT(early, plan.buckets());
    EXPECT_EQ(after->last_times().buckets_in_backward, 0);
    EXPECT_EQ(over->reduce_scatters(), after->reduce_scatters());
    EXPECT_EQ(over->reduce_scatters(), int64_t(step + 1) * plan.buckets());
    if (R == 0 && step == 0)
      std::printf("overlap over %d ranks: %lld of %lld buckets started inside the backward\n", N,
                  (long long)early, (long long)plan.buckets());
    const float clip = float(1.0 / std::max(1.0, std::sqrt(sa)));
    over->optimizer_step(1e-3, clip);
    after->optimizer_step(1e-3, clip);
    for (size_t l = 0; l < counts.size(); l++)
      for (size_t e = 0; e < counts[l].size(); e++)
        counts[l][e] = int64_t((l * 5 + e * 3 + step) % 7);
    over->update_balancing(counts);
    after->update_balancing(counts);
    const FlatBuffer wa = over->masters(), wb = after->masters();
    int64_t differ = 0;
    for (auto& sl : lay)
      differ += std::memcmp(wa.data + sl.offset, wb.data + sl.offset, size_t(sl.numel) * 4) != 0;
    EXPECT_EQ(differ, 0) << "rank " << R << ": " << differ << " tensors differ at step " << step;
  }
  // More micro-batches than announced once buckets have started: refused, not silently wrong.
  over->zero_grads();
  over->begin_accumulation(1);
  over->forward_backward(ids.data(), tgt.data(), B, S, 1.0f);
  EXPECT_THROW(over->forward_backward(ids.data(), tgt.data(), B, S, 1.0f), Error);
}

// The LPT plan on its own, with and without dim-0 slices: every element of a tensor with a
// gradient has one owner, none twice (so every matrix is owned exactly once, and a split tensor's
// slices are whole experts or rows, at most one per rank); the in-place layout puts every tensor
// in the flat buffers once, and its buckets cover every element with a gradient exactly once, in
// its owner's part.
TEST(DataParallelMpi, PlanCoversEveryTensorOnce) {
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 1);
  auto items = zero1_items(m, OptimizerSettings{});
  for (int world : {1, 2, 3, 4, 7, 16})
    for (bool split : {false, true}) {
      Zero1Plan p = plan_zero1(items, world, 1000, split);
      int64_t matrices = 0, want_matrices = 0;
      for (int r = 0; r < world; r++) matrices += p.muon_matrices[size_t(r)];
      for (size_t i = 0; i < items.size(); i++) {
        if (items[i].kind == OwnedKind::Muon)
          want_matrices += items[i].shape.size() == 3 ? items[i].shape[0] : 1;
        if (p.owner[i] != Zero1Plan::kSplit) continue;
        EXPECT_TRUE(split && world > 1);
        int64_t experts = 0, holders = 0;
        for (const Dim0Slice& e : p.slices[i]) {
          experts += e.count;
          holders += e.count > 0;
        }
        EXPECT_EQ(experts, items[i].shape[0]) << items[i].name;
        EXPECT_EQ(holders, std::min<int64_t>(world, items[i].shape[0])) << items[i].name;
      }
      EXPECT_EQ(matrices, want_matrices) << world;
      // The layout: tensors inside the flat buffers, aligned (the qkv parts back to back with
      // their predecessor and its owner), none overlapping.
      ASSERT_EQ(p.offset.size(), items.size());
      std::vector<int> tensor_at(size_t(p.flat_numel), -1);
      for (size_t i = 0; i < items.size(); i++) {
        ASSERT_GE(p.offset[i], 0) << items[i].name;
        ASSERT_LE(p.offset[i] + items[i].numel, p.flat_numel) << items[i].name;
        if (items[i].follows_previous) {
          EXPECT_EQ(p.offset[i], p.offset[i - 1] + items[i - 1].numel) << items[i].name;
          EXPECT_EQ(p.owner[i], p.owner[i - 1]) << items[i].name;
        } else {
          EXPECT_EQ(p.offset[i] % kZero1AlignFloats, 0) << items[i].name;
        }
        for (int64_t k = 0; k < items[i].numel; k++) {
          ASSERT_EQ(tensor_at[size_t(p.offset[i] + k)], -1) << items[i].name << " overlaps";
          tensor_at[size_t(p.offset[i] + k)] = int(i);
        }
      }
      // The buckets: disjoint ranges; in each, rank r's chunk (or rooted slice) holds only
      // elements that r owns, and together they hold every element with a gradient exactly once.
      std::vector<int> covered(size_t(p.flat_numel), 0);
      auto visit = [&](int r, int64_t off, int64_t n, int64_t bucket) {
        for (int64_t k = off; k < off + n; k++) {
          covered[size_t(k)]++;
          const int i = tensor_at[size_t(k)];
          if (i < 0) continue;  // padding
          const auto [first, len] = p.part(items, size_t(i), r);
          const int64_t e = k - p.offset[size_t(i)];
          ASSERT_TRUE(e >= first && e < first + len)
              << items[size_t(i)].name << " element " << e << " in rank " << r
              << "'s part of bucket " << bucket << ", world " << world;
        }
      };
      for (int64_t b = 0; b < p.buckets(); b++) {
        const Zero1Bucket& bk = p.bucket_list[size_t(b)];
        if (bk.rooted.empty()) {
          EXPECT_EQ(bk.start % kZero1AlignFloats, 0);
          for (int r = 0; r < world; r++) visit(r, bk.start + r * bk.chunk, bk.chunk, b);
        } else {
          EXPECT_GT(world, 1) << "a rooted bucket at one rank";
          ASSERT_EQ(bk.rooted.size(), size_t(world));
          for (int r = 0; r < world; r++)
            visit(r, bk.rooted[size_t(r)].first, bk.rooted[size_t(r)].second, b);
        }
      }
      int64_t used = 0;
      for (size_t i = 0; i < items.size(); i++) {
        EXPECT_EQ(p.owner[i] == -1, items[i].kind == OwnedKind::NoGrad) << items[i].name;
        used += items[i].numel;
        for (int64_t k = 0; k < items[i].numel; k++)
          ASSERT_EQ(covered[size_t(p.offset[i] + k)], p.owner[i] == -1 ? 0 : 1)
              << items[i].name << " element " << k << ", world " << world;
      }
      for (int x : covered) ASSERT_LE(x, 1) << "two buckets overlap, world " << world;
      EXPECT_EQ(p.padding(items), p.flat_numel - used);
      // One rank: nothing padded but each tensor's alignment.
      if (world == 1) EXPECT_LT(p.padding(items), int64_t(items.size()) * kZero1AlignFloats);
      if (split && world == 4) {
        // Equal expert slices on every rank (E = 4k) are in rank order: scatter buckets.
        for (size_t i = 0; i < items.size(); i++)
          if (p.owner[i] == Zero1Plan::kSplit && items[i].shape[0] % world == 0)
            for (int r = 0; r < world; r++)
              EXPECT_EQ(p.slices[i][size_t(r)].first, r * items[i].shape[0] / world)
                  << items[i].name;
      }
      if (split && world > 1 && (world == 4 || world == 2))
        std::printf(
            "plan at world %d: %lld buckets (%lld rooted), padding %.1f%% of %lld flat "
            "elements\n",
            world, (long long)p.buckets(),
            (long long)std::count_if(p.bucket_list.begin(), p.bucket_list.end(),
                                     [](const Zero1Bucket& b) { return !b.rooted.empty(); }),
            100.0 * double(p.padding(items)) / double(p.flat_numel), (long long)p.flat_numel);
    }
}

// The checkpoint layout under a plan: every rank's owned_state_pieces together tile each item's
// state tensors exactly once (whole pieces only from the owner, slices where the plan split), and
// weight_writers names the owner, the holder of the largest slice, or rank 0 for unowned items.
TEST(Zero1Checkpoint, StatePiecesTileEveryTensorAndWritersOwnTheirWeight) {
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 1);
  auto items = zero1_items(m, OptimizerSettings{});
  for (int world : {1, 2, 3, 4, 7})
    for (bool split : {false, true}) {
      const Zero1Plan p = plan_zero1(items, world, 1000, split);
      // hits[name][element]: how many ranks' pieces cover it.
      std::map<std::string, std::vector<int>> hits;
      for (int r = 0; r < world; r++)
        for (const OwnedStatePiece& piece : owned_state_pieces(p, items, r)) {
          const Zero1Item& it = items[piece.item];
          EXPECT_EQ(piece.whole, p.owner[piece.item] == r) << piece.name;
          EXPECT_EQ(piece.name.substr(piece.name.size() - it.name.size()), it.name);
          auto& h = hits[piece.name];
          h.resize(size_t(it.numel));
          const int64_t row = it.numel / it.shape[0];
          for (size_t d = 1; d < it.shape.size(); d++) {
            EXPECT_EQ(piece.offset[d], 0);
            EXPECT_EQ(piece.shape[d], it.shape[d]);
          }
          for (int64_t k = piece.offset[0] * row; k < (piece.offset[0] + piece.shape[0]) * row; k++)
            h[size_t(k)]++;
        }
      std::set<std::string> want;
      for (const Zero1Item& it : items)
        for (const std::string& nm : state_names(it)) want.insert(nm);
      std::set<std::string> got;
      for (const auto& [name, h] : hits) {
        got.insert(name);
        for (size_t k = 0; k < h.size(); k++) ASSERT_EQ(h[k], 1) << name << " element " << k;
      }
      EXPECT_EQ(got, want) << "world " << world;
      const std::vector<int> w = weight_writers(p);
      for (size_t i = 0; i < items.size(); i++) {
        if (p.owner[i] >= 0) {
          EXPECT_EQ(w[i], p.owner[i]) << items[i].name;
        } else if (p.owner[i] == Zero1Plan::kSplit) {
          for (int r = 0; r < world; r++)
            EXPECT_GE(p.slices[i][size_t(w[i])].count, p.slices[i][size_t(r)].count);
        } else {
          EXPECT_EQ(w[i], 0) << items[i].name;
        }
      }
    }
}

// The layer a parameter's gradient completes with (the overlap's bucket readiness).
TEST(DataParallelMpi, LayerOfParamReadsTheLayerIndex) {
  EXPECT_EQ(layer_of_param("model.layers.0.self_attn.qkv.weight"), 0);
  EXPECT_EQ(layer_of_param("model.layers.39.zaya_block.experts.w1"), 39);
  EXPECT_EQ(layer_of_param("model.embed_tokens.weight"), -1);
  EXPECT_EQ(layer_of_param("model.final_norm.weight"), -1);
  EXPECT_EQ(layer_of_param("model.layers.x.weight"), -1);
  EXPECT_EQ(layer_of_param("model.layers.7"), -1);
  EXPECT_EQ(layer_of_param("model.layers."), -1);
  // Every tiny-model tensor is either in a layer below the layer count or one of the others.
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 1);
  int64_t in_layers = 0;
  for (auto& [name, t] : m.tensor_slots()) {
    const int64_t l = layer_of_param(name);
    EXPECT_LT(l, m.cfg.num_hidden_layers) << name;
    in_layers += l >= 0;
  }
  EXPECT_GT(in_layers, 0);
}

// Ranks on one host that disagree on the GPUs they see are refused, naming host, counts and
// ranks; the same count on every host (different hosts may differ) is accepted.
TEST(DataParallelMpi, MixedGpuCountsPerNodeAreRefused) {
  EXPECT_NO_THROW(check_gpus_per_node({"a", "a", "b", "b"}, {8, 8, 4, 4}));
  EXPECT_NO_THROW(check_gpus_per_node({}, {}));
  try {
    check_gpus_per_node({"a", "b", "a", "a"}, {2, 1, 2, 1});
    FAIL() << "mixed counts on host a accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mixed GPU counts on host a: 1 GPU(s) for rank(s) 3; "
                                         "2 GPU(s) for rank(s) 0,2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(check_gpus_per_node({"a"}, {1, 1}), Error);
}

}  // namespace
}  // namespace zaya
