// Op-test registry for the CPU reference ops (src/backend/cpu/ops.h), in the spirit of ggml's
// test-backend-ops: a table of cases, each one op at one shape with its random inputs (zaya::Rng),
// the op call in fp32 and an independent double-precision reference written from ZAYA1.md §3 and
// the header comments (plain loops; it never calls the op). The driver checks
//  - forward: every output against the reference (relative L2 error; routing choices exactly);
//  - backward: the fp32 analytic gradient of a random functional L = Σ w·out against central finite
//    differences of the double reference, with the gradient buffers pre-filled with random values
//    so that the header's accumulate (+=) and overwrite (=) contracts are checked too.
// Adding an op (or a shape) is adding one entry in make_cases(). Targeted checks that do not fit
// the table (dtype widening, error messages, decoding, conv history) are in
// test_cpu_ops_special.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace zaya {
namespace {

using Buf = std::vector<float>;
using DBuf = std::vector<double>;
using Bufs = std::vector<Buf>;
using DBufs = std::vector<DBuf>;

// How the op's backward writes the gradient of one input (the header's contract).
enum class Grad { None, Overwrite, Accumulate };

struct Input {
  std::string name;
  Buf data;  // may be empty for an absent optional input (bias, temperature, history)
  Grad grad = Grad::None;
};

struct Output {
  std::string name;
  bool differentiable = true;  // enters L = Σ w·out (saved statistics such as rstd do not)
  bool exact = false;          // compared elementwise for equality (routing choices)
};

struct OpCase {
  std::string name;
  std::vector<Input> in;
  std::vector<Output> out;
  // The op in fp32: inputs -> one buffer per output.
  std::function<Bufs(const Bufs&)> op;
  // The independent reference in double on the same input values.
  std::function<DBufs(const DBufs&)> ref;
  // The op's backward (null when the op has none): given the inputs and dL/dout (zeros for
  // non-differentiable outputs) writes into grads[i] (sized like in[i], pre-filled) for every input
  // whose grad is not None. It runs the op's forward itself when backward needs saved values.
  std::function<void(const Bufs&, const Bufs&, Bufs&)> backward;
  // Relative L2 errors. The fp32 ops measure ~1e-7 on these sizes (ZAYA_OPS_VERBOSE=1 prints
  // them); 1e-5 leaves margin yet catches e.g. the tanh GELU approximation (~1e-4 off).
  double fwd_tol = 1e-5;
  double bwd_tol = 1e-5;
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- helpers
inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}
Buf randn(Rng& r, int64_t n, float scale = 1.0f) {
  Buf v(sz(n));
  for (float& x : v) x = r.normal() * scale;
  return v;
}
Buf randu(Rng& r, int64_t n, float lo, float hi) {
  Buf v(sz(n));
  for (float& x : v) x = lo + (hi - lo) * r.uniform();
  return v;
}
int64_t randint(Rng& r, int64_t n) {
  return int64_t(r.next_u32() % uint32_t(n));
}

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

// ‖a − b‖ / ‖b‖; falls back to the absolute norm when the reference is exactly zero.
double rel_err(const Buf& a, const DBuf& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); i++) {
    const double d = double(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

DBufs widen(const Bufs& v) {
  DBufs out;
  for (const Buf& b : v) out.emplace_back(b.begin(), b.end());
  return out;
}
Bufs inputs_of(const OpCase& c) {
  Bufs v;
  for (const Input& i : c.in) v.push_back(i.data);
  return v;
}

// ---- driver
// Runs one case; returns human-readable failures (empty when the op passes). Kept separate from
// gtest assertions so the self-test below can check that broken ops are caught.
std::vector<std::string> check_case(const OpCase& c, uint64_t seed = 1234) {
  static const bool verbose = std::getenv("ZAYA_OPS_VERBOSE") != nullptr;  // prints measured errors
  std::vector<std::string> fails;
  const Bufs in = inputs_of(c);
  const Bufs out = c.op(in);
  const DBufs ref = c.ref(widen(in));
  if (out.size() != c.out.size() || ref.size() != c.out.size()) {
    fails.push_back("op/reference returned the wrong number of outputs");
    return fails;
  }
  for (size_t o = 0; o < c.out.size(); o++) {
    const std::string& nm = c.out[o].name;
    if (out[o].size() != ref[o].size()) {
      fails.push_back(fmt::format("{}: size {} vs reference {}", nm, out[o].size(), ref[o].size()));
      continue;
    }
    for (size_t i = 0; i < out[o].size(); i++)
      if (!std::isfinite(out[o][i])) {
        fails.push_back(fmt::format("{}[{}] is not finite (unwritten?)", nm, i));
        break;
      }
    if (c.out[o].exact) {
      for (size_t i = 0; i < out[o].size(); i++)
        if (double(out[o][i]) != ref[o][i]) {
          fails.push_back(fmt::format("{}[{}] = {} but reference {}", nm, i, out[o][i], ref[o][i]));
          break;
        }
    } else {
      const double e = rel_err(out[o], ref[o]);
      if (verbose) fmt::print("  {} forward {}: {:.3g}\n", c.name, nm, e);
      if (!(e < c.fwd_tol))
        fails.push_back(
            fmt::format("forward {}: relative error {:.3g} >= {:.1g}", nm, e, c.fwd_tol));
    }
  }
  if (!c.backward || !fails.empty()) return fails;

  // L = Σ w·out over the differentiable outputs.
  Rng r(seed);
  Bufs w(c.out.size());
  for (size_t o = 0; o < c.out.size(); o++)
    w[o] = c.out[o].differentiable ? randn(r, int64_t(out[o].size())) : Buf(out[o].size(), 0.0f);
  Bufs grads(c.in.size()), prefill(c.in.size());
  for (size_t i = 0; i < c.in.size(); i++)
    if (c.in[i].grad != Grad::None) prefill[i] = grads[i] = randn(r, int64_t(in[i].size()), 0.5f);
  c.backward(in, w, grads);

  auto L = [&](const DBufs& x) {
    const DBufs y = c.ref(x);
    double s = 0;
    for (size_t o = 0; o < y.size(); o++)
      for (size_t i = 0; i < y[o].size(); i++) s += double(w[o][i]) * y[o][i];
    return s;
  };
  DBufs x = widen(in);
  for (size_t i = 0; i < c.in.size(); i++) {
    if (c.in[i].grad == Grad::None) continue;
    Buf analytic = grads[i];
    if (c.in[i].grad == Grad::Accumulate)
      for (size_t k = 0; k < analytic.size(); k++) analytic[k] -= prefill[i][k];
    DBuf fd(x[i].size());
    for (size_t k = 0; k < x[i].size(); k++) {
      const double x0 = x[i][k], h = 1e-6 * std::max(1.0, std::abs(x0));
      x[i][k] = x0 + h;
      const double lp = L(x);
      x[i][k] = x0 - h;
      const double lm = L(x);
      x[i][k] = x0;
      fd[k] = (lp - lm) / (2 * h);
    }
    const double e = rel_err(analytic, fd);
    if (verbose) fmt::print("  {} backward d{}: {:.3g}\n", c.name, c.in[i].name, e);
    if (!(e < c.bwd_tol))
      fails.push_back(fmt::format("backward d{} ({}): relative error {:.3g} vs finite differences",
                                  c.in[i].name, c.in[i].grad == Grad::Accumulate ? "+=" : "=", e));
  }
  return fails;
}

// ---- cases
// Each add_* builds one case from its sizes; seeds differ per case so inputs are fresh.
using Cases = std::vector<OpCase>;

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
  cs.push_back(c);
}

void add_residual_scale(Cases& cs, uint64_t seed, int64_t N, int64_t D) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("residual_scale_N{}_D{}", N, D);
  c.in = {{"a", randn(r, N * D), Grad::Overwrite}, {"h", randn(r, N * D), Grad::Overwrite},
          {"hs", randn(r, D), Grad::Accumulate},   {"hb", randn(r, D), Grad::Accumulate},
          {"rs", randn(r, D), Grad::Accumulate},   {"rb", randn(r, D), Grad::Accumulate}};
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
  cs.push_back(c);
}

void add_affine(Cases& cs, uint64_t seed, int64_t N, int64_t D) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("affine_N{}_D{}", N, D);
  c.in = {{"x", randn(r, N * D)}, {"s", randn(r, D)}, {"b", randn(r, D)}};
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
  cs.push_back(c);
}

void add_swiglu(Cases& cs, uint64_t seed, int64_t N, int64_t I) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("swiglu_N{}_I{}", N, I);
  c.in = {{"gu", randn(r, N * 2 * I, 2.0f), Grad::Overwrite}};
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
  cs.push_back(c);
}

void add_cross_entropy(Cases& cs, uint64_t seed, int64_t N, int64_t V) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("cross_entropy_N{}_V{}", N, V);
  std::vector<int32_t> tgt(sz(N));
  for (int64_t n = 0; n < N; n++) tgt[n] = n % 3 == 1 ? -100 : int32_t(randint(r, V));
  tgt[sz(N - 1)] = -1;  // both -1 and -100 style ignore indices
  c.in = {{"logits", randn(r, N * V, 3.0f), Grad::Overwrite}};
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
    return DBufs{{sum / count}};
  };
  c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
    // dlogits is d(mean loss)/dlogits; L = w·loss scales it by w.
    cpu::cross_entropy(g[0].data(), in[0].data(), tgt.data(), N, V);
    for (float& x : g[0]) x *= dy[0][0];
  };
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
// depthwise bias), then the grouped conv. Returns {y [B,S,C], mid [B,M,C]}.
DBufs ref_cca_conv(const DBufs& in, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                   int64_t t1) {
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
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < S; t++)
      for (int64_t c = 0; c < C; c++) {
        const int64_t g0 = (c / d) * d;  // first channel of c's group
        double s = bg[c];
        for (int64_t ci = 0; ci < d; ci++)
          for (int64_t j = 0; j < t1; j++)
            s += wg[(c * d + ci) * t1 + j] * mid[(b * M + t + j) * C + g0 + ci];
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
  // Gradients only without history (backward is training-only).
  const Grad ow = with_hist ? Grad::None : Grad::Overwrite;
  const Grad ac = with_hist ? Grad::None : Grad::Accumulate;
  c.in = {{"x", randn(r, B * S * C), ow},
          {"wdw", randn(r, C * t0, 0.7f), ac},
          {"bdw", randn(r, C, 0.5f), ac},
          {"wg", randn(r, C * d * t1, 1.0f / std::sqrt(float(d * t1))), ac},
          {"bg", randn(r, C, 0.5f), ac},
          {"hist", with_hist ? randn(r, B * P * C) : Buf{}, Grad::None}};
  c.out = {{"y"}, {"mid", false}};
  c.op = [=](const Bufs& in) {
    Buf y(sz(B * S * C), kNaN), mid(sz(B * M * C), kNaN);
    cpu::cca_conv(y.data(), mid.data(), in[0].data(), with_hist ? in[5].data() : nullptr,
                  in[1].data(), in[2].data(), in[3].data(), in[4].data(), B, S, C, d, t0, t1);
    return Bufs{y, mid};
  };
  c.ref = [=](const DBufs& in) { return ref_cca_conv(in, B, S, C, d, t0, t1); };
  if (!with_hist)
    c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
      Buf y(sz(B * S * C)), mid(sz(B * M * C));
      cpu::cca_conv(y.data(), mid.data(), in[0].data(), nullptr, in[1].data(), in[2].data(),
                    in[3].data(), in[4].data(), B, S, C, d, t0, t1);
      cpu::cca_conv_backward(g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(),
                             dy[0].data(), in[0].data(), mid.data(), in[1].data(), in[3].data(), B,
                             S, C, d, t0, t1);
    };
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

// Causal GQA attention with queries at q_start.. over keys 0..Sk-1; backward only for the training
// layout (Sq == Sk, q_start == 0).
void add_attention(Cases& cs, uint64_t seed, int64_t B, int64_t Sq, int64_t Sk, int64_t q_start,
                   int64_t Hq, int64_t Hkv, int64_t d, int64_t window) {
  Rng r(seed);
  OpCase c;
  c.name = fmt::format("attention_B{}_Sq{}_Sk{}_q{}_Hq{}_Hkv{}_d{}_w{}", B, Sq, Sk, q_start, Hq,
                       Hkv, d, window);
  const bool train = Sq == Sk && q_start == 0;
  const Grad gm = train ? Grad::Overwrite : Grad::None;
  c.in = {{"q", randn(r, B * Sq * Hq * d, 1.2f), gm},
          {"k", randn(r, B * Sk * Hkv * d, 1.2f), gm},
          {"v", randn(r, B * Sk * Hkv * d), gm}};
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
  if (train)
    c.backward = [=](const Bufs& in, const Bufs& dy, Bufs& g) {
      Buf o(sz(B * Sq * Hq * d)), lse(sz(B * Hq * Sq));
      cpu::attention(o.data(), lse.data(), in[0].data(), in[1].data(), in[2].data(), B, Sq, Sk, 0,
                     Hq, Hkv, d, window);
      cpu::attention_backward(g[0].data(), g[1].data(), g[2].data(), dy[0].data(), o.data(),
                              lse.data(), in[0].data(), in[1].data(), in[2].data(), B, Sq, Hq, Hkv,
                              d, window);
    };
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
  add_rmsnorm(cs, s++, 4, 16);
  add_rmsnorm(cs, s++, 3, 37);
  add_rmsnorm(cs, s++, 1, 7);
  add_residual_scale(cs, s++, 5, 12);
  add_residual_scale(cs, s++, 3, 7);
  add_affine(cs, s++, 4, 9);
  add_gelu(cs, s++, 37);
  add_swiglu(cs, s++, 3, 5);
  add_swiglu(cs, s++, 4, 16);
  add_cross_entropy(cs, s++, 6, 11);
  add_cross_entropy(cs, s++, 9, 32);
  add_cross_entropy(cs, s++, 4, 3);
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
  add_router_select(cs, s++, 16, 17, true);
  add_router_select(cs, s++, 7, 5, true);
  add_router_select(cs, s++, 9, 2, false);
  return cs;
}

const Cases& registry() {
  static const Cases cases = make_cases();
  return cases;
}

class CpuOpsRegistry : public ::testing::TestWithParam<size_t> {};

TEST_P(CpuOpsRegistry, MatchesReference) {
  const OpCase& c = registry()[GetParam()];
  for (const std::string& f : check_case(c)) ADD_FAILURE() << c.name << ": " << f;
}

INSTANTIATE_TEST_SUITE_P(CpuOps, CpuOpsRegistry, ::testing::Range<size_t>(0, registry().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return registry()[i.param].name;
                         });

// Every op of ops.h has an entry, and every backward in the header is exercised by some case.
TEST(CpuOpsRegistryMeta, CoversEveryOp) {
  const std::vector<std::pair<std::string, bool>> ops = {
      {"linear_", true},         {"embedding_", true},     {"rmsnorm_", true},
      {"residual_scale_", true}, {"affine_", false},       {"gelu_", true},
      {"swiglu_", true},         {"cross_entropy_", true}, {"cca_mean_skip_", false},
      {"cca_conv_", true},       {"qk_norm_", true},       {"rope_", true},
      {"attention_", true},      {"router_select_", false}};
  for (const auto& [prefix, has_backward] : ops) {
    bool fwd = false, bwd = false;
    for (const OpCase& c : registry())
      if (c.name.rfind(prefix, 0) == 0) fwd = true, bwd = bwd || bool(c.backward);
    EXPECT_TRUE(fwd) << prefix;
    EXPECT_EQ(bwd, has_backward) << prefix;
  }
}

// The driver must catch what it is meant to catch: a slightly wrong forward, a backward that
// accumulates where it should overwrite, and one that overwrites where it should accumulate.
TEST(CpuOpsRegistryMeta, DriverCatchesBrokenOps) {
  const Cases& cs = registry();
  auto find = [&](const std::string& prefix) {
    for (const OpCase& c : cs)
      if (c.name.rfind(prefix, 0) == 0) return c;
    ADD_FAILURE() << prefix;
    return OpCase{};
  };
  OpCase gelu = find("gelu_");
  EXPECT_TRUE(check_case(gelu).empty());
  OpCase wrong_fwd = gelu;  // tanh approximation instead of the exact erf GELU
  wrong_fwd.op = [n = gelu.in[0].data.size()](const Bufs& in) {
    Buf y(n);
    for (size_t i = 0; i < n; i++) {
      const float x = in[0][i];
      y[i] = 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
    return Bufs{y};
  };
  EXPECT_FALSE(check_case(wrong_fwd).empty());
  OpCase acc_instead = gelu;  // claims (=) but adds to the buffer
  acc_instead.backward = [bw = gelu.backward](const Bufs& in, const Bufs& dy, Bufs& g) {
    Buf prior = g[0];
    bw(in, dy, g);
    for (size_t i = 0; i < prior.size(); i++) g[0][i] += prior[i];
  };
  EXPECT_FALSE(check_case(acc_instead).empty());
  OpCase rms = find("rmsnorm_");
  EXPECT_TRUE(check_case(rms).empty());
  rms.in[1].grad = Grad::Overwrite;  // dw is (+=) in the header: reading it as (=) must fail
  EXPECT_FALSE(check_case(rms).empty());
}

}  // namespace
}  // namespace zaya
