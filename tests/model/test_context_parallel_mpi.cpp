// Context parallelism of the CPU training forward/backward against one process, under `mpirun -np
// C zaya_tests --gtest_filter='ContextParallelMpi.*'` (tests/cli/train_cp_mpi.sh runs C = 2, 3, 4;
// a plain run skips these). Every rank computes the whole sequences alone (the reference) and its
// two chunks as a member of the C-rank group; the group's gradients summed must equal the
// reference's within fp32 reduction-order noise, and the loss shares must add up to its loss.
// The data are packed documents (an end-of-document id between them) with one-token documents
// right at chunk boundaries and a few ignored targets. A negative control drops the halo
// gradients (a detached halo) and must fail the same comparison.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "model/backward.h"

namespace zaya {
namespace {

struct Sample {
  std::vector<int32_t> ids, targets;
};

// B rows of S tokens: documents of random lengths separated by the end-of-document id, a
// one-token document at every chunk boundary (chunks of S / (2C) tokens), a few ignored targets.
Sample packed_rows(const ZayaConfig& cfg, int64_t B, int64_t S, int64_t chunk, uint64_t seed) {
  Rng rng(seed);
  const int32_t eos = int32_t(cfg.eos_token_id), V = int32_t(cfg.vocab_size);
  Sample s;
  s.ids.resize(size_t(B * S));
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < S; t++) {
      int32_t v = int32_t(rng.next_u32() % uint32_t(V));
      if (v == eos) v = (v + 1) % V;
      if (rng.next_u32() % 7 == 0) v = eos;  // documents end at random
      // ... and exactly at chunk boundaries: "eos X eos" around the boundary puts the one-token
      // document X first in its chunk.
      if (t % chunk == chunk - 1 || t % chunk == 1) v = eos;
      s.ids[size_t(b * S + t)] = v;
    }
  s.targets.resize(s.ids.size());
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < S; t++) {
      const bool last = t + 1 == S;
      s.targets[size_t(b * S + t)] = last ? -1 : s.ids[size_t(b * S + t + 1)];
      if (!last && rng.next_u32() % 11 == 0) s.targets[size_t(b * S + t)] = -1;
    }
  return s;
}

struct Comparison {
  double max_rel = 0;  // max over tensors of max|cp − ref| / max|ref|
  std::string worst;
};

Comparison compare(const ModelGrads& cp, const ModelGrads& ref) {
  Comparison c;
  for (size_t i = 0; i < ref.tensors.size(); i++) {
    const Tensor& a = cp.tensors[i].second;
    const Tensor& b = ref.tensors[i].second;
    double diff = 0, scale = 0;
    for (int64_t e = 0; e < b.numel(); e++) {
      diff = std::max(diff, double(std::fabs(a.f32()[e] - b.f32()[e])));
      scale = std::max(scale, double(std::fabs(b.f32()[e])));
    }
    const double rel = scale > 0 ? diff / scale : diff;
    if (rel > c.max_rel) {
      c.max_rel = rel;
      c.worst = ref.tensors[i].first;
    }
  }
  return c;
}

// The group's gradients summed onto every rank.
void sum_over(Communicator& comm, ModelGrads& g) {
  for (auto& [name, t] : g.tensors)
    comm.all_reduce(t.f32(), t.f32(), size_t(t.numel()), DType::F32, RedOp::Sum);
}

ZayaConfig cp_config() {
  ZayaConfig cfg = ZayaConfig::preset("tiny");
  cfg.num_hidden_layers = 2;  // the EDA chain over layers, and still quick
  return cfg;
}

constexpr int64_t kB = 2, kS = 24;  // 24 = 2·C·L for C = 2, 3, 4 (L = 6, 4, 3)
// fp32 reduction-order noise of gradients summed over C ranks instead of one pass (measured
// ≤ 2e-6 relative to each tensor's largest entry for C = 2, 3, 4; the detached halo is > 1e-2).
constexpr double kGradTol = 2e-5;

TEST(ContextParallelMpi, GradientsAndLossMatchOneProcess) {
  if (detect_launch().world < 2) GTEST_SKIP() << "run under mpirun -np C (C >= 2)";
  auto comm = make_world_communicator("mpi");
  const int C = comm->size();
  const ZayaConfig cfg = cp_config();
  const ZayaModel m = ZayaModel::init(cfg, 11);
  const Sample s = packed_rows(cfg, kB, kS, kS / (2 * C), 5);

  ModelGrads ref = make_grads(m);
  const StepStats sr = forward_backward(m, s.ids.data(), s.targets.data(), kB, kS, ref, 0.5f);
  ModelGrads g = make_grads(m);
  ContextParallel cp;
  cp.comm = comm.get();
  const StepStats sc = forward_backward(m, s.ids.data(), s.targets.data(), kB, kS, g, 0.5f, &cp);

  double parts[2] = {sc.loss, double(sc.tokens)};
  comm->host_all_reduce(parts, 2, RedOp::Sum);
  EXPECT_NEAR(parts[0], sr.loss, 1e-6 * sr.loss) << "C = " << C;
  EXPECT_EQ(int64_t(parts[1]), sr.tokens);
  // Routing decisions per token are the same; summed over the group they are the reference's.
  for (size_t l = 0; l < sr.routed.size(); l++)
    for (size_t e = 0; e < sr.routed[l].size(); e++) {
      double n = double(sc.routed[l][e]);
      comm->host_all_reduce(&n, 1, RedOp::Sum);
      EXPECT_EQ(int64_t(n), sr.routed[l][e]) << "layer " << l << " class " << e;
    }
  sum_over(*comm, g);
  const Comparison c = compare(g, ref);
  EXPECT_LE(c.max_rel, kGradTol) << "C = " << C << ": worst tensor " << c.worst;
  if (comm->rank() == 0)
    std::printf("[ context parallel C=%d ] loss %.9g vs %.9g, max gradient rel diff %.3g (%s)\n", C,
                parts[0], sr.loss, c.max_rel, c.worst.c_str());

  // Bit-identical repeats.
  ModelGrads g2 = make_grads(m);
  const StepStats sc2 = forward_backward(m, s.ids.data(), s.targets.data(), kB, kS, g2, 0.5f, &cp);
  sum_over(*comm, g2);
  EXPECT_EQ(sc2.loss, sc.loss);
  EXPECT_EQ(compare(g2, g).max_rel, 0.0);
}

TEST(ContextParallelMpi, DetachedHaloFails) {
  if (detect_launch().world < 2) GTEST_SKIP() << "run under mpirun -np C (C >= 2)";
  auto comm = make_world_communicator("mpi");
  const int C = comm->size();
  const ZayaConfig cfg = cp_config();
  const ZayaModel m = ZayaModel::init(cfg, 11);
  const Sample s = packed_rows(cfg, kB, kS, kS / (2 * C), 6);
  ModelGrads ref = make_grads(m);
  forward_backward(m, s.ids.data(), s.targets.data(), kB, kS, ref);
  ModelGrads g = make_grads(m);
  ContextParallel cp;
  cp.comm = comm.get();
  cp.send_halo_grads = false;
  forward_backward(m, s.ids.data(), s.targets.data(), kB, kS, g, 1.0f, &cp);
  sum_over(*comm, g);
  const Comparison c = compare(g, ref);
  EXPECT_GT(c.max_rel, 100 * kGradTol) << "dropping the halo gradients went unnoticed";
  if (comm->rank() == 0)
    std::printf("[ context parallel C=%d ] detached halo: max gradient rel diff %.3g (%s)\n", C,
                c.max_rel, c.worst.c_str());
}

TEST(ContextParallelMpi, RefusesIndivisibleSequences) {
  if (detect_launch().world < 2) GTEST_SKIP() << "run under mpirun -np C (C >= 2)";
  auto comm = make_world_communicator("mpi");
  const int C = comm->size();
  const ZayaModel m = ZayaModel::init(cp_config(), 11);
  ContextParallel cp;
  cp.comm = comm.get();
  const int64_t S = 2 * C * 3 + 1;
  std::vector<int32_t> ids(size_t(S), 2), tg(size_t(S), 3);
  ModelGrads g = make_grads(m);
  try {
    forward_backward(m, ids.data(), tg.data(), 1, S, g, 1.0f, &cp);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by 2·cp"), std::string::npos) << e.what();
  }
  // Chunks shorter than the convolutions' history (2 tokens): S = 2C.
  std::vector<int32_t> ids2(size_t(2 * C), 2), tg2(size_t(2 * C), 3);
  EXPECT_THROW(forward_backward(m, ids2.data(), tg2.data(), 1, 2 * C, g, 1.0f, &cp), Error);
}

}  // namespace
}  // namespace zaya
