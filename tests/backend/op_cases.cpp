// The cases of the op-test registry (op_registry.h): one add_* function per op of
// src/backend/cpu/ops.h, each building one case from its sizes (fresh inputs per seed) with the
// fp32 CPU op, the double reference, the CPU backward and, in the GPU test binary
// (ZAYA_OP_TESTS_CUDA), the CUDA variants of the op. This file is compiled into both zaya_tests and
// zaya_gpu_tests; the table is the same in both, so every case runs on the CPU in the CPU suite and
// on the GPU as well where it has a CUDA variant.
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "op_registry.h"

#if ZAYA_OP_TESTS_CUDA
#include "../gpu/gpu_test_util.h"
#include "backend/cuda/ops.h"
#endif

namespace zaya::op_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor as_tensor(const Buf& v, const Shape& s, DType dt = DType::F32) {
  Tensor t = Tensor::from_vector(v, s);
  return dt == DType::F32 ? t : t.to(dt);
}
// The values a float buffer takes once stored in dt (what the op reads from a BF16/F16 tensor).
Buf stored_as(const Buf& v, DType dt) {
  if (dt == DType::F32) return v;
  Tensor t = as_tensor(v, {int64_t(v.size())}, dt);
  Buf out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = t.get(int64_t(i));
  return out;
}
std::string dt_name(DType dt) {
  return dt == DType::F32 ? "f32" : dt == DType::BF16 ? "bf16" : "f16";
}

#if ZAYA_OP_TESTS_CUDA
// Device side of the CUDA variants: buffers in a test_util::DeviceArena, freed when the variant
// returns, and copies that are complete when they return (gpu_test_util.h).
using cuda::bf16;
cuda::Workspace workspace(test_util::DeviceArena& arena, size_t bytes) {
  return cuda::Workspace{arena.alloc<char>(bytes), bytes, 0};
}
Buf get(const float* p, int64_t n) {
  return test_util::download(p, sz(n));
}
Buf get(const bf16* p, int64_t n) {
  return test_util::download_bf16(p, sz(n));
}
void sync() {
  const cudaError_t e = cudaDeviceSynchronize();
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}
#endif

// ---- cases
// Each add_* builds one case from its sizes; seeds differ per case so inputs are fresh.

void add_linear(Cases& cs, uint64_t seed, int64_t N, int64_t K, int64_t O, DType wt, bool bias,
                bool acc) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("linear_{}_N{}_K{}_O{}{}{}", dt_name(wt), N, K, O, bias ? "_bias" : "",
                       acc ? "_acc" : "");
  // x, W (already on the dtype's grid), bias, y0 (the buffer's prior content when accumulating).
  c.in = {{"x", randn(r, N * K), acc ? Grad::Accumulate : Grad::Overwrite},
          {"w", stored_as(randn(r, O * K, 1.0f / std::sqrt(float(K))), wt), Grad::Accumulate},
          {"b", bias ? randn(r, O) : Buf{}, bias ? Grad::Accumulate : Grad::None},
          {"y0", acc ? randn(r, N * O) : Buf{}, Grad::None}};
  c.out = {{"y"}};
  c.op = [=](const Bufs& in) {
    Buf y = acc ? in[3] : Buf(sz(N * O), kNaN);
    cpu::linear(y.data(), in[0].data(), as_tensor(in[1], {O, K}, wt), bias ? in[2].data() : nullptr,
                N, K, O, acc);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {
    DBuf y(sz(N * O));
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < O; o++) {
        double s = (acc ? in[3][n * O + o] : 0.0) + (bias ? in[2][o] : 0.0);
        for (int64_t k = 0; k < K; k++) s += in[0][n * K + k] * in[1][o * K + k];
        y[n * O + o] = s;
      }
    return DBufs{y};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    const Tensor w = as_tensor(in[1], {O, K}, wt);
    cpu::linear_backward_input(g[0].data(), dy[0].data(), w, N, K, O, acc);
    cpu::linear_backward_weight(g[1].data(), bias ? g[2].data() : nullptr, dy[0].data(),
                                in[0].data(), N, K, O);
  };
  cs.push_back(c);
}

void add_embedding(Cases& cs, uint64_t seed, int64_t N, int64_t V, int64_t D, DType dt) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("embedding_{}_N{}_V{}_D{}", dt_name(dt), N, V, D);
  std::vector<int32_t> ids(sz(N));
  for (auto& i : ids) i = int32_t(randint(r, V));  // N > V: repeated ids accumulate
  c.in = {{"table", stored_as(randn(r, V * D), dt), Grad::Accumulate}};
  c.out = {{"y"}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(N * D), kNaN);
    cpu::embedding(y.data(), ids.data(), as_tensor(in[0], {V, D}, dt), N, D);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {
    DBuf y(sz(N * D));
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < D; i++) y[n * D + i] = in[0][ids[n] * D + i];
    return DBufs{y};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    cpu::embedding_backward(g[0].data(), dy[0].data(), ids.data(), N, D, V);
  };
#if ZAYA_OP_TESTS_CUDA
  if (dt == DType::BF16) {
    // The CUDA embedding is fused with the input affine (embed_affine_fwd/bwd): with s = 1 and
    // b = 0 it is the plain lookup (exact products), and its dtable is embedding_backward's.
    CudaVariant v;
    v.out_bf16 = {false};
    v.fwd = [=](const Bufs& in) {
      test_util::DeviceArena dv;
      float* h = dv.alloc<float>(sz(N * D));
      int32_t* flag = dv.up(std::vector<int32_t>{0});
      cuda::embed_affine_fwd(h, dv.up(ids), dv.up_bf16(in[0]), dv.up(Buf(sz(D), 1.0f)),
                             dv.up(Buf(sz(D), 0.0f)), flag, N, D, V, nullptr);
      sync();
      EXPECT_EQ(test_util::download(flag, 1)[0], 0) << "no id is out of range";
      return Bufs{get(h, N * D)};
    };
    v.bwd_repeatable = true;  // tokens sorted by id, each row summed in token order
    v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
      test_util::DeviceArena dv;
      cuda::Workspace ws = workspace(dv, cuda::embed_affine_bwd_workspace_bytes(N, D, V));
      float* dtable = dv.up(g[0]);
      cuda::embed_affine_bwd(dtable, dv.alloc<float>(sz(D)), dv.alloc<float>(sz(D)), dv.up(dy[0]),
                             dv.up(ids), dv.up_bf16(in[0]), dv.up(Buf(sz(D), 1.0f)),
                             dv.up(Buf(sz(D), 0.0f)), N, D, V, ws, nullptr);
      sync();
      g[0] = get(dtable, V * D);
    };
    c.cuda.push_back(v);
  }
#endif
  cs.push_back(c);
}

void add_rmsnorm(Cases& cs, uint64_t seed, int64_t N, int64_t D) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("rmsnorm_N{}_D{}", N, D);
  const float eps = 1e-5f;
  c.in = {{"x", randn(r, N * D, 2.0f), Grad::Overwrite},
          {"w", randu(r, D, 0.5f, 1.5f), Grad::Accumulate}};
  c.out = {{"y"}, {"rstd", false}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(N * D), kNaN), rstd(sz(N), kNaN);
    cpu::rmsnorm(y.data(), rstd.data(), in[0].data(), in[1].data(), eps, N, D);
    return Bufs{y, rstd};
  };
  c.ref = [=](const DBufs& in) {
    DBuf y(sz(N * D)), rstd(sz(N));
    for (int64_t n = 0; n < N; n++) {
      double ms = 0;
      for (int64_t i = 0; i < D; i++) ms += in[0][n * D + i] * in[0][n * D + i];
      rstd[n] = 1.0 / std::sqrt(ms / double(D) + double(eps));
      for (int64_t i = 0; i < D; i++) y[n * D + i] = in[1][i] * in[0][n * D + i] * rstd[n];
    }
    return DBufs{y, rstd};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    Buf y(sz(N * D)), rstd(sz(N));
    cpu::rmsnorm(y.data(), rstd.data(), in[0].data(), in[1].data(), eps, N, D);
    cpu::rmsnorm_backward(g[0].data(), g[1].data(), dy[0].data(), in[0].data(), in[1].data(),
                          rstd.data(), N, D);
  };
#if ZAYA_OP_TESTS_CUDA
  // Two variants, as the model calls them: y bf16 (a GEMM operand) with the backward from a bf16
  // dy writing dx (=); y fp32 (the router's norm) with the fp32-dy backward accumulating into dx
  // (+=). Each backward runs on its forward's own rstd; dw (+=) sums are deterministic.
  for (bool f32 : {false, true}) {
    CudaVariant v;
    v.name = f32 ? "f32" : "bf16";
    v.out_bf16 = {!f32, false};
    v.fwd = [=](const Bufs& in) {
      test_util::DeviceArena dv;
      float* rstd = dv.alloc<float>(sz(N));
      Buf y;
      if (f32) {  // y from a call that does not save rstd (rstd null), rstd from a second one
        float *yd = dv.alloc<float>(sz(N * D)), *x = dv.up(in[0]), *w = dv.up(in[1]);
        cuda::rmsnorm_fwd_f32(yd, nullptr, x, w, eps, N, D, nullptr);
        cuda::rmsnorm_fwd_f32(dv.alloc<float>(sz(N * D)), rstd, x, w, eps, N, D, nullptr);
        sync();
        y = get(yd, N * D);
      } else {
        bf16* yd = dv.alloc<bf16>(sz(N * D));
        cuda::rmsnorm_fwd(yd, rstd, dv.up(in[0]), dv.up(in[1]), eps, N, D, nullptr);
        sync();
        y = get(yd, N * D);
      }
      return Bufs{y, get(rstd, N)};
    };
    v.grads = {f32 ? Grad::Accumulate : Grad::Overwrite, Grad::Accumulate};
    v.bwd_repeatable = true;
    v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
      test_util::DeviceArena dv;
      cuda::Workspace ws = workspace(dv, cuda::rmsnorm_bwd_workspace_bytes(N, D));
      float *x = dv.up(in[0]), *w = dv.up(in[1]), *rstd = dv.alloc<float>(sz(N));
      float *dx = dv.up(g[0]), *dw = dv.up(g[1]);
      cuda::rmsnorm_fwd_f32(dv.alloc<float>(sz(N * D)), rstd, x, w, eps, N, D, nullptr);
      if (f32)
        cuda::rmsnorm_bwd_f32(dx, dw, dv.up(dy[0]), x, w, rstd, true, N, D, ws, nullptr);
      else
        cuda::rmsnorm_bwd(dx, dw, dv.up_bf16(dy[0]), x, w, rstd, false, N, D, ws, nullptr);
      sync();
      g[0] = get(dx, N * D);
      g[1] = get(dw, D);
    };
    c.cuda.push_back(v);
  }
#endif
  cs.push_back(c);
}

void add_residual_scale(Cases& cs, uint64_t seed, int64_t N, int64_t D) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("residual_scale_N{}_D{}", N, D);
  // a on the bf16 grid: the CUDA kernels read the block output a in bf16.
  c.in = {{"a", randn_bf16(r, N * D), Grad::Overwrite}, {"h", randn(r, N * D), Grad::Overwrite},
          {"hs", randn(r, D), Grad::Accumulate},        {"hb", randn(r, D), Grad::Accumulate},
          {"rs", randn(r, D), Grad::Accumulate},        {"rb", randn(r, D), Grad::Accumulate}};
  c.out = {{"out"}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(N * D), kNaN);
    cpu::residual_scale(y.data(), in[0].data(), in[1].data(), in[2].data(), in[3].data(),
                        in[4].data(), in[5].data(), N, D);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {
    DBuf y(sz(N * D));
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < D; i++) {
        const int64_t j = n * D + i;
        y[j] = (in[0][j] + in[3][i]) * in[2][i] + (in[1][j] + in[5][i]) * in[4][i];
      }
    return DBufs{y};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    cpu::residual_scale_backward(g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(),
                                 g[5].data(), dy[0].data(), in[0].data(), in[1].data(),
                                 in[2].data(), in[3].data(), in[4].data(), in[5].data(), N, D);
  };
#if ZAYA_OP_TESTS_CUDA
  // Forward: the fused residual + norm kernel without its norm (y null); backward: da bf16 (=),
  // dh fp32 (=), the four parameter sums (+=, deterministic).
  CudaVariant v;
  v.out_bf16 = {false};
  v.fwd = [=](const Bufs& in) {
    test_util::DeviceArena dv;
    float* out = dv.alloc<float>(sz(N * D));
    cuda::residual_scale_rmsnorm_fwd(out, nullptr, nullptr, dv.up_bf16(in[0]), dv.up(in[1]),
                                     dv.up(in[2]), dv.up(in[3]), dv.up(in[4]), dv.up(in[5]),
                                     nullptr, 1e-5f, N, D, nullptr);
    sync();
    return Bufs{get(out, N * D)};
  };
  v.grad_bf16 = {true, false, false, false, false, false};
  v.bwd_repeatable = true;
  v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    test_util::DeviceArena dv;
    cuda::Workspace ws = workspace(dv, cuda::residual_scale_bwd_workspace_bytes(N, D));
    bf16* da = dv.alloc<bf16>(sz(N * D));
    float* dh = dv.alloc<float>(sz(N * D));
    float *dhs = dv.up(g[2]), *dhb = dv.up(g[3]), *drs = dv.up(g[4]), *drb = dv.up(g[5]);
    cuda::residual_scale_bwd(da, dh, dhs, dhb, drs, drb, dv.up(dy[0]), dv.up_bf16(in[0]),
                             dv.up(in[1]), dv.up(in[2]), dv.up(in[3]), dv.up(in[4]), dv.up(in[5]),
                             N, D, ws, nullptr);
    sync();
    g = {get(da, N * D), get(dh, N * D), get(dhs, D), get(dhb, D), get(drs, D), get(drb, D)};
  };
  c.cuda.push_back(v);
#endif
  cs.push_back(c);
}

void add_affine(Cases& cs, uint64_t seed, int64_t N, int64_t D) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("affine_N{}_D{}", N, D);
  c.in = {
      {"x", randn_bf16(r, N * D)}, {"s", randn(r, D)}, {"b", randn(r, D)}};  // x: CUDA reads bf16
  c.out = {{"y"}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(N * D), kNaN);
    cpu::affine(y.data(), in[0].data(), in[1].data(), in[2].data(), N, D);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {
    DBuf y(sz(N * D));
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < D; i++) y[n * D + i] = (in[0][n * D + i] + in[2][i]) * in[1][i];
    return DBufs{y};
  };
#if ZAYA_OP_TESTS_CUDA
  // The CUDA affine is fused with the embedding lookup (embed_affine_fwd): x as an N-row bf16
  // table looked up by the ids 0..N-1 is the affine of x.
  CudaVariant v;
  v.out_bf16 = {false};
  v.fwd = [=](const Bufs& in) {
    test_util::DeviceArena dv;
    std::vector<int32_t> ids(sz(N));
    for (int64_t n = 0; n < N; n++) ids[sz(n)] = int32_t(n);
    float* y = dv.alloc<float>(sz(N * D));
    int32_t* flag = dv.up(std::vector<int32_t>{0});
    cuda::embed_affine_fwd(y, dv.up(ids), dv.up_bf16(in[0]), dv.up(in[1]), dv.up(in[2]), flag, N, D,
                           N, nullptr);
    sync();
    return Bufs{get(y, N * D)};
  };
  c.cuda.push_back(v);
#endif
  cs.push_back(c);
}

void add_gelu(Cases& cs, uint64_t seed, int64_t n) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("gelu_n{}", n);
  c.in = {{"x", randn(r, n, 2.0f), Grad::Overwrite}};
  c.out = {{"y"}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(n), kNaN);
    cpu::gelu(y.data(), in[0].data(), n);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {  // exact GELU: x Φ(x)
    DBuf y(sz(n));
    for (int64_t i = 0; i < n; i++)
      y[i] = 0.5 * in[0][i] * (1.0 + std::erf(in[0][i] / std::sqrt(2.0)));
    return DBufs{y};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    cpu::gelu_backward(g[0].data(), dy[0].data(), in[0].data(), n);
  };
#if ZAYA_OP_TESTS_CUDA
  // bias_gelu without a bias, over n values as one row.
  CudaVariant v;
  v.out_bf16 = {false};
  v.fwd = [=](const Bufs& in) {
    test_util::DeviceArena dv;
    float* y = dv.alloc<float>(sz(n));
    cuda::bias_gelu_fwd(y, dv.up(in[0]), nullptr, 1, n, nullptr);
    sync();
    return Bufs{get(y, n)};
  };
  v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    test_util::DeviceArena dv;
    cuda::Workspace ws = workspace(dv, cuda::bias_gelu_bwd_workspace_bytes(1, n));
    float* dx = dv.alloc<float>(sz(n));
    cuda::bias_gelu_bwd(dx, nullptr, dv.up(dy[0]), dv.up(in[0]), nullptr, 1, n, ws, nullptr);
    sync();
    g[0] = get(dx, n);
  };
  c.cuda.push_back(v);
#endif
  cs.push_back(c);
}

// GELU of x + b with a bias per column (the contract of cuda::bias_gelu_fwd/bwd): the CPU op is
// cpu::gelu on x + b, its backward cpu::gelu_backward and db += Σ_n dx.
void add_bias_gelu(Cases& cs, uint64_t seed, int64_t N, int64_t F, bool bias) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("bias_gelu_N{}_F{}{}", N, F, bias ? "_bias" : "");
  c.in = {{"x", randn(r, N * F, 1.5f), Grad::Overwrite},
          {"b", bias ? randn(r, F, 0.5f) : Buf{}, bias ? Grad::Accumulate : Grad::None}};
  c.out = {{"y"}};
  auto shifted = [=](const Bufs& in) {
    Buf xb = in[0];
    if (bias)
      for (int64_t i = 0; i < N * F; i++) xb[sz(i)] += in[1][sz(i % F)];
    return xb;
  };
  c.op = [=](const Bufs& in) {
    Buf y(sz(N * F), kNaN);
    cpu::gelu(y.data(), shifted(in).data(), N * F);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {
    DBuf y(sz(N * F));
    for (int64_t i = 0; i < N * F; i++) {
      const double x = in[0][sz(i)] + (bias ? in[1][sz(i % F)] : 0.0);
      y[sz(i)] = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    }
    return DBufs{y};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    cpu::gelu_backward(g[0].data(), dy[0].data(), shifted(in).data(), N * F);
    if (bias)
      for (int64_t i = 0; i < N * F; i++) g[1][sz(i % F)] += g[0][sz(i)];
  };
#if ZAYA_OP_TESTS_CUDA
  CudaVariant v;
  v.out_bf16 = {false};
  v.fwd = [=](const Bufs& in) {
    test_util::DeviceArena dv;
    float* y = dv.alloc<float>(sz(N * F));
    cuda::bias_gelu_fwd(y, dv.up(in[0]), bias ? dv.up(in[1]) : nullptr, N, F, nullptr);
    sync();
    return Bufs{get(y, N * F)};
  };
  v.bwd_repeatable = true;  // db: a deterministic column reduction
  v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    test_util::DeviceArena dv;
    cuda::Workspace ws = workspace(dv, cuda::bias_gelu_bwd_workspace_bytes(N, F));
    float* dx = dv.alloc<float>(sz(N * F));
    float* db = bias ? dv.up(g[1]) : nullptr;
    cuda::bias_gelu_bwd(dx, db, dv.up(dy[0]), dv.up(in[0]), bias ? dv.up(in[1]) : nullptr, N, F, ws,
                        nullptr);
    sync();
    g[0] = get(dx, N * F);
    if (bias) g[1] = get(db, F);
  };
  c.cuda.push_back(v);
#endif
  cs.push_back(c);
}

void add_swiglu(Cases& cs, uint64_t seed, int64_t N, int64_t I) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("swiglu_N{}_I{}", N, I);
  c.in = {{"gu", randn_bf16(r, N * 2 * I, 2.0f), Grad::Overwrite}};
  c.out = {{"y"}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(N * I), kNaN);
    cpu::swiglu(y.data(), in[0].data(), N, I);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {  // silu(gate) * up on packed [gate | up] rows
    DBuf y(sz(N * I));
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < I; i++) {
        const double g = in[0][n * 2 * I + i], u = in[0][n * 2 * I + I + i];
        y[n * I + i] = g / (1.0 + std::exp(-g)) * u;
      }
    return DBufs{y};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    cpu::swiglu_backward(g[0].data(), dy[0].data(), in[0].data(), N, I);
  };
#if ZAYA_OP_TESTS_CUDA
  CudaVariant v;  // bf16 in, bf16 out, fp32 math
  v.out_bf16 = {true};
  v.grad_bf16 = {true};
  v.fwd = [=](const Bufs& in) {
    test_util::DeviceArena dv;
    bf16* y = dv.alloc<bf16>(sz(N * I));
    cuda::swiglu_fwd(y, dv.up_bf16(in[0]), N, I, nullptr);
    sync();
    return Bufs{get(y, N * I)};
  };
  v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    test_util::DeviceArena dv;
    bf16* dgu = dv.alloc<bf16>(sz(N * 2 * I));
    cuda::swiglu_bwd(dgu, dv.up_bf16(dy[0]), dv.up_bf16(in[0]), N, I, nullptr);
    sync();
    g[0] = get(dgu, N * 2 * I);
  };
  c.cuda.push_back(v);
#endif
  cs.push_back(c);
}

// chunkings: the vocabulary splits [v0, v1, ..., V] that the CUDA variants fold chunk by chunk
// (one variant per splitting; none: the CPU op only).
void add_cross_entropy(Cases& cs, uint64_t seed, int64_t N, int64_t V,
                       const std::vector<std::vector<int64_t>>& chunkings = {}) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("cross_entropy_N{}_V{}", N, V);
  std::vector<int32_t> tgt(sz(N));
  for (int64_t n = 0; n < N; n++) tgt[n] = n % 3 == 1 ? -100 : int32_t(randint(r, V));
  tgt[sz(N - 1)] = -1;  // both -1 and -100 style ignore indices
  c.in = {{"logits", randn(r, N * V, 3.0f), Grad::Overwrite}};
  // Counted targets whose row loss (lse − target logit) is below 0.5 are redrawn: a mean of such
  // losses is a small difference of large fp32 values, which no fp32 kernel gives to 1e-5.
  for (int64_t n = 0; n < N; n++) {
    const float* l = c.in[0].data.data() + n * V;
    double mx = l[0], z = 0;
    for (int64_t v = 1; v < V; v++) mx = std::max(mx, double(l[v]));
    for (int64_t v = 0; v < V; v++) z += std::exp(double(l[v]) - mx);
    while (tgt[n] >= 0 && mx + std::log(z) - l[tgt[n]] < 0.5) tgt[n] = int32_t(randint(r, V));
  }
  c.out = {{"loss"}};
  c.op = [=](const Bufs& in) {
    return Bufs{{float(cpu::cross_entropy(nullptr, in[0].data(), tgt.data(), N, V))}};
  };
  c.ref = [=](const DBufs& in) {
    double sum = 0;
    int count = 0;
    for (int64_t n = 0; n < N; n++) {
      if (tgt[n] < 0) continue;
      double z = 0;
      for (int64_t v = 0; v < V; v++) z += std::exp(in[0][n * V + v]);
      sum += std::log(z) - in[0][n * V + tgt[n]];
      count++;
    }
    return DBufs{{count ? sum / count : 0.0}};  // every target ignored: 0 (the op's contract)
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    // dlogits is d(mean loss)/dlogits; L = w·loss scales it by w.
    cpu::cross_entropy(g[0].data(), in[0].data(), tgt.data(), N, V);
    for (float& x : g[0]) x *= dy[0][0];
  };
#if ZAYA_OP_TESTS_CUDA
  // The chunked CUDA kernels composed into the op's contract: ce_init, ce_chunk_stats per chunk
  // (each chunk's logits a separate [N, Vc] buffer, as the LM-head GEMM produces them),
  // ce_finalize and sum_loss give the mean (0 without counted targets); backward, ce_chunk_grad
  // per chunk with scale = dL/dloss / count writes dlogits in bf16.
  int64_t count = 0;
  for (int32_t t : tgt) count += t >= 0;
  for (const std::vector<int64_t>& edges : chunkings) {
    auto chunk = [=](const Buf& l, size_t k) {
      const int64_t v0 = edges[k], Vc = edges[k + 1] - v0;
      Buf out(sz(N * Vc));
      for (int64_t n = 0; n < N; n++) std::copy_n(l.data() + n * V + v0, Vc, out.data() + n * Vc);
      return out;
    };
    // Runs the statistics pass; returns the chunks' device logits and fills lse.
    auto stats = [=](test_util::DeviceArena& dv, const Buf& l, const int32_t* t, float* loss,
                     float* lse) {
      float *mx = dv.alloc<float>(sz(N)), *se = dv.alloc<float>(sz(N)),
            *tl = dv.alloc<float>(sz(N));
      std::vector<float*> chunks;
      cuda::ce_init(mx, se, tl, N, nullptr);
      for (size_t k = 0; k + 1 < edges.size(); k++) {
        chunks.push_back(dv.up(chunk(l, k)));
        cuda::ce_chunk_stats(mx, se, tl, chunks.back(), t, edges[k], N, edges[k + 1] - edges[k],
                             nullptr);
      }
      cuda::ce_finalize(loss, lse, mx, se, tl, t, N, nullptr);
      return chunks;
    };
    CudaVariant v;
    v.name = fmt::format("chunks{}", edges.size() - 1);
    v.out_bf16 = {false};
    v.fwd = [=](const Bufs& in) {
      test_util::DeviceArena dv;
      int32_t* t = dv.up(tgt);
      float *loss = dv.alloc<float>(sz(N)), *lse = dv.alloc<float>(sz(N));
      stats(dv, in[0], t, loss, lse);
      cuda::Workspace ws = workspace(dv, size_t(1) << 20);
      double* sum = dv.alloc<double>(1);
      int32_t* cnt = dv.alloc<int32_t>(1);
      cuda::sum_loss(sum, cnt, loss, t, N, ws, nullptr);
      sync();
      const int32_t got_count = test_util::download(cnt, 1)[0];
      EXPECT_EQ(got_count, int32_t(count)) << "sum_loss count";
      const double total = test_util::download(sum, 1)[0];
      if (count == 0) EXPECT_EQ(total, 0.0) << "sum_loss without counted targets";
      return Bufs{{float(got_count ? total / got_count : 0.0)}};
    };
    v.grad_bf16 = {true};
    v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
      test_util::DeviceArena dv;
      int32_t* t = dv.up(tgt);
      float *loss = dv.alloc<float>(sz(N)), *lse = dv.alloc<float>(sz(N));
      const std::vector<float*> chunks = stats(dv, in[0], t, loss, lse);
      const float scale = count ? dy[0][0] / float(count) : 0.0f;
      for (size_t k = 0; k + 1 < edges.size(); k++) {
        const int64_t v0 = edges[k], Vc = edges[k + 1] - v0;
        bf16* dl = dv.alloc<bf16>(sz(N * Vc));
        cuda::ce_chunk_grad(dl, chunks[k], lse, t, scale, v0, N, Vc, nullptr);
        sync();
        const Buf got = get(dl, N * Vc);
        for (int64_t n = 0; n < N; n++)
          std::copy_n(got.data() + n * Vc, Vc, g[0].data() + n * V + v0);
      }
    };
    c.cuda.push_back(v);
  }
#endif
  cs.push_back(c);
}

void add_cca_mean_skip(Cases& cs, uint64_t seed, int64_t N, int64_t Hq, int64_t Hkv, int64_t d) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("cca_mean_skip_N{}_Hq{}_Hkv{}_d{}", N, Hq, Hkv, d);
  c.in = {{"q0", randn(r, N * Hq * d)}, {"k0", randn(r, N * Hkv * d)}};
  c.out = {{"mq"}, {"mk"}};
  c.op = [=](const Bufs& in) {
    Buf mq(sz(N * Hq * d), kNaN), mk(sz(N * Hkv * d), kNaN);
    cpu::cca_mean_skip(mq.data(), mk.data(), in[0].data(), in[1].data(), N, Hq, Hkv, d);
    return Bufs{mq, mk};
  };
  c.ref = [=](const DBufs& in) {
    const int64_t G = Hq / Hkv;
    DBuf mq(sz(N * Hq * d)), mk(sz(N * Hkv * d), 0.0);
    for (int64_t n = 0; n < N; n++)
      for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < d; i++) {
          const double m = (in[0][(n * Hq + h) * d + i] + in[1][(n * Hkv + h / G) * d + i]) / 2;
          mq[(n * Hq + h) * d + i] = m;
          mk[(n * Hkv + h / G) * d + i] += m / double(G);
        }
    return DBufs{mq, mk};
  };
  cs.push_back(c);
}

// Independent CCA conv reference: builds the padded input explicitly (history or zeros), then the
// depthwise conv over every padded window (so the intermediate at padded positions carries the
// depthwise bias), then the grouped conv. Returns {y [B,S,C], mid [B,M,C]}. With bf16_operands the
// grouped conv reads mid and wg rounded to bf16 (the naive bf16 computation of the CUDA kernel's
// tensor-core GEMM; mid is returned unrounded).
DBufs ref_cca_conv(const DBufs& in, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                   int64_t t1, bool bf16_operands = false) {
  const DBuf &x = in[0], &wdw = in[1], &bdw = in[2], &wg = in[3], &bg = in[4], &hist = in[5];
  const int64_t P = (t0 - 1) + (t1 - 1), L = S + P, M = L - t0 + 1;
  DBuf pad(sz(B * L * C), 0.0), mid(sz(B * M * C)), y(sz(B * S * C));
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < L; i++)
      for (int64_t c = 0; c < C; c++)
        pad[(b * L + i) * C + c] =
            i < P ? (hist.empty() ? 0.0 : hist[(b * P + i) * C + c]) : x[(b * S + i - P) * C + c];
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t c = 0; c < C; c++) {
        double s = bdw[c];
        for (int64_t j = 0; j < t0; j++) s += wdw[c * t0 + j] * pad[(b * L + i + j) * C + c];
        mid[(b * M + i) * C + c] = s;
      }
  const DBuf midg = bf16_operands ? rounded_bf16(mid) : mid;
  const DBuf wgg = bf16_operands ? rounded_bf16(wg) : wg;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < S; t++)
      for (int64_t c = 0; c < C; c++) {
        const int64_t g0 = (c / d) * d;  // first channel of c's group
        double s = bg[c];
        for (int64_t ci = 0; ci < d; ci++)
          for (int64_t j = 0; j < t1; j++)
            s += wgg[(c * d + ci) * t1 + j] * midg[(b * M + t + j) * C + g0 + ci];
        y[(b * S + t) * C + c] = s;
      }
  return {y, mid};
}

void add_cca_conv(Cases& cs, uint64_t seed, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, bool with_hist) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("cca_conv_B{}_S{}_C{}_d{}_t0{}_t1{}{}", B, S, C, d, t0, t1,
                       with_hist ? "_hist" : "");
  const int64_t P = (t0 - 1) + (t1 - 1), M = S + t1 - 1;
  // With history (a context-parallel chunk's halo), the history gets its gradient too (=).
  const Grad ow = Grad::Overwrite, ac = Grad::Accumulate;
  c.in = {{"x", randn_bf16(r, B * S * C), ow},  // the CUDA kernel reads x from bf16 rows
          {"wdw", randn(r, C * t0, 0.7f), ac},
          {"bdw", randn(r, C, 0.5f), ac},
          {"wg", randn(r, C * d * t1, 1.0f / std::sqrt(float(d * t1))), ac},
          {"bg", randn(r, C, 0.5f), ac},
          {"hist", with_hist ? randn(r, B * P * C) : Buf{}, with_hist ? ow : Grad::None}};
  c.out = {{"y"}, {"mid", false}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(B * S * C), kNaN), mid(sz(B * M * C), kNaN);
    cpu::cca_conv(y.data(), mid.data(), in[0].data(), with_hist ? in[5].data() : nullptr,
                  in[1].data(), in[2].data(), in[3].data(), in[4].data(), B, S, C, d, t0, t1);
    return Bufs{y, mid};
  };
  c.ref = [=](const DBufs& in) { return ref_cca_conv(in, B, S, C, d, t0, t1); };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    const float* hist = with_hist ? in[5].data() : nullptr;
    Buf y(sz(B * S * C)), mid(sz(B * M * C));
    cpu::cca_conv(y.data(), mid.data(), in[0].data(), hist, in[1].data(), in[2].data(),
                  in[3].data(), in[4].data(), B, S, C, d, t0, t1);
    cpu::cca_conv_backward(g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(),
                           dy[0].data(), in[0].data(), mid.data(), in[1].data(), in[3].data(), B, S,
                           C, d, t0, t1, hist, with_hist ? g[5].data() : nullptr);
  };
#if ZAYA_OP_TESTS_CUDA
  if (d % 32 == 0) {  // the head dims cca_conv_fwd/bwd support
    // The CUDA kernels read x as the first C channels of bf16 packed-projection rows (row stride
    // ld, here with 8 spare channels) and run the grouped conv (forward, and its data gradient
    // in backward) as tensor-core GEMMs on bf16-rounded operands with fp32 accumulation; the
    // naive bf16 computation rounds those operands (mid, wg; dy is on the bf16 grid already), as
    // tests/gpu/test_cuda_cca.cpp does for the CCA pipeline. The parameter gradients' fp32 term
    // is 1e-3·max|ref| there and here (sums over all tokens). Backward: the kernel ADDS dx into
    // dqkv's channels (bf16 read-add-write); here onto zeros, so the variant's dx is (=); the
    // add onto the mean-skip gradient is tested with the pipeline (test_cuda_cca.cpp).
    const int64_t ld = C + 8;
    auto pack = [=](const Buf& x) {
      Buf q(sz(B * S * ld), 0.0f);
      for (int64_t n = 0; n < B * S; n++) std::copy_n(x.data() + n * C, C, q.data() + n * ld);
      return q;
    };
    c.naive_bf16 = [=](const DBufs& in) { return ref_cca_conv(in, B, S, C, d, t0, t1, true); };
    c.bf16_bwd_rel = 1e-3;
    if (!with_hist)
      c.naive_bf16_grads = [=](const Bufs& in, const Bufs& dy) {
        auto rb = [](Buf v) {
          for (float& x : v) x = round_bf16(x);
          return v;
        };
        Buf y(sz(B * S * C)), mid(sz(B * M * C)), dx(sz(B * S * C));
        Buf dwdw(sz(C * t0), 0.0f), dbdw(sz(C), 0.0f), dwg(sz(C * d * t1), 0.0f), dbg(sz(C), 0.0f);
        cpu::cca_conv(y.data(), mid.data(), in[0].data(), nullptr, in[1].data(), in[2].data(),
                      in[3].data(), in[4].data(), B, S, C, d, t0, t1);
        cpu::cca_conv_backward(dx.data(), dwdw.data(), dbdw.data(), dwg.data(), dbg.data(),
                               rb(dy[0]).data(), in[0].data(), rb(mid).data(), in[1].data(),
                               rb(in[3]).data(), B, S, C, d, t0, t1);
        return widen({rb(dx), dwdw, dbdw, dwg, dbg, Buf{}});
      };
    CudaVariant v;
    v.out_bf16 = {true, false};  // y from bf16 operands; mid (the depthwise output) fp32
    v.fwd = [=](const Bufs& in) {
      test_util::DeviceArena dv;
      float *y = dv.alloc<float>(sz(B * S * C)), *mid = dv.alloc<float>(sz(B * M * C));
      cuda::cca_conv_fwd(y, mid, dv.up_bf16(pack(in[0])), ld, with_hist ? dv.up(in[5]) : nullptr,
                         false, dv.up(in[1]), dv.up(in[2]), dv.up(in[3]), dv.up(in[4]), B, S, C, d,
                         t0, t1, nullptr);
      sync();
      return Bufs{get(y, B * S * C), get(mid, B * M * C)};
    };
    if (!with_hist) {
      v.grads = {Grad::Overwrite,  Grad::Accumulate, Grad::Accumulate,
                 Grad::Accumulate, Grad::Accumulate, Grad::None};
      v.grad_bf16 = {true, true, true, true, true, false};
      v.bwd_repeatable = true;  // deterministic parameter-gradient reductions
      v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
        test_util::DeviceArena dv;
        cuda::Workspace ws = workspace(dv, cuda::cca_conv_bwd_workspace_bytes(B, S, C, d, t0, t1));
        bf16* qkv = dv.up_bf16(pack(in[0]));
        float *wdw = dv.up(in[1]), *bdw = dv.up(in[2]), *wg = dv.up(in[3]), *bg = dv.up(in[4]);
        float* mid = dv.alloc<float>(sz(B * M * C));
        cuda::cca_conv_fwd(dv.alloc<float>(sz(B * S * C)), mid, qkv, ld, nullptr, false, wdw, bdw,
                           wg, bg, B, S, C, d, t0, t1, nullptr);
        bf16* dqkv = dv.up_bf16(Buf(sz(B * S * ld), 0.0f));
        float *dwdw = dv.up(g[1]), *dbdw = dv.up(g[2]), *dwg = dv.up(g[3]), *dbg = dv.up(g[4]);
        cuda::cca_conv_bwd(dqkv, ld, dwdw, dbdw, dwg, dbg, dv.up(dy[0]), qkv, mid, wdw, wg, B, S, C,
                           d, t0, t1, ws, nullptr);
        sync();
        const Buf rows = get(dqkv, B * S * ld);
        for (int64_t n = 0; n < B * S; n++)
          std::copy_n(rows.data() + n * ld, C, g[0].data() + n * C);
        g[1] = get(dwdw, C * t0);
        g[2] = get(dbdw, C);
        g[3] = get(dwg, C * d * t1);
        g[4] = get(dbg, C);
      };
    }
    c.cuda.push_back(v);
  }
#endif
  cs.push_back(c);
}

void add_qk_norm(Cases& cs, uint64_t seed, int64_t N, int64_t H, int64_t d, bool temp) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("qk_norm_N{}_H{}_d{}{}", N, H, d, temp ? "_temp" : "");
  Buf x = randn(r, N * H * d);
  for (int64_t row = 0; row < N * H; row++) {  // rows of very different norms
    const float s = 0.05f + 4.0f * r.uniform();
    for (int64_t i = 0; i < d; i++) x[row * d + i] *= s;
  }
  c.in = {{"x", x, Grad::Overwrite},
          {"temp", temp ? randu(r, H, 0.5f, 2.0f) : Buf{}, temp ? Grad::Accumulate : Grad::None}};
  c.out = {{"y"}, {"norm", false}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(N * H * d), kNaN), nrm(sz(N * H), kNaN);
    cpu::qk_norm(y.data(), nrm.data(), in[0].data(), temp ? in[1].data() : nullptr, N, H, d);
    return Bufs{y, nrm};
  };
  c.ref = [=](const DBufs& in) {
    DBuf y(sz(N * H * d)), nrm(sz(N * H));
    for (int64_t n = 0; n < N; n++)
      for (int64_t h = 0; h < H; h++) {
        const double* v = in[0].data() + (n * H + h) * d;
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += v[i] * v[i];
        const double nv = std::max(std::sqrt(ss), double(FLT_EPSILON));
        nrm[n * H + h] = nv;
        for (int64_t i = 0; i < d; i++)
          y[(n * H + h) * d + i] = std::sqrt(double(d)) * v[i] / nv * (temp ? in[1][h] : 1.0);
      }
    return DBufs{y, nrm};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    Buf y(sz(N * H * d)), nrm(sz(N * H));
    const float* t = temp ? in[1].data() : nullptr;
    cpu::qk_norm(y.data(), nrm.data(), in[0].data(), t, N, H, d);
    cpu::qk_norm_backward(g[0].data(), temp ? g[1].data() : nullptr, dy[0].data(), in[0].data(),
                          nrm.data(), t, N, H, d);
  };
  cs.push_back(c);
}

void add_rope(Cases& cs, uint64_t seed, int64_t N, int64_t H, int64_t d, int64_t rd, double theta) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("rope_N{}_H{}_d{}_r{}_theta{}", N, H, d, rd, int64_t(theta));
  // Positions stay small: the op's angles are fp32 (as transformers), the reference's double.
  std::vector<int64_t> pos(sz(N));
  for (auto& p : pos) p = randint(r, 48);
  c.in = {{"x", randn(r, N * H * d), Grad::Overwrite}};
  c.out = {{"y"}};
  c.op = [=](const Bufs& in) {
    Buf y = in[0];
    cpu::rope(y.data(), pos.data(), theta, N, H, d, rd);
    return Bufs{y};
  };
  c.ref = [=](const DBufs& in) {
    // NeoX rotate-half on the first rd dims: pairs (j, j + rd/2) rotate by pos · θ^(−2j/rd).
    DBuf y = in[0];
    const int64_t h2 = rd / 2;
    for (int64_t n = 0; n < N; n++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < h2; j++) {
          const double a = double(pos[n]) * std::pow(theta, -2.0 * double(j) / double(rd));
          const double* v = in[0].data() + (n * H + h) * d;
          y[(n * H + h) * d + j] = v[j] * std::cos(a) - v[j + h2] * std::sin(a);
          y[(n * H + h) * d + j + h2] = v[j + h2] * std::cos(a) + v[j] * std::sin(a);
        }
    return DBufs{y};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    g[0] = dy[0];  // in place on the gradient
    cpu::rope_backward(g[0].data(), pos.data(), theta, N, H, d, rd);
  };
  cs.push_back(c);
}

// The naive bf16 attention, as an unfused framework computes it in bf16 (the bf16 rule's "naive"):
// scores q·kᵀ stored in bf16, scaled by 1/sqrt(d) in bf16, probabilities P = softmax stored in
// bf16, o = P·v stored in bf16; with dout (on the bf16 grid) its backward instead: dv = Pᵀ·dout,
// dP = dout·vᵀ, dS = P ⊙ (dP − Σ P⊙dP) scaled by 1/sqrt(d), dq = dS·k, dk = dSᵀ·q, each stored in
// bf16. Math between the stores in double. Returns {o, lse} or {dq, dk, dv}.
DBufs naive_attention(const DBufs& in, const Buf* dout, int64_t B, int64_t Sq, int64_t Sk,
                      int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d, int64_t window) {
  auto rb = [](double x) { return double(round_bf16(float(x))); };
  const double scale = 1.0 / std::sqrt(double(d));
  DBuf o(sz(B * Sq * Hq * d)), lse(sz(B * Hq * Sq));
  DBuf dq(in[0].size()), dk(in[1].size(), 0.0), dv(in[2].size(), 0.0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Hq; h++)
      for (int64_t t = 0; t < Sq; t++) {
        const int64_t g = h / (Hq / Hkv), pos = q_start + t, row = ((b * Sq + t) * Hq + h) * d;
        const double* q = in[0].data() + row;
        std::vector<int64_t> keys;
        DBuf s;
        for (int64_t j = 0; j <= pos; j++) {
          if (window > 0 && j <= pos - window) continue;
          const double* k = in[1].data() + ((b * Sk + j) * Hkv + g) * d;
          double dot = 0;
          for (int64_t i = 0; i < d; i++) dot += q[i] * k[i];
          s.push_back(rb(rb(dot) * scale));
          keys.push_back(j);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double x : s) z += std::exp(x - mx);
        lse[sz((b * Hq + h) * Sq + t)] = mx + std::log(z);
        DBuf p(s.size());
        for (size_t m = 0; m < s.size(); m++) p[m] = rb(std::exp(s[m] - mx) / z);
        auto kv = [&](const DBuf& x, size_t m) {
          return x.data() + ((b * Sk + keys[m]) * Hkv + g) * d;
        };
        if (!dout) {
          for (int64_t i = 0; i < d; i++) {
            double acc = 0;
            for (size_t m = 0; m < p.size(); m++) acc += p[m] * kv(in[2], m)[i];
            o[sz(row + i)] = rb(acc);
          }
          continue;
        }
        const float* go = dout->data() + row;
        DBuf dp(p.size()), ds(p.size());
        double D = 0;
        for (size_t m = 0; m < p.size(); m++) {
          double acc = 0;
          for (int64_t i = 0; i < d; i++) acc += double(go[i]) * kv(in[2], m)[i];
          dp[m] = rb(acc);
          D += p[m] * dp[m];
        }
        for (size_t m = 0; m < p.size(); m++) ds[m] = rb(rb(p[m] * (dp[m] - D)) * scale);
        for (int64_t i = 0; i < d; i++) {
          double acc = 0;
          for (size_t m = 0; m < p.size(); m++) acc += ds[m] * kv(in[1], m)[i];
          dq[sz(row + i)] = rb(acc);
        }
        for (size_t m = 0; m < p.size(); m++) {
          const int64_t kr = ((b * Sk + keys[m]) * Hkv + g) * d;
          for (int64_t i = 0; i < d; i++) {
            dv[sz(kr + i)] += p[m] * double(go[i]);
            dk[sz(kr + i)] += ds[m] * q[i];
          }
        }
      }
  if (!dout) return {o, lse};
  for (double& x : dk) x = rb(x);
  for (double& x : dv) x = rb(x);
  return {dq, dk, dv};
}

// Causal GQA attention with queries at q_start.. over keys 0..Sk-1. The CPU backward covers every
// layout (context parallelism runs a chunk's queries against all keys); the CUDA backward only the
// training layout (Sq == Sk, q_start == 0).
void add_attention(Cases& cs, uint64_t seed, int64_t B, int64_t Sq, int64_t Sk, int64_t q_start,
                   int64_t Hq, int64_t Hkv, int64_t d, int64_t window) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("attention_B{}_Sq{}_Sk{}_q{}_Hq{}_Hkv{}_d{}_w{}", B, Sq, Sk, q_start, Hq,
                       Hkv, d, window);
  const bool train = Sq == Sk && q_start == 0;
  const Grad gm = Grad::Overwrite;
  c.in = {{"q", randn_bf16(r, B * Sq * Hq * d, 1.2f), gm},
          {"k", randn_bf16(r, B * Sk * Hkv * d, 1.2f), gm},
          {"v", randn_bf16(r, B * Sk * Hkv * d), gm}};
  c.out = {{"o"}, {"lse", false}};
  c.op = [=](const Bufs& in) {
    Buf o(sz(B * Sq * Hq * d), kNaN), lse(sz(B * Hq * Sq), kNaN);
    cpu::attention(o.data(), lse.data(), in[0].data(), in[1].data(), in[2].data(), B, Sq, Sk,
                   q_start, Hq, Hkv, d, window);
    return Bufs{o, lse};
  };
  c.ref = [=](const DBufs& in) {
    DBuf o(sz(B * Sq * Hq * d), 0.0), lse(sz(B * Hq * Sq));
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < Hq; h++)
        for (int64_t t = 0; t < Sq; t++) {
          const int64_t g = h / (Hq / Hkv), pos = q_start + t;
          const double* q = in[0].data() + ((b * Sq + t) * Hq + h) * d;
          DBuf s;  // scores of the visible keys pos-window+1..pos (all of 0..pos without window)
          std::vector<int64_t> keys;
          for (int64_t j = 0; j <= pos; j++) {
            if (window > 0 && j <= pos - window) continue;
            const double* k = in[1].data() + ((b * Sk + j) * Hkv + g) * d;
            double dot = 0;
            for (int64_t i = 0; i < d; i++) dot += q[i] * k[i];
            s.push_back(dot / std::sqrt(double(d)));
            keys.push_back(j);
          }
          double z = 0;
          for (double x : s) z += std::exp(x);
          lse[(b * Hq + h) * Sq + t] = std::log(z);
          for (size_t m = 0; m < keys.size(); m++) {
            const double* v = in[2].data() + ((b * Sk + keys[m]) * Hkv + g) * d;
            for (int64_t i = 0; i < d; i++)
              o[((b * Sq + t) * Hq + h) * d + i] += std::exp(s[m]) / z * v[i];
          }
        }
    return DBufs{o, lse};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    Buf o(sz(B * Sq * Hq * d)), lse(sz(B * Hq * Sq));
    cpu::attention(o.data(), lse.data(), in[0].data(), in[1].data(), in[2].data(), B, Sq, Sk,
                   q_start, Hq, Hkv, d, window);
    if (train)  // the training form, as the model calls it
      cpu::attention_backward(g[0].data(), g[1].data(), g[2].data(), dy[0].data(), o.data(),
                              lse.data(), in[0].data(), in[1].data(), in[2].data(), B, Sq, Hq, Hkv,
                              d, window);
    else
      cpu::attention_backward(g[0].data(), g[1].data(), g[2].data(), dy[0].data(), o.data(),
                              lse.data(), in[0].data(), in[1].data(), in[2].data(), B, Sq, Sk,
                              q_start, Hq, Hkv, d, window);
  };
  c.naive_bf16 = [=](const DBufs& in) {
    return naive_attention(in, nullptr, B, Sq, Sk, q_start, Hq, Hkv, d, window);
  };
  c.naive_bf16_grads = [=](const Bufs& in, const Bufs& dy) {
    return naive_attention(widen(in), &dy[0], B, Sq, Sk, q_start, Hq, Hkv, d, window);
  };
#if ZAYA_OP_TESTS_CUDA
  if (d == 32 || d == 64 || d == 128) {  // the head dims attention_fwd/bwd support
    const int64_t nq = B * Sq * Hq * d, nkv = B * Sk * Hkv * d, nl = B * Hq * Sq;
    CudaVariant v;
    v.out_bf16 = {true, false};
    v.fwd = [=](const Bufs& in) {
      test_util::DeviceArena dv;
      bf16* o = dv.alloc<bf16>(sz(nq));
      float* lse = dv.alloc<float>(sz(nl));
      cuda::attention_fwd(o, lse, dv.up_bf16(in[0]), dv.up_bf16(in[1]), dv.up_bf16(in[2]), B, Sq,
                          Sk, q_start, Hq, Hkv, d, window, nullptr);
      sync();
      return Bufs{get(o, nq), get(lse, nl)};
    };
    if (train) {
      // Backward on the GPU's own forward outputs (o bf16, lse fp32), as the model runs it.
      v.grad_bf16 = {true, true, true};
      v.bwd_repeatable = true;
      v.bwd = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
        test_util::DeviceArena dv;
        cuda::Workspace ws = workspace(dv, cuda::attention_bwd_workspace_bytes(B, Sq, Hq, Hkv, d));
        bf16 *q = dv.up_bf16(in[0]), *k = dv.up_bf16(in[1]), *vv = dv.up_bf16(in[2]),
             *dout = dv.up_bf16(dy[0]);
        bf16 *o = dv.alloc<bf16>(sz(nq)), *dq = dv.alloc<bf16>(sz(nq)),
             *dk = dv.alloc<bf16>(sz(nkv)), *dvv = dv.alloc<bf16>(sz(nkv));
        float* lse = dv.alloc<float>(sz(nl));
        cuda::attention_fwd(o, lse, q, k, vv, B, Sq, Sk, 0, Hq, Hkv, d, window, nullptr);
        cuda::attention_bwd(dq, dk, dvv, dout, o, lse, q, k, vv, B, Sq, Hq, Hkv, d, window, ws,
                            nullptr);
        sync();
        g[0] = get(dq, nq);
        g[1] = get(dk, nkv);
        g[2] = get(dvv, nkv);
      };
    }
    c.cuda.push_back(v);
  }
#endif
  cs.push_back(c);
}

void add_router_select(Cases& cs, uint64_t seed, int64_t N, int64_t E1, bool bias) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("router_select_N{}_E1_{}{}", N, E1, bias ? "_bias" : "");
  // Biases of the size of the probability gaps so they often change the choice; rows whose two
  // best biased scores are within 1e-3 are redrawn so the choice is unambiguous in fp32.
  Buf b = bias ? randn(r, E1, 0.15f) : Buf{};
  Buf logits(sz(N * E1));
  for (int64_t n = 0; n < N; n++) {
    for (;;) {
      Buf l = randn(r, E1, 1.5f);
      double z = 0;
      for (float x : l) z += std::exp(double(x));
      DBuf sc(sz(E1));
      for (int64_t e = 0; e < E1; e++) sc[e] = std::exp(double(l[e])) / z + (bias ? b[e] : 0.0);
      std::sort(sc.begin(), sc.end());
      if (E1 == 1 || sc[E1 - 1] - sc[E1 - 2] > 1e-3) {
        std::copy(l.begin(), l.end(), logits.begin() + n * E1);
        break;
      }
    }
  }
  c.in = {{"logits", logits}, {"bias", b}};
  c.out = {{"probs"}, {"choice", false, true}, {"gate"}};
  c.op = [=](const Bufs& in) {
    Buf p(sz(N * E1), kNaN), gate(sz(N), kNaN);
    std::vector<int32_t> ch(sz(N), -7);
    cpu::router_select(p.data(), ch.data(), gate.data(), in[0].data(),
                       bias ? in[1].data() : nullptr, N, E1);
    return Bufs{p, Buf(ch.begin(), ch.end()), gate};
  };
  c.ref = [=](const DBufs& in) {
    DBuf p(sz(N * E1)), ch(sz(N)), gate(sz(N));
    for (int64_t n = 0; n < N; n++) {
      double z = 0;
      for (int64_t e = 0; e < E1; e++) z += std::exp(in[0][n * E1 + e]);
      int64_t best = -1;
      double bv = -1e300;
      for (int64_t e = 0; e < E1; e++) {
        p[n * E1 + e] = std::exp(in[0][n * E1 + e]) / z;
        const double v = p[n * E1 + e] + (bias ? in[1][e] : 0.0);
        if (v > bv) bv = v, best = e;  // strict: ties keep the lowest index
      }
      ch[n] = double(best);
      gate[n] = p[n * E1 + best];  // the unbiased probability
    }
    return DBufs{p, ch, gate};
  };
#if ZAYA_OP_TESTS_CUDA
  CudaVariant v;  // choices exact (the inputs have no near-ties), probabilities and gates fp32
  v.out_bf16 = {false, false, false};
  v.fwd = [=](const Bufs& in) {
    test_util::DeviceArena dv;
    float *p = dv.alloc<float>(sz(N * E1)), *gate = dv.alloc<float>(sz(N));
    int32_t* ch = dv.up(std::vector<int32_t>(sz(N), -7));
    cuda::router_select(p, ch, gate, dv.up(in[0]), bias ? dv.up(in[1]) : nullptr, N, E1, nullptr);
    sync();
    const std::vector<int32_t> choice = test_util::download(ch, sz(N));
    return Bufs{get(p, N * E1), Buf(choice.begin(), choice.end()), get(gate, N)};
  };
  c.cuda.push_back(v);
#endif
  cs.push_back(c);
}

Cases make_cases() {
  Cases cs;
  uint64_t s = 100;
  // linear: both row paths (N < 4 decoding, N >= 4 batched) for each weight dtype, odd sizes.
  add_linear(cs, s++, 5, 13, 7, DType::F32, false, false);
  add_linear(cs, s++, 6, 8, 4, DType::F32, true, true);
  add_linear(cs, s++, 2, 11, 9, DType::F32, true, false);
  add_linear(cs, s++, 3, 10, 5, DType::F32, false, true);
  add_linear(cs, s++, 1, 9, 11, DType::BF16, true, true);
  add_linear(cs, s++, 9, 16, 6, DType::BF16, true, false);
  add_linear(cs, s++, 3, 17, 5, DType::F16, false, true);
  add_linear(cs, s++, 7, 5, 3, DType::F16, true, false);
  add_embedding(cs, s++, 9, 5, 7, DType::F32);
  add_embedding(cs, s++, 20, 7, 16, DType::BF16);
  add_embedding(cs, s++, 77, 50, 68, DType::BF16);    // CUDA: 4-wide rows, repeated ids
  add_embedding(cs, s++, 45, 1000, 30, DType::BF16);  // CUDA: scalar rows, mostly distinct ids
  add_embedding(cs, s++, 3, 90, 2048, DType::BF16);   // CUDA decode: a row split over warps
  add_rmsnorm(cs, s++, 4, 16);
  add_rmsnorm(cs, s++, 3, 37);
  add_rmsnorm(cs, s++, 1, 7);
  add_rmsnorm(cs, s++, 37, 64);     // CUDA: 4-wide rows
  add_rmsnorm(cs, s++, 5, 33);      // CUDA: scalar rows
  add_rmsnorm(cs, s++, 300, 2048);  // CUDA: the model's width
  add_residual_scale(cs, s++, 5, 12);
  add_residual_scale(cs, s++, 3, 7);
  add_residual_scale(cs, s++, 50, 128);
  add_residual_scale(cs, s++, 301, 37);
  add_affine(cs, s++, 4, 9);
  add_affine(cs, s++, 33, 64);
  add_gelu(cs, s++, 37);
  // bias GELU: 4-wide and scalar rows, no bias, and many row chunks in the column reduction.
  add_bias_gelu(cs, s++, 64, 256, true);
  add_bias_gelu(cs, s++, 129, 31, true);
  add_bias_gelu(cs, s++, 20, 16, false);
  add_bias_gelu(cs, s++, 9000, 12, true);
  add_swiglu(cs, s++, 3, 5);
  add_swiglu(cs, s++, 4, 16);
  add_swiglu(cs, s++, 33, 20);
  add_swiglu(cs, s++, 7, 13);
  add_swiglu(cs, s++, 70000, 8);  // more rows than one CUDA grid dimension holds
  add_cross_entropy(cs, s++, 6, 11, {{0, 11}, {0, 4, 5, 11}});
  add_cross_entropy(cs, s++, 9, 32, {{0, 32}});
  add_cross_entropy(cs, s++, 4, 3, {{0, 3}});
  // The CUDA kernels' paths: a 4-wide full-vocabulary chunk, uneven chunks with v0 > 0 and a
  // 1-wide chunk, the real vocabulary width, and every target ignored (N = 1: count 0).
  add_cross_entropy(cs, s++, 37, 1000, {{0, 1000}, {0, 333, 334, 801, 1000}});
  add_cross_entropy(cs, s++, 4, 262272, {{0, 262272}});
  add_cross_entropy(cs, s++, 1, 5, {{0, 2, 5}});
  add_cross_entropy(cs, s++, 2, 5, {{0, 2, 5}});
  // CCA: GQA ratios 1, 2, 4.
  add_cca_mean_skip(cs, s++, 3, 4, 4, 5);
  add_cca_mean_skip(cs, s++, 4, 4, 2, 8);
  add_cca_mean_skip(cs, s++, 2, 8, 2, 3);
  // conv: t0/t1 in {2, 3}, one to three groups, with and without history (S = 1: a decode step).
  add_cca_conv(cs, s++, 2, 6, 12, 4, 2, 2, false);
  add_cca_conv(cs, s++, 1, 7, 10, 5, 3, 2, false);
  add_cca_conv(cs, s++, 2, 5, 6, 3, 2, 3, false);
  add_cca_conv(cs, s++, 1, 4, 9, 3, 3, 3, false);
  add_cca_conv(cs, s++, 2, 5, 12, 4, 2, 2, true);
  add_cca_conv(cs, s++, 1, 1, 10, 5, 3, 3, true);
  // The CUDA kernels' head dims (multiples of 32): B·S <= 16 (the direct forward kernel), the
  // banded GEMMs with d 32/64/128 and several row chunks, a decode step and a prefill with
  // history.
  add_cca_conv(cs, s++, 2, 7, 96, 32, 2, 2, false);
  add_cca_conv(cs, s++, 2, 70, 128, 64, 3, 2, false);
  add_cca_conv(cs, s++, 1, 40, 256, 128, 2, 3, false);
  add_cca_conv(cs, s++, 1, 300, 64, 32, 3, 2, false);
  add_cca_conv(cs, s++, 2, 1, 96, 32, 3, 3, true);
  add_cca_conv(cs, s++, 1, 30, 64, 32, 2, 2, true);
  add_qk_norm(cs, s++, 3, 4, 8, true);
  add_qk_norm(cs, s++, 2, 3, 5, false);
  add_qk_norm(cs, s++, 1, 2, 16, true);
  // rope: partial (r < d, incl. an odd half r/2 = 3) and full rotary, several θ.
  add_rope(cs, s++, 5, 3, 8, 4, 1e4);
  add_rope(cs, s++, 4, 2, 16, 16, 1e6);
  add_rope(cs, s++, 3, 1, 10, 6, 1e4);
  add_rope(cs, s++, 2, 2, 12, 8, 5e6);
  // attention: training layout with GQA 1/2/4 and windows 0/1/2/3; then decoding/chunked layouts.
  add_attention(cs, s++, 2, 7, 7, 0, 2, 2, 8, 0);
  add_attention(cs, s++, 1, 9, 9, 0, 4, 2, 4, 3);
  add_attention(cs, s++, 2, 6, 6, 0, 4, 1, 6, 0);
  add_attention(cs, s++, 1, 8, 8, 0, 8, 2, 5, 2);
  add_attention(cs, s++, 1, 5, 5, 0, 3, 3, 7, 1);
  add_attention(cs, s++, 2, 1, 12, 7, 4, 2, 8, 0);
  add_attention(cs, s++, 1, 3, 10, 4, 4, 1, 6, 3);
  add_attention(cs, s++, 1, 1, 6, 5, 2, 2, 4, 2);
  // More than one 64-row query block (the blocked implementation's boundary), with and without a
  // window reaching across it, and a chunk of 66 queries after 4 cached keys.
  add_attention(cs, s++, 1, 70, 70, 0, 2, 1, 4, 0);
  add_attention(cs, s++, 1, 67, 67, 0, 2, 2, 3, 5);
  add_attention(cs, s++, 1, 66, 70, 4, 2, 1, 4, 0);
  // A context-parallel chunk: queries of the middle of the sequence against all of its keys.
  add_attention(cs, s++, 2, 5, 20, 10, 4, 2, 4, 0);
  add_attention(cs, s++, 1, 6, 18, 6, 2, 1, 4, 4);
  // The CUDA kernel's layouts (head dims 32, 64, 128): sequences that are not multiples of the
  // 64-row tiles, GQA 8:2 and plain 4:4, full causal and sliding window.
  for (int64_t d : {32, 64, 128})
    for (int64_t S : {100, 257})
      for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}})
        for (int64_t window : {0, 64}) add_attention(cs, s++, 2, S, S, 0, Hq, Hkv, d, window);
  // Tile-aligned S (no partial tiles), a window longer than several tiles, a single short
  // sequence, and a window of 2 (a window of 1 makes dq and dk exactly zero).
  add_attention(cs, s++, 1, 256, 256, 0, 8, 2, 128, 0);
  add_attention(cs, s++, 1, 384, 384, 0, 8, 2, 128, 150);
  add_attention(cs, s++, 2, 3, 3, 0, 4, 2, 64, 0);
  add_attention(cs, s++, 1, 130, 130, 0, 2, 1, 32, 2);
  // The CUDA backward's dK/dV blocks own 128 keys and its dQ blocks 128 query rows (64-row steps
  // and 64-key tiles inside them): S just past one block (129), inside the second (200), past two
  // with a partial 64-row step (300), and several blocks with a window shorter than a block; GQA
  // 4:1, 3:1, 1:1.
  for (int64_t d : {32, 64, 128}) {
    add_attention(cs, s++, 1, 129, 129, 0, 4, 1, d, 0);
    add_attention(cs, s++, 2, 200, 200, 0, 8, 2, d, 0);
    add_attention(cs, s++, 1, 300, 300, 0, 8, 2, d, 100);
    add_attention(cs, s++, 1, 200, 200, 0, 3, 3, d, 150);
  }
  add_attention(cs, s++, 1, 385, 385, 0, 6, 2, 128, 2);
  add_attention(cs, s++, 1, 513, 513, 0, 4, 1, 128, 0);
  // Decoding with q_start > 0 against a longer key cache (forward only, as in the model), and
  // queries in the middle of the cache (keys beyond the last query are never visible).
  for (int64_t d : {32, 64, 128})
    for (int64_t S : {1, 5})
      for (int64_t window : {0, 64}) add_attention(cs, s++, 2, S, 300, 300 - S, 8, 2, d, window);
  add_attention(cs, s++, 1, 70, 400, 130, 8, 2, 128, 0);
  add_router_select(cs, s++, 16, 17, true);
  add_router_select(cs, s++, 7, 5, true);
  add_router_select(cs, s++, 9, 2, false);
  add_router_select(cs, s++, 333, 17, true);  // CUDA: one warp per token, E1 < 32
  add_router_select(cs, s++, 40, 65, true);   // E1 > 64: three values per lane
  add_router_select(cs, s++, 8, 1, true);     // a single class
  return cs;
}

}  // namespace

const Cases& registry() {
  static const Cases cases = make_cases();
  return cases;
}

}  // namespace zaya::op_test
