// CudaOptimizer against the CPU Optimizer (label gpu; skipped without a CUDA device): the same
// parameter rules and state names, AdamW updates to fp32 rounding, Muon updates to fp32 rounding
// with fp32 Newton–Schulz and within bf16 tolerance with bf16 Newton–Schulz, across wide, tall and
// 3-D (per-expert) matrices, a frozen parameter, a skipped balancing bias, a clip factor, the grad
// norm, the bf16 copies, and a state export/import that continues bit-exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "core/dtype.h"
#include "core/rng.h"
#include "engine/cuda/optim_cuda.h"
#include "gpu_test_util.h"
#include "optim/grad_utils.h"

namespace zaya::cuda {
namespace {

using test_util::have_gpu;

struct Spec {
  std::string name;
  Shape shape;
};

// Model-like names so the default rules route them: AdamW (embedding, norm), Muon (wide, tall,
// 3-D tall and wide expert stacks), frozen by an explicit rule, and a balancing bias (skipped).
std::vector<Spec> specs() {
  return {{"model.embed_tokens.weight", {64, 32}},
          {"model.layers.0.input_layernorm.weight", {32}},
          {"model.layers.0.self_attn.qkv_proj.q_proj.weight", {48, 32}},
          {"model.layers.0.self_attn.o_proj.weight", {32, 48}},
          {"model.layers.0.mlp.experts.gate_up_proj", {3, 40, 32}},
          {"model.layers.0.mlp.experts.down_proj", {3, 32, 20}},
          {"model.layers.0.mlp.gate.router_mlp.out_proj.weight", {5, 16}},
          {"model.layers.0.frozen.weight", {8, 8}},
          {"model.layers.0.mlp.gate.balancing_biases", {5}}};
}

OptimizerSettings settings() {
  OptimizerSettings s;
  s.rules.push_back({"*.frozen.weight", OptimizerKind::None, 1.0, std::nullopt});
  s.rules.push_back({"*.o_proj.weight", OptimizerKind::Muon, 0.5, 0.05});  // lr_mult, own wd
  return s;
}

// Host values, grads (a fresh gradient per step) and the device mirror.
struct Fixture {
  std::vector<Tensor> value, grad;
  std::vector<DeviceParam> dev;
  test_util::DeviceArena mem;
  cudaStream_t st = nullptr;

  explicit Fixture(uint64_t seed) {
    Rng r(seed);
    cudaStreamCreate(&st);
    for (const auto& s : specs()) {
      Tensor v = Tensor::empty(s.shape, DType::F32), g = Tensor::empty(s.shape, DType::F32);
      for (int64_t i = 0; i < v.numel(); i++) v.f32()[i] = 0.1f * r.normal();
      value.push_back(v);
      grad.push_back(g);
      DeviceParam p;
      p.name = s.name;
      p.shape = s.shape;
      p.numel = v.numel();
      p.master = alloc(p.numel);
      const bool vector = s.shape.size() == 1;
      if (!vector) p.copy = reinterpret_cast<bf16*>(alloc((p.numel + 1) / 2));
      if (s.name.find("balancing") == std::string::npos) p.grad = alloc(p.numel);
      EXPECT_EQ(test_util::to_device(p.master, v.f32(), v.nbytes(), st), cudaSuccess);
      dev.push_back(p);
    }
  }
  ~Fixture() { cudaStreamDestroy(st); }
  float* alloc(int64_t n) {
    float* p = mem.alloc<float>(size_t(n));
    EXPECT_NE(p, nullptr) << "cudaMalloc of " << n << " floats";
    return p;
  }
  // New random gradients on the host, copied to the device.
  void new_grads(Rng& r) {
    for (size_t i = 0; i < grad.size(); i++) {
      // Balancing biases get no gradient (the host's stays zero, so both norms agree).
      for (int64_t k = 0; k < grad[i].numel(); k++)
        grad[i].f32()[k] = dev[i].grad ? r.normal() : 0.0f;
      if (dev[i].grad) {
        EXPECT_EQ(test_util::to_device(dev[i].grad, grad[i].f32(), grad[i].nbytes(), st),
                  cudaSuccess);
      }
    }
  }
  std::vector<ParamRef> refs() {
    std::vector<ParamRef> out;
    for (size_t i = 0; i < value.size(); i++) out.push_back({specs()[i].name, value[i], grad[i]});
    return out;
  }
  std::vector<float> master(size_t i) const {
    return test_util::download(dev[i].master, size_t(dev[i].numel), st);
  }
};

void run_against_cpu(bool ns_bf16) {
  Fixture f(11);
  std::vector<Tensor> init;
  for (auto& v : f.value) init.push_back(v.clone());
  GemmContext gemm;
  CudaOptimizerOptions oo;
  oo.ns_bf16 = ns_bf16;
  CudaOptimizer gpu(f.dev, settings(), gemm, f.st, oo);
  auto refs = f.refs();
  Optimizer cpu(refs, settings());
  EXPECT_EQ(gpu.describe(), cpu.describe());
  Rng r(5);
  const float clip = 0.5f;
  for (int step = 0; step < 3; step++) {
    f.new_grads(r);
    EXPECT_NEAR(gpu.grad_sq_norm(), grad_sq_norm(refs), 1e-9 * grad_sq_norm(refs));
    scale_grads(refs, clip);  // the CPU loop clips by scaling the gradients
    cpu.step(1e-2);
    gpu.step(1e-2, clip);
  }
  EXPECT_EQ(gpu.steps(), 3);
  for (size_t i = 0; i < f.dev.size(); i++) {
    const auto& name = f.dev[i].name;
    const auto g = f.master(i);
    const float* c = f.value[i].f32();
    const float* c0 = init[i].f32();
    double max_dc = 0, max_err = 0;
    for (size_t k = 0; k < g.size(); k++) {
      max_dc = std::max(max_dc, double(std::fabs(c[k] - c0[k])));
      max_err = std::max(max_err, double(std::fabs(g[k] - c[k])));
    }
    const bool muon =
        name.find("proj") != std::string::npos && name.find("embed") == std::string::npos;
    const double tol = (muon && ns_bf16) ? 3e-2 * max_dc : 1e-4 * max_dc + 1e-7;
    EXPECT_LE(max_err, tol) << name << " (max update " << max_dc << ")";
    if (name.find("frozen") != std::string::npos || name.find("balancing") != std::string::npos)
      EXPECT_EQ(max_dc, 0.0) << name;
    else
      EXPECT_GT(max_dc, 0.0) << name;
    if (f.dev[i].copy) {  // the bf16 copy is the rounded master
      const std::vector<uint16_t> b =
          test_util::download(reinterpret_cast<const uint16_t*>(f.dev[i].copy), g.size(), f.st);
      for (size_t k = 0; k < g.size(); k += 7) {
        if (name.find("frozen") == std::string::npos) {
          EXPECT_EQ(b[k], ::zaya::f32_to_bf16(g[k])) << name << "[" << k << "]";
        }
      }
    }
  }
  // Same state names, order and (to the update tolerance) values.
  auto gs = gpu.state_tensors(), cs = cpu.state_tensors();
  ASSERT_EQ(gs.size(), cs.size());
  for (size_t i = 0; i < gs.size(); i++) {
    EXPECT_EQ(gs[i].first, cs[i].first);
    ASSERT_EQ(gs[i].second.shape(), cs[i].second.shape());
    double mx = 0, err = 0;
    for (int64_t k = 0; k < gs[i].second.numel(); k++) {
      mx = std::max(mx, double(std::fabs(cs[i].second.f32()[k])));
      err = std::max(err, double(std::fabs(gs[i].second.f32()[k] - cs[i].second.f32()[k])));
    }
    EXPECT_LE(err, 1e-5 * (1 + mx)) << gs[i].first;
  }
}

TEST(OptimizerCuda, MatchesCpuWithFp32NewtonSchulz) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_against_cpu(false);
}

TEST(OptimizerCuda, MatchesCpuWithBf16NewtonSchulz) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_against_cpu(true);
}

TEST(OptimizerCuda, StateRoundTripContinuesBitExactly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Fixture a(3), b(3);
  GemmContext gemm;
  CudaOptimizer oa(a.dev, settings(), gemm, a.st);
  Rng ra(9);
  for (int s = 0; s < 2; s++) {
    a.new_grads(ra);
    oa.step(3e-3);
  }
  // b starts from a's weights and state, then both take the same step.
  for (size_t i = 0; i < a.dev.size(); i++) {
    cudaMemcpy(b.dev[i].master, a.dev[i].master, size_t(a.dev[i].numel) * 4,
               cudaMemcpyDeviceToDevice);
  }
  CudaOptimizer ob(b.dev, settings(), gemm, b.st);
  ob.load_state(oa.state_tensors(), oa.steps());
  EXPECT_EQ(ob.steps(), 2);
  Rng r1(21), r2(21);
  a.new_grads(r1);
  b.new_grads(r2);
  oa.step(3e-3);
  ob.step(3e-3);
  for (size_t i = 0; i < a.dev.size(); i++) {
    const auto ma = a.master(i), mb = b.master(i);
    EXPECT_EQ(0, std::memcmp(ma.data(), mb.data(), ma.size() * 4)) << a.dev[i].name;
  }
  // A missing tensor is refused before anything is copied.
  auto st = oa.state_tensors();
  st.pop_back();
  EXPECT_THROW(ob.load_state(st, 3), Error);
  EXPECT_EQ(ob.steps(), 3);
}

// ZeRO-1 on the GPU: an optimizer given an owned subset keeps state for just that subset (less
// memory, only those names in its state) and updates those parameters bit for bit as the
// optimizer that keeps everything does under the same mask.
TEST(OptimizerCuda, OwnedStateKeepsOnlyTheOwnedSubset) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Fixture a(5), b(5);
  GemmContext gemm;
  std::vector<bool> owned(a.dev.size());
  for (size_t i = 0; i < owned.size(); i++) owned[i] = i % 2 == 0;
  CudaOptimizer full(a.dev, settings(), gemm, a.st);
  CudaOptimizerOptions oo;
  oo.owned_state = owned;
  CudaOptimizer part(b.dev, settings(), gemm, b.st, oo);
  EXPECT_LT(part.state_bytes(), full.state_bytes());
  Rng r1(31), r2(31);
  for (int s = 0; s < 3; s++) {
    a.new_grads(r1);
    b.new_grads(r2);
    full.step(2e-3, 1.0f, owned);
    part.step(2e-3, 1.0f, owned);
  }
  for (size_t i = 0; i < a.dev.size(); i++) {
    const auto ma = a.master(i), mb = b.master(i);
    EXPECT_EQ(0, std::memcmp(ma.data(), mb.data(), ma.size() * 4)) << a.dev[i].name;
  }
  std::set<std::string> names;
  for (auto& [n, t] : part.state_tensors()) names.insert(n);
  std::set<std::string> want;
  for (size_t i = 0; i < a.dev.size(); i++)
    if (owned[i])
      for (const char* pre :
           {"optim.adamw.exp_avg.", "optim.adamw.exp_avg_sq.", "optim.muon.momentum."})
        want.insert(pre + a.dev[i].name);
  size_t kept = 0;
  for (auto& [n, t] : full.state_tensors()) {
    EXPECT_EQ(names.count(n) == 1, want.count(n) == 1) << n;
    kept += want.count(n);
  }
  EXPECT_EQ(kept, names.size());
  EXPECT_GT(kept, 0u);
  // Updating a parameter whose state it does not keep is refused.
  EXPECT_THROW(part.step(2e-3), Error);
}

}  // namespace
}  // namespace zaya::cuda

namespace zaya::cuda {
namespace {

// ZeRO-1 slices on the GPU: two "ranks" each keep state for their dim-0 slices (embedding rows,
// experts of the 3-D Muon stacks) and some whole tensors; together they update every parameter
// bit for bit as one optimizer keeping everything does, their state is the full state's slices
// bit for bit, their gradient norms add up to the full one, and a slice of a single Muon matrix
// is refused.
TEST(OptimizerCuda, OwnedSlicesUpdateTheirPartBitForBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto sp = specs();
  const size_t np = sp.size();
  // Per rank, per parameter: owned?, and the slice (count < 0: whole).
  std::vector<std::vector<bool>> own(2, std::vector<bool>(np, false));
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cut(
      2, std::vector<std::pair<int64_t, int64_t>>(np, {0, -1}));
  auto set_slice = [&](const std::string& name, int64_t split) {
    for (size_t i = 0; i < np; i++)
      if (sp[i].name == name) {
        own[0][i] = own[1][i] = true;
        cut[0][i] = {0, split};
        cut[1][i] = {split, sp[i].shape[0] - split};
        return;
      }
    FAIL() << name;
  };
  set_slice("model.embed_tokens.weight", 40);
  set_slice("model.layers.0.mlp.experts.gate_up_proj", 2);
  set_slice("model.layers.0.mlp.experts.down_proj", 1);
  int next = 0;
  for (size_t i = 0; i < np; i++)
    if (!own[0][i] && !own[1][i] && sp[i].name.find("balancing") == std::string::npos)
      own[size_t(next++ % 2)][i] = true;

  Fixture a(7), b0(7), b1(7);
  Fixture* bs[2] = {&b0, &b1};
  GemmContext gemm;
  CudaOptimizer full(a.dev, settings(), gemm, a.st);
  std::vector<std::unique_ptr<CudaOptimizer>> part;
  for (int r = 0; r < 2; r++) {
    CudaOptimizerOptions oo;
    oo.owned_state = own[size_t(r)];
    oo.owned_slices = cut[size_t(r)];
    part.push_back(std::make_unique<CudaOptimizer>(bs[r]->dev, settings(), gemm, bs[r]->st, oo));
  }
  EXPECT_LT(part[0]->state_bytes() + part[1]->state_bytes(), 2 * full.state_bytes());
  Rng ra(41), rb0(41), rb1(41);
  Rng* rb[2] = {&rb0, &rb1};
  for (int s = 0; s < 3; s++) {
    a.new_grads(ra);
    for (int r = 0; r < 2; r++) bs[r]->new_grads(*rb[r]);
    const double whole = full.grad_sq_norm();
    const double split = part[0]->grad_sq_norm(own[0]) + part[1]->grad_sq_norm(own[1]);
    EXPECT_NEAR(split, whole, 1e-12 * whole) << "step " << s;
    full.step(2e-3, 0.75f);
    for (int r = 0; r < 2; r++) part[size_t(r)]->step(2e-3, 0.75f, own[size_t(r)]);
  }
  // Each rank's part of every parameter (master and bf16 copy) equals the full optimizer's.
  for (size_t i = 0; i < np; i++) {
    const auto ma = a.master(i);
    const int64_t per = a.dev[i].numel / sp[i].shape[0];
    for (int r = 0; r < 2; r++) {
      if (!own[size_t(r)][i]) continue;
      const auto [first, count] = cut[size_t(r)][i];
      const size_t lo = count < 0 ? 0 : size_t(first * per);
      const size_t n = count < 0 ? ma.size() : size_t(count * per);
      const auto mb = bs[r]->master(i);
      EXPECT_EQ(0, std::memcmp(ma.data() + lo, mb.data() + lo, n * 4))
          << sp[i].name << " on rank " << r;
      if (a.dev[i].copy) {
        const auto ca =
            test_util::download(reinterpret_cast<const uint16_t*>(a.dev[i].copy), ma.size(), a.st);
        const auto cb = test_util::download(reinterpret_cast<const uint16_t*>(bs[r]->dev[i].copy),
                                            ma.size(), bs[r]->st);
        EXPECT_EQ(0, std::memcmp(ca.data() + lo, cb.data() + lo, n * 2))
            << sp[i].name << " (bf16) on rank " << r;
      }
    }
  }
  // The state: a slice's tensors are [count, ...] and equal the full state's rows.
  std::map<std::string, Tensor> whole_state;
  for (auto& [n, t] : full.state_tensors()) whole_state.emplace(n, t);
  size_t sliced = 0;
  for (int r = 0; r < 2; r++)
    for (auto& [n, t] : part[size_t(r)]->state_tensors()) {
      ASSERT_TRUE(whole_state.count(n)) << n;
      const Tensor& w = whole_state.at(n);
      size_t i = 0;
      while (i < np && n.substr(n.size() - sp[i].name.size()) != sp[i].name) i++;
      ASSERT_LT(i, np) << n;
      const auto [first, count] = cut[size_t(r)][i];
      const Tensor want = count < 0 ? w : w.slice(0, first, first + count).clone();
      ASSERT_EQ(t.shape(), want.shape()) << n << " on rank " << r;
      EXPECT_EQ(0, std::memcmp(t.f32(), want.f32(), size_t(t.numel()) * 4)) << n;
      sliced += count >= 0;
    }
  EXPECT_EQ(sliced, 2u * (2 + 1 + 1)) << "embedding moments (2 each) and two momenta per rank";
  // A resumed rank takes its sliced state back.
  CudaOptimizerOptions oo;
  oo.owned_state = own[0];
  oo.owned_slices = cut[0];
  CudaOptimizer again(b0.dev, settings(), gemm, b0.st, oo);
  EXPECT_NO_THROW(again.load_state(part[0]->state_tensors(), part[0]->steps()));
  // One Muon matrix cannot be sliced.
  auto bad = cut[0];
  auto bad_own = own[0];
  for (size_t i = 0; i < np; i++)
    if (sp[i].name.find("q_proj") != std::string::npos) {
      bad[i] = {0, 10};
      bad_own[i] = true;
    }
  oo.owned_state = bad_own;
  oo.owned_slices = bad;
  EXPECT_THROW(CudaOptimizer(b0.dev, settings(), gemm, b0.st, oo), Error);
}

}  // namespace
}  // namespace zaya::cuda
