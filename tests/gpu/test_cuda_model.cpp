// GPU tests of CudaModel (engine/cuda/model_cuda.h; label gpu, skipped without a CUDA device):
// - parity: forward_logits and loss on the `transformers` fixtures (tests/fixtures/parity) within
//   bf16 tolerance, greedy argmax where the reference margin is clear;
// - gradients: loss and every parameter gradient of forward_backward against the CPU
//   zaya::forward_backward on a tiny random model, both skip-output modes;
// - determinism: two identical steps give bit-identical gradients; recompute on/off agree;
// - upload/download round trip, loss() against the training forward, op-class profiling.
//
// Routing is a discrete decision: a bf16 forward can send a token whose top two router scores
// nearly tie to another expert than the fp32 reference does, and then that token's path differs.
// The gradient test therefore tries a few seeds and compares on the first whose routing counts
// agree in every layer with the reference's (a flip changes two counts); the parity test allows a
// few positions off (the fixtures' smallest routing margin is below bf16 resolution).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "../model/parity_fixture.h"
#include "engine/cuda/model_cuda.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "gpu_test_util.h"
#include "model/backward.h"
#include "ckpt/model_io.h"
#include "model/zaya.h"

namespace zaya::cuda {
namespace {

using test_util::have_gpu;
using test_util::load_parity_expected;
using test_util::parity_fixture;
using test_util::ParityExpected;

// Host copies of every device gradient, in params() order (empty for balancing biases).
std::vector<std::vector<float>> device_grads(CudaModel& cm) {
  std::vector<std::vector<float>> out;
  for (const DeviceParam& p : cm.params()) {
    std::vector<float> g;
    if (p.grad) g = test_util::download(p.grad, size_t(p.numel));
    out.push_back(std::move(g));
  }
  return out;
}

double norm2(const float* a, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += double(a[i]) * double(a[i]);
  return std::sqrt(s);
}

double diff_norm(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    const double t = double(a[i]) - double(b[i]);
    s += t * t;
  }
  return std::sqrt(s);
}

struct Batch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> ids, targets;
};

// Random ids; targets are the next ids (ZayaModel::loss's rule) with a few more ignored.
Batch random_batch(int64_t V, int64_t B, int64_t S, uint64_t seed) {
  Batch b;
  b.B = B;
  b.S = S;
  Rng rng(seed);
  b.ids.resize(size_t(B * S));
  for (auto& id : b.ids) id = int32_t(rng.next_u32() % uint32_t(V));
  b.targets.assign(size_t(B * S), -1);
  for (int64_t i = 0; i < B; i++)
    for (int64_t t = 0; t + 1 < S; t++)
      if ((i * S + t) % 7 != 3) b.targets[size_t(i * S + t)] = b.ids[size_t(i * S + t + 1)];
  return b;
}

// The tiny preset with a sliding-window layer and fresh random weights, adjusted so that the test
// exercises what it should:
// - every bias (input, residual-scale, router, conv) is small and random. ZayaModel::init sets the
//   residual-scale biases to 1 (its "_scale" rule matches their set's name), which adds the same
//   constant to every token's h, drowns the token signal and routes every token of a layer to one
//   class; scales and norm weights get ±10% noise;
// - the router matrices are 5-10× larger so that the router MLP sees token-dependent inputs and
//   produces decisive, varied choices;
// - the skip class's balancing bias is 0, so some tokens choose it;
// - all values are bf16-representable, so the device's bf16 weight copies are exact and the
//   remaining differences come from activations.
ZayaModel test_model(SkipOutput skip, uint64_t seed) {
  ZayaConfig c = ZayaConfig::preset("tiny");
  c.skip_output = skip;
  c.layer_types = {"hybrid", "hybrid_sliding", "hybrid", "hybrid_sliding"};
  c.sliding_window = 9;
  ZayaModel m = ZayaModel::init(c, seed);
  Rng rng(seed * 7919 + 1);
  for (auto& [name, t] : m.named_tensors()) {
    float* p = t.f32();
    if (name.find("balancing_biases") != std::string::npos) {
      p[t.numel() - 1] = 0.0f;
      continue;
    }
    const bool vec = t.dim() == 1 && name.find("temp") == std::string::npos;
    const bool bias = vec && name.find("bias") != std::string::npos;
    float gain = 1.0f;
    if (!vec && name.find("mlp.gate.") != std::string::npos)
      gain = name.find("out_proj") != std::string::npos ? 5.0f : 10.0f;
    for (int64_t i = 0; i < t.numel(); i++) {
      if (bias)
        p[i] = 0.01f * rng.normal();
      else if (vec)
        p[i] += 0.1f * rng.normal();
      p[i] *= gain;
      p[i] = test_util::round_bf16(p[i]);
    }
  }
  return m;
}

// ---- parity with transformers ------------------------------------------------------------------

class CudaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaParity, LogitsLossAndArgmaxMatchTransformers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = parity_fixture(GetParam());
  ZayaModel m = load_model(dir);
  if (m.cfg.head_dim != 32 && m.cfg.head_dim != 64 && m.cfg.head_dim != 128)
    GTEST_SKIP() << GetParam() << ": head_dim " << m.cfg.head_dim
                 << " is not one the attention kernels support (32, 64, 128)";
  ParityExpected e = load_parity_expected(dir);
  CudaModelOptions o;
  o.max_tokens = e.B * e.S;
  o.max_seq = e.S;
  CudaModel cm(m, o);
  Tensor logits = cm.forward_logits(e.ids, e.B, e.S);
  const int64_t V = m.cfg.vocab_size, P = e.B * e.S;
  ASSERT_EQ(logits.numel(), e.logits.numel());
  const float* g = logits.f32();
  const float* r = e.logits.f32();
  const double scale = test_util::max_abs(r, P * V);
  int64_t close = 0, clear = 0, agree = 0;
  double worst = 0;
  for (int64_t p = 0; p < P; p++) {
    double w = 0;
    int64_t ag = 0, ar = 0;
    for (int64_t v = 0; v < V; v++) {
      w = std::max(w, double(std::fabs(g[p * V + v] - r[p * V + v])));
      if (g[p * V + v] > g[p * V + ag]) ag = v;
      if (r[p * V + v] > r[p * V + ar]) ar = v;
    }
    worst = std::max(worst, w);
    close += w <= 2e-2 * scale;
    double second = -1e30;
    for (int64_t v = 0; v < V; v++)
      if (v != ar) second = std::max(second, double(r[p * V + v]));
    if (double(r[p * V + ar]) - second > 5e-2 * scale) {
      clear++;
      agree += ag == ar;
    }
  }
  // A routing flip at a near-tie moves that position's logits and, through attention, slightly the
  // later positions of its sequence. cfg_a's router margins reach 4.6e-4, below bf16 resolution,
  // and on the H200 (2026-12-03) 38 of its 48 positions came within 2e-2 of the logit scale.
  EXPECT_GE(double(close), 0.75 * double(P))
      << close << " of " << P << " positions within 2e-2 of the logit scale " << scale << "; worst "
      << worst;
  EXPECT_GE(double(agree), 0.95 * double(clear)) << agree << " of " << clear;
  const double loss = cm.loss(e.ids, e.B, e.S);
  const double ref = e.meta["loss"].get<double>();
  EXPECT_NEAR(loss, ref, 1e-2 * std::fabs(ref));
  RecordProperty("max_logit_diff", std::to_string(worst));
  RecordProperty("logit_scale", std::to_string(scale));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity, ::testing::Values("cfg_a", "cfg_b"));

// ---- gradients against the CPU reference --------------------------------------------------------

class CudaGrads : public ::testing::TestWithParam<SkipOutput> {};

TEST_P(CudaGrads, LossAndEveryGradientMatchCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const SkipOutput skip = GetParam();
  const float loss_scale = 0.5f;
  bool compared = false;
  for (uint64_t seed = 1; seed <= 8 && !compared; seed++) {
    ZayaModel m = test_model(skip, seed);
    const Batch b = random_batch(m.cfg.vocab_size, 2, 32, seed + 100);
    ModelGrads ref = make_grads(m);
    const StepStats rs =
        zaya::forward_backward(m, b.ids.data(), b.targets.data(), b.B, b.S, ref, loss_scale);
    CudaModelOptions o;
    o.max_tokens = b.B * b.S;
    o.max_seq = b.S;
    CudaModel cm(m, o);
    cm.zero_grads();
    const StepStats gs = cm.forward_backward(b.ids.data(), b.targets.data(), b.B, b.S, loss_scale);
    ASSERT_EQ(gs.routed.size(), rs.routed.size());
    if (gs.routed != rs.routed) {
      std::cout << "seed " << seed << ": routing counts differ from the reference (near-tie), "
                << "trying the next seed\n";
      continue;
    }
    compared = true;
    EXPECT_EQ(gs.tokens, rs.tokens);
    EXPECT_NEAR(gs.loss, rs.loss, 1e-2 * std::fabs(rs.loss));
    int64_t skipped = 0;
    for (auto& layer : rs.routed) skipped += layer.back();
    EXPECT_GT(skipped, 0) << "no token chose the skip class: the skip path is untested";
    const auto grads = device_grads(cm);
    const auto& params = cm.params();
    for (size_t i = 0; i < params.size(); i++) {
      const auto& [name, t] = ref.tensors[i];
      ASSERT_EQ(name, params[i].name);
      if (!params[i].grad) continue;  // balancing biases
      const size_t n = size_t(t.numel());
      const double rn = norm2(t.f32(), n);
      const double dn = diff_norm(grads[i].data(), t.f32(), n);
      if (rn == 0) {
        EXPECT_LT(dn, 1e-6) << name;
        continue;
      }
      // bf16 activations and weight copies through the whole stack: the small router and
      // temperature gradients landed at 3-4% (H200, 2026-12-03), at up to 5.5% once the CCA conv
      // took bf16 operands (762de3c: one more bf16 rounding on q and k, which the router sees
      // through the residual stream); the large ones stay well below. A wrong gradient is off by
      // O(100%).
      EXPECT_LT(dn / rn, 8e-2) << name << ": |Δ| " << dn << " |ref| " << rn;
    }
  }
  EXPECT_TRUE(compared) << "every seed hit a routing near-tie; no gradient was compared";
}

INSTANTIATE_TEST_SUITE_P(SkipModes, CudaGrads,
                         ::testing::Values(SkipOutput::Zero, SkipOutput::ScaledInput),
                         [](const auto& info) {
                           return std::string(info.param == SkipOutput::Zero ? "Zero"
                                                                             : "ScaledInput");
                         });

// ---- determinism, recompute, round trips, profiling ---------------------------------------------

TEST(CudaModel, RepeatedStepsAreBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ZayaModel m = test_model(SkipOutput::ScaledInput, 3);
  const Batch b = random_batch(m.cfg.vocab_size, 3, 40, 11);
  CudaModelOptions o;
  o.max_tokens = 256;
  o.max_seq = 64;
  CudaModel cm(m, o);
  cm.zero_grads();
  const StepStats s1 = cm.forward_backward(b.ids.data(), b.targets.data(), b.B, b.S);
  const auto g1 = device_grads(cm);
  cm.zero_grads();
  const StepStats s2 = cm.forward_backward(b.ids.data(), b.targets.data(), b.B, b.S);
  const auto g2 = device_grads(cm);
  EXPECT_EQ(s1.loss, s2.loss);
  EXPECT_EQ(s1.routed, s2.routed);
  for (size_t i = 0; i < g1.size(); i++)
    EXPECT_EQ(0, std::memcmp(g1[i].data(), g2[i].data(), g1[i].size() * sizeof(float)))
        << cm.params()[i].name;
}

TEST(CudaModel, RecomputeGivesTheSameGradients) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ZayaModel m = test_model(SkipOutput::Zero, 4);
  const Batch b = random_batch(m.cfg.vocab_size, 2, 48, 12);
  CudaModelOptions o;
  o.max_tokens = b.B * b.S;
  o.max_seq = b.S;
  CudaModel keep(m, o);
  o.recompute = true;
  CudaModel recompute(m, o);
  EXPECT_LT(recompute.arena_bytes(), keep.arena_bytes());
  keep.zero_grads();
  recompute.zero_grads();
  const StepStats a = keep.forward_backward(b.ids.data(), b.targets.data(), b.B, b.S);
  const StepStats r = recompute.forward_backward(b.ids.data(), b.targets.data(), b.B, b.S);
  EXPECT_EQ(a.loss, r.loss);
  EXPECT_EQ(a.routed, r.routed);
  const auto ga = device_grads(keep), gr = device_grads(recompute);
  // Recompute keeps each layer's normed input, so the rerun layer sees the same bits and the same
  // kernels run on them: the gradients should be identical. Report, and bound them in any case.
  int64_t differing = 0;
  for (size_t i = 0; i < ga.size(); i++) {
    if (std::memcmp(ga[i].data(), gr[i].data(), ga[i].size() * sizeof(float)) == 0) continue;
    differing++;
    const double rn = norm2(ga[i].data(), ga[i].size());
    EXPECT_LE(diff_norm(ga[i].data(), gr[i].data(), ga[i].size()), 1e-3 * rn)
        << keep.params()[i].name;
  }
  EXPECT_EQ(differing, 0) << "tensors whose gradients are not bit-identical";
}

TEST(CudaModel, UploadDownloadRoundTripAndLossMatchesTrainingForward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ZayaModel m = test_model(SkipOutput::Zero, 5);
  CudaModelOptions o;
  o.max_tokens = 128;
  o.max_seq = 64;
  CudaModel cm(m, o);
  ZayaModel back = ZayaModel::init(m.cfg, 99);
  cm.download(back);
  const auto a = m.named_tensors(), bt = back.named_tensors();
  ASSERT_EQ(a.size(), bt.size());
  for (size_t i = 0; i < a.size(); i++)
    EXPECT_EQ(0, std::memcmp(a[i].second.f32(), bt[i].second.f32(), a[i].second.nbytes()))
        << a[i].first;
  // loss() runs the same forward with next-token targets: the same number, bit for bit.
  Batch b = random_batch(m.cfg.vocab_size, 2, 64, 13);
  for (int64_t i = 0; i < b.B; i++)
    for (int64_t t = 0; t < b.S; t++)
      b.targets[size_t(i * b.S + t)] = t + 1 < b.S ? b.ids[size_t(i * b.S + t + 1)] : -1;
  cm.zero_grads();
  const StepStats s = cm.forward_backward(b.ids.data(), b.targets.data(), b.B, b.S);
  EXPECT_EQ(cm.loss(b.ids, b.B, b.S), s.loss);
  EXPECT_NEAR(s.loss, m.loss(b.ids, b.B, b.S), 1e-2 * s.loss);
  // Out-of-range input is refused on the host, naming the position.
  std::vector<int32_t> bad = b.ids;
  bad[5] = int32_t(m.cfg.vocab_size);
  EXPECT_THROW(cm.loss(bad, b.B, b.S), Error);
  EXPECT_THROW(cm.loss(std::vector<int32_t>(size_t(3 * 64), 1), 3, 64), Error);  // > max_tokens
}

TEST(CudaModel, ProfileTimesOpClasses) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ZayaModel m = test_model(SkipOutput::Zero, 6);
  const Batch b = random_batch(m.cfg.vocab_size, 2, 32, 14);
  CudaModelOptions o;
  o.max_tokens = 64;
  o.max_seq = 32;
  o.profile = true;
  CudaModel cm(m, o);
  cm.zero_grads();
  cm.forward_backward(b.ids.data(), b.targets.data(), b.B, b.S);
  const OpClassTimes& t = cm.last_profile();
  EXPECT_GT(t.gemm, 0);
  EXPECT_GT(t.attention, 0);
  EXPECT_GT(t.moe_dispatch, 0);
  EXPECT_GT(t.norms, 0);
  EXPECT_GT(t.loss, 0);
  EXPECT_GT(t.other, 0);
}

}  // namespace
}  // namespace zaya::cuda
