// AdamW and Muon steps against double-precision references written here from the formulas; the
// Newton–Schulz spectrum; Muon's update RMS; state save/load continuing bit-exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "optim/matmul_f32.h"
#include "optim/newton_schulz.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"

using namespace zaya;
using namespace zaya::testing;

namespace {

OptimizerSettings settings_with(std::vector<ParamRule> rules, double wd = 0.1) {
  OptimizerSettings s;
  s.weight_decay = wd;
  s.rules = std::move(rules);
  s.default_rules = false;
  return s;
}

double max_abs_diff(const Tensor& t, const std::vector<double>& ref) {
  double d = 0;
  for (int64_t i = 0; i < t.numel(); i++) d = std::max(d, std::fabs(t.f32()[i] - ref[size_t(i)]));
  return d;
}

}  // namespace

TEST(OptimMatmul, MatchesDoubleReferenceAndIsPartitionIndependent) {
  const int m = 37, k = 70, n = 530;  // not multiples of the tile sizes
  Tensor A = random_tensor({m, k}, 1), B = random_tensor({k, n}, 2);
  auto ref = matmul_ref(to_double(A), to_double(B), m, k, n);
  Tensor C = Tensor::zeros({m, n});
  matmul_f32(C.f32(), A.f32(), B.f32(), m, k, n);
  EXPECT_LT(max_abs_diff(C, ref), 1e-4);
  // The same rows computed in a different tiling and thread partition (a row slice starting at an
  // odd row) are bitwise identical: each element's summation order is fixed.
  const int r0 = 5;
  Tensor C1 = Tensor::zeros({m - r0, n});
  matmul_f32(C1.f32(), A.f32() + r0 * k, B.f32(), m - r0, k, n);
  EXPECT_EQ(std::memcmp(C1.f32(), C.f32() + r0 * n, C1.nbytes()), 0);
  // alpha/beta form: C = 2·AB − 0.5·C
  Tensor D = C.clone();
  matmul_f32(D.f32(), A.f32(), B.f32(), m, k, n, 2.0f, -0.5f);
  for (size_t i = 0; i < ref.size(); i++) ASSERT_NEAR(D.f32()[i], 1.5 * ref[i], 2e-4);
  Tensor G = Tensor::zeros({m, m});
  gram_f32(G.f32(), A.f32(), m, k);
  auto gref = matmul_ref(to_double(A), transpose_ref(to_double(A), m, k), m, k, m);
  EXPECT_LT(max_abs_diff(G, gref), 1e-4);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < m; j++) ASSERT_EQ(G.f32()[i * m + j], G.f32()[j * m + i]);
}

TEST(OptimNewtonSchulz, SingularValuesNearOneForWideTallAndSquarishShapes) {
  // The Jacobi helper itself: singular values of a known matrix diag(3, 2) padded to 2x3.
  auto sv0 = singular_values({3, 0, 0, 0, 2, 0}, 2, 3);
  std::sort(sv0.begin(), sv0.end());
  ASSERT_NEAR(sv0[0], 2.0, 1e-12);
  ASSERT_NEAR(sv0[1], 3.0, 1e-12);

  const std::vector<std::pair<int, int>> shapes = {{32, 64},  {64, 32}, {16, 128},
                                                   {128, 16}, {40, 48}, {96, 24}};
  uint64_t seed = 10;
  for (auto [m, n] : shapes) {
    Tensor X = random_tensor({m, n}, seed++);
    auto input_sv = singular_values(to_double(X), m, n);
    auto ref = newton_schulz_ref(to_double(X), m, n);
    newton_schulz_orthogonalize(X.f32(), m, n);
    EXPECT_LT(max_abs_diff(X, ref), 2e-4) << m << "x" << n;
    auto sv = singular_values(to_double(X), m, n);
    auto [lo, hi] = std::minmax_element(sv.begin(), sv.end());
    EXPECT_GT(*lo, 0.65) << m << "x" << n;
    EXPECT_LT(*hi, 1.25) << m << "x" << n;
    // The work was real: after the Frobenius normalisation every input singular value was far
    // below the 0.65 the output reaches.
    double fro = 0;
    for (double v : input_sv) fro += v * v;
    EXPECT_LT(*std::max_element(input_sv.begin(), input_sv.end()) / std::sqrt(fro), 0.5);
  }
}

TEST(OptimNewtonSchulz, Deterministic) {
  // Thread-count independence rests on matmul_f32's fixed summation order (tested above); here the
  // whole iteration must repeat bit for bit. (Changing the pool size inside the test binary is
  // avoided: see the report on core/parallel.cpp's resize.)
  Tensor X = random_tensor({200, 300}, 5), Y = X.clone();
  newton_schulz_orthogonalize(X.f32(), 200, 300);
  newton_schulz_orthogonalize(Y.f32(), 200, 300);
  EXPECT_TRUE(bitwise_equal(X, Y));
}

TEST(OptimAdamW, ThreeStepsMatchDoubleReference) {
  ParamRef p = random_param("w", {7, 13}, 1);
  std::vector<double> w = to_double(p.value), m(w.size(), 0), v(w.size(), 0);
  OptimizerSettings s = settings_with({{"*", OptimizerKind::AdamW, 2.0, 0.05}});
  Optimizer opt({p}, s);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.05, plr = lr * 2.0;
  for (int t = 1; t <= 3; t++) {
    Tensor g = random_tensor({7, 13}, 100 + t, 0.3f);
    p.grad.copy_from(g);
    opt.step(lr);
    for (size_t i = 0; i < w.size(); i++) {
      double gi = g.f32()[i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      w[i] = w[i] - plr * wd * w[i] - plr * mh / (std::sqrt(vh) + eps);
    }
    EXPECT_LT(max_abs_diff(p.value, w), 2e-6) << "step " << t;
  }
  EXPECT_EQ(opt.steps(), 3);
  // The state tensors are the moments of the reference.
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].first, "optim.adamw.exp_avg.w");
  EXPECT_EQ(st[1].first, "optim.adamw.exp_avg_sq.w");
  EXPECT_LT(max_abs_diff(st[0].second, m), 1e-6);
  EXPECT_LT(max_abs_diff(st[1].second, v), 1e-7);
}

TEST(OptimMuon, StepsMatchDoubleReferenceFor2DAnd3DExperts) {
  // A wide matrix, a tall matrix, and a 3-D expert stack whose experts must be handled separately.
  std::vector<ParamRef> ps = {random_param("wide", {24, 40}, 1), random_param("tall", {48, 16}, 2),
                              random_param("experts", {3, 20, 12}, 3)};
  OptimizerSettings s = settings_with({{"*", OptimizerKind::Muon, 1.0, 0.1}});
  Optimizer opt(ps, s);
  const double lr = 0.02, mu = 0.95, wd = 0.1;
  struct Ref {
    std::vector<double> w, buf;
  };
  std::vector<Ref> refs;
  for (auto& p : ps) refs.push_back({to_double(p.value), std::vector<double>(p.value.numel(), 0)});
  for (int t = 1; t <= 3; t++) {
    for (size_t k = 0; k < ps.size(); k++) {
      Tensor g = random_tensor(ps[k].value.shape(), 50 * t + k, 0.2f);
      ps[k].grad.copy_from(g);
      const auto& sh = ps[k].value.shape();
      const int mats = sh.size() == 3 ? int(sh[0]) : 1;
      const int rows = int(sh[sh.size() - 2]), cols = int(sh[sh.size() - 1]);
      for (int e = 0; e < mats; e++) {
        const size_t off = size_t(e) * rows * cols;
        std::vector<double> u(size_t(rows) * cols);
        for (size_t i = 0; i < u.size(); i++) {
          double gi = g.f32()[off + i];
          refs[k].buf[off + i] = mu * refs[k].buf[off + i] + gi;
          u[i] = gi + mu * refs[k].buf[off + i];
        }
        auto o = newton_schulz_ref(u, rows, cols);
        const double scale = 0.2 * std::sqrt(double(std::max(rows, cols)));
        for (size_t i = 0; i < u.size(); i++) {
          double& w = refs[k].w[off + i];
          w = w - lr * wd * w - lr * scale * o[i];
        }
      }
    }
    opt.step(lr);
    for (size_t k = 0; k < ps.size(); k++)
      EXPECT_LT(max_abs_diff(ps[k].value, refs[k].w), 2e-5) << ps[k].name << " step " << t;
  }
}

TEST(OptimMuon, UpdateRmsIsAboutPointTwoTimesLrForAnyShape) {
  // With zero decay, ‖Δw‖_rms / lr = 0.2·√max(m,n)·rms(O) and rms(O) ≈ 1/√max(m,n) because O's
  // singular values are ≈ 1: the result should be ≈ 0.2 whatever the shape (AdamW-like RMS).
  for (auto shape : std::vector<Shape>{{64, 256}, {256, 64}, {100, 100}, {4, 32, 96}}) {
    ParamRef p = random_param("w", shape, 7);
    Tensor before = p.value.clone();
    Optimizer opt({p}, settings_with({{"*", OptimizerKind::Muon, 1.0, 0.0}}));
    const double lr = 1e-3;
    opt.step(lr);
    double ss = 0;
    for (int64_t i = 0; i < p.value.numel(); i++) {
      double d = double(p.value.f32()[i]) - before.f32()[i];
      ss += d * d;
    }
    double rms = std::sqrt(ss / double(p.value.numel())) / lr;
    EXPECT_GT(rms, 0.2 * 0.7) << shape_str(shape);
    EXPECT_LT(rms, 0.2 * 1.2) << shape_str(shape);
  }
}

TEST(OptimOptimizer, LrMultAndWeightDecayComeFromTheRule) {
  // lr_mult 0: the parameter does not move at all (decay is lr·wd·w and lr is 0 too).
  ParamRef a = random_param("frozen.w", {4, 4}, 1), b = random_param("free.w", {4, 4}, 2);
  ParamRef c = random_param("skip.w", {4, 4}, 3);
  Tensor a0 = a.value.clone(), b0 = b.value.clone(), c0 = c.value.clone();
  Optimizer opt({a, b, c}, settings_with({{"frozen.*", OptimizerKind::AdamW, 0.0, {}},
                                          {"skip.*", OptimizerKind::None, 1.0, {}},
                                          {"*", OptimizerKind::AdamW, 1.0, 0.0}}));
  opt.step(0.1);
  EXPECT_TRUE(bitwise_equal(a.value, a0));
  EXPECT_TRUE(bitwise_equal(c.value, c0));
  EXPECT_FALSE(bitwise_equal(b.value, b0));
  EXPECT_EQ(opt.entries()[0].assignment.weight_decay, 0.1);  // inherited default
  EXPECT_EQ(opt.entries()[1].assignment.weight_decay, 0.0);
  EXPECT_EQ(opt.state_tensors().size(), 4u);  // none for the frozen-by-"none" parameter
}

TEST(OptimOptimizer, RejectsBadParametersAndMuonOnVectors) {
  ParamRef v = random_param("x.scale", {8}, 1);
  EXPECT_THROW(Optimizer({v}, settings_with({{"*", OptimizerKind::Muon, 1.0, {}}})), Error);
  ParamRef bad = random_param("w", {4, 4}, 1);
  bad.grad = Tensor::zeros({4, 5});
  try {
    Optimizer({bad}, settings_with({}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  ParamRef d1 = random_param("w", {4, 4}, 1), d2 = random_param("w", {4, 4}, 2);
  EXPECT_THROW(Optimizer({d1, d2}, settings_with({})), Error);
  OptimizerSettings s;
  s.adamw.beta2 = 1.0;
  EXPECT_THROW(Optimizer({d1}, s), Error);
  Optimizer ok({d1}, settings_with({}));
  EXPECT_THROW(ok.step(-1.0), Error);
}

TEST(OptimOptimizer, BalancingBiasesAreExcluded) {
  ParamRef w = random_param("model.layers.0.self_attn.o_proj.weight", {8, 8}, 1);
  ParamRef bb{"model.layers.0.mlp.gate.balancing_biases", Tensor::zeros({5}), Tensor()};
  Optimizer opt({w, bb}, OptimizerSettings{});
  ASSERT_EQ(opt.entries().size(), 1u);
  EXPECT_EQ(opt.entries()[0].param.name, w.name);
}

TEST(OptimOptimizer, SaveLoadContinuesBitExactly) {
  auto make = [](uint64_t seed) {
    return std::vector<ParamRef>{
        random_param("model.embed_tokens.weight", {32, 16}, seed),
        random_param("model.layers.0.self_attn.o_proj.weight", {16, 24}, seed + 1),
        random_param("model.layers.0.mlp.experts.down_proj", {2, 16, 8}, seed + 2),
        random_param("model.norm.weight", {16}, seed + 3)};
  };
  auto grads = [](std::vector<ParamRef>& ps, int step) {
    for (size_t k = 0; k < ps.size(); k++)
      ps[k].grad.copy_from(random_tensor(ps[k].grad.shape(), 1000 * step + k, 0.1f));
  };
  auto A = make(1);
  Optimizer oa(A, OptimizerSettings{});
  for (int s = 0; s < 3; s++) grads(A, s), oa.step(1e-2);
  // "Checkpoint": copies of the weights and of the state, as a checkpoint writer would make.
  std::vector<ParamRef> B = make(99);  // different initial values, overwritten below
  for (size_t k = 0; k < A.size(); k++) B[k].value.copy_from(A[k].value);
  std::vector<std::pair<std::string, Tensor>> saved;
  for (auto& [n, t] : oa.state_tensors()) saved.emplace_back(n, t.clone());
  Optimizer ob(B, OptimizerSettings{});
  ob.load_state(saved, oa.steps());
  EXPECT_EQ(ob.steps(), 3);
  for (int s = 3; s < 6; s++) {
    grads(A, s), oa.step(1e-2);
    grads(B, s), ob.step(1e-2);
  }
  for (size_t k = 0; k < A.size(); k++)
    EXPECT_TRUE(bitwise_equal(A[k].value, B[k].value)) << A[k].name;
  auto sa = oa.state_tensors(), sb = ob.state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); i++) EXPECT_TRUE(bitwise_equal(sa[i].second, sb[i].second));

  // Incomplete or mismatched states are rejected, naming the tensor.
  auto missing = saved;
  missing.pop_back();
  EXPECT_THROW(ob.load_state(missing, 3), Error);
  auto extra = saved;
  extra.emplace_back("optim.adamw.exp_avg.nope", Tensor::zeros({1}));
  EXPECT_THROW(ob.load_state(extra, 3), Error);
  auto wrong = saved;
  wrong[0].second = Tensor::zeros({3});
  try {
    ob.load_state(wrong, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(saved[0].first), std::string::npos) << e.what();
  }
}
