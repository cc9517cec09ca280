// CudaOptimizer against the CPU Optimizer (label gpu; skipped without a CUDA device): the same
// parameter rules and state names, AdamW updates to fp32 rounding, Muon updates to fp32 rounding
// with fp32 Newton–Schulz and within bf16 tolerance with bf16 Newton–Schulz, across wide, tall and
// 3-D (per-expert) matrices, a frozen parameter, a skipped balancing bias, a clip factor, the grad
// norm, the bf16 copies, and a state export/import that continues bit-exactly.
#include <gtest/gtest.h>

#include <set>

#include <cmath>
#include <cstring>

#include "engine/cuda/optim_cuda.h"
#include "core/dtype.h"
#include "core/rng.h"
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
      for (const char* pre : {"optim.adamw.exp_avg.", "optim.adamw.exp_avg_sq.",
                              "optim.muon.momentum."})
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
