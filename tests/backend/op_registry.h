// The op-test registry over both backends (DESIGN.md convention 3, after ggml's test-backend-ops):
// a table of cases, each one op of src/backend/cpu/ops.h at one shape with its random inputs
// (zaya::Rng), the CPU op in fp32, an independent double-precision reference written from ZAYA1.md
// §3 and the header comments (plain loops; it never calls the op), and, where the op has a CUDA
// counterpart (src/backend/cuda/ops.h), one or more CUDA variants of it. Two drivers run a case:
//  - check_case (the CPU side, zaya_tests, label cpu): every output of the fp32 op against the
//    reference, and the fp32 analytic gradient of a random functional L = Σ w·out against central
//    finite differences of the double reference, with the gradient buffers pre-filled with random
//    values so that the header's accumulate (+=) and overwrite (=) contracts are checked too;
//  - check_cuda (the CUDA side, zaya_gpu_tests, label gpu): every output of a CUDA variant against
//    the same double reference, and its gradients against the CPU op's backward on the same w and
//    pre-filled buffers; the backward optionally twice, demanding the same bits (deterministic
//    reductions).
// Both compare by the rules below and nothing else; tests/README.md states them.
//
// Tolerance rules (one place; the GPU test files that keep their own cases use them too):
//  - exact outputs (routing choices, counts, permutations, copies): equal element for element;
//  - fp32 outputs: relative L2 error ‖got − ref‖/‖ref‖ below the case's fp32 bound (1e-5 unless the
//    case says otherwise), the same bound for the CPU op and the CUDA kernel;
//  - bf16 outputs (the bf16 rule, DESIGN.md §Numerics, as flash-attention tests its kernels): with
//    ref the fp32-or-better reference and naive the same computation done naively in bf16 (each
//    value an unfused implementation stores in bf16 rounded to bf16, fp32 math in between),
//        max|got − ref| <= 2 · max|naive − ref| + fp32_rel · max|ref|   (fp32_rel 1e-5 by default),
//    i.e. a bf16 kernel may be at most about twice as far from fp32 as the naive bf16 computation;
//    the second term covers what the fp32 parts (summation order, fast intrinsics) contribute. The
//    naive computation of an op that stores only its output in bf16 is the reference rounded to
//    bf16 once; cases whose unfused form stores intermediates in bf16 (attention's scores and
//    probabilities) supply it.
// Inputs that a CUDA kernel reads as bf16 are drawn on the bf16 grid (randn_bf16), so that both
// backends see the same values and the rules measure only the op's own error.
//
// Adding an op or a shape is adding one entry in make_cases() (op_cases.cpp), CUDA variants
// included; what the table cannot express (launch geometry at large shapes, fused kernels without
// a CPU op, graphs, decode variants, benchmarks) stays in tests/gpu/.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace zaya::op_test {

using Buf = std::vector<float>;
using DBuf = std::vector<double>;
using Bufs = std::vector<Buf>;
using DBufs = std::vector<DBuf>;

// ---- tolerance rules ---------------------------------------------------------------------------

inline float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}
template <typename T>
DBuf rounded_bf16(const std::vector<T>& v) {
  DBuf r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = double(round_bf16(float(v[i])));
  return r;
}

// ‖a − b‖ / ‖b‖; falls back to the absolute norm when the reference is exactly zero.
template <typename A, typename B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); i++) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The first non-finite element of got, or a size mismatch; nullopt when neither.
template <typename A, typename B>
std::optional<std::string> shape_or_nonfinite(const std::string& what, const std::vector<A>& got,
                                              const std::vector<B>& ref) {
  if (got.size() != ref.size())
    return fmt::format("{}: size {} vs reference {}", what, got.size(), ref.size());
  for (size_t i = 0; i < got.size(); i++)
    if (!std::isfinite(double(got[i])))
      return fmt::format("{}[{}] = {} is not finite (unwritten?)", what, i, double(got[i]));
  return std::nullopt;
}

// Exact outputs: equal element for element.
template <typename A, typename B>
std::optional<std::string> exact_failure(const std::string& what, const std::vector<A>& got,
                                         const std::vector<B>& ref) {
  if (got.size() != ref.size())
    return fmt::format("{}: size {} vs reference {}", what, got.size(), ref.size());
  for (size_t i = 0; i < got.size(); i++)
    if (double(got[i]) != double(ref[i]))
      return fmt::format("{}[{}] = {} but reference {}", what, i, double(got[i]), double(ref[i]));
  return std::nullopt;
}

// fp32 outputs: relative L2 error below tol.
template <typename A, typename B>
std::optional<std::string> fp32_failure(const std::string& what, const std::vector<A>& got,
                                        const std::vector<B>& ref, double tol) {
  if (auto f = shape_or_nonfinite(what, got, ref)) return f;
  const double e = rel_err(got, ref);
  if (std::getenv("ZAYA_OPS_VERBOSE")) fmt::print("  {}: relative error {:.3g}\n", what, e);
  if (!(e < tol)) return fmt::format("{}: relative error {:.3g} >= {:.1g}", what, e, tol);
  return std::nullopt;
}

// The bf16 rule: max|got − ref| <= 2·max|naive − ref| + fp32_rel·max|ref|.
template <typename A, typename B, typename C>
std::optional<std::string> bf16_failure(const std::string& what, const std::vector<A>& got,
                                        const std::vector<B>& ref, const std::vector<C>& naive,
                                        double fp32_rel = 1e-5) {
  if (auto f = shape_or_nonfinite(what, got, ref)) return f;
  if (naive.size() != ref.size())
    return fmt::format("{}: naive bf16 computation has size {}", what, naive.size());
  double md = 0, naive_err = 0, mx = 0;
  size_t worst = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double r = double(ref[i]), d = std::fabs(double(got[i]) - r);
    mx = std::max(mx, std::fabs(r));
    naive_err = std::max(naive_err, std::fabs(double(naive[i]) - r));
    if (d > md) md = d, worst = i;
  }
  const double bound = 2.0 * naive_err + fp32_rel * mx;
  if (std::getenv("ZAYA_OPS_VERBOSE"))
    fmt::print("  {}: max|diff| {:.3g}, naive bf16 {:.3g}, max|ref| {:.3g}\n", what, md, naive_err,
               mx);
  if (md <= bound) return std::nullopt;
  return fmt::format(
      "{}: max|diff| {:.4g} at {} (got {}, ref {}) > 2·naive bf16 error {:.4g} + {:.1g}·max|ref| "
      "{:.4g}",
      what, md, worst, double(got[worst]), double(ref[worst]), naive_err, fp32_rel, mx);
}

// ---- cases
// ---------------------------------------------------------------------------------------

// How an op's backward writes the gradient of one input (the header's contract).
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

// One CUDA implementation of a case's op. Inputs and outputs are host buffers in the case's order
// (the callable uploads, runs on the device, synchronises and downloads); an output it returns
// empty is one the variant does not produce. bf16 values travel as their exact fp32 values.
struct CudaVariant {
  std::string name;                      // names the variant in test names ("" for the only one)
  std::function<Bufs(const Bufs&)> fwd;  // inputs -> one buffer per output
  // Per output: compared by the bf16 rule: stored in bf16, or stored in fp32 but computed from
  // bf16-rounded operands (tensor-core GEMMs; the case's naive_bf16 then rounds those operands).
  std::vector<bool> out_bf16;
  // Like OpCase::backward (null: forward only). dL/dout values are on the bf16 grid.
  std::function<void(const Bufs&, const Bufs&, Bufs&)> bwd;
  std::vector<Grad> grads;      // per input: the variant's contract when it differs from the case's
  std::vector<bool> grad_bf16;  // per input: gradient compared by the bf16 rule (as out_bf16)
  bool bwd_repeatable = false;  // bwd run twice gives the same bits (deterministic reductions)
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
  // fp32 bounds (relative L2). The fp32 CPU ops measure ~1e-7 on these sizes (ZAYA_OPS_VERBOSE=1
  // prints them); 1e-5 leaves margin yet catches e.g. the tanh GELU approximation (~1e-4 off).
  double fwd_tol = 1e-5;
  double bwd_tol = 1e-5;
  // The bf16 rule's fp32 term (fp32_rel·max|ref|) for outputs / gradients: 1e-5 unless the case
  // states what its fp32 parts contribute (parameter gradients summed over many tokens).
  double bf16_fwd_rel = 1e-5;
  double bf16_bwd_rel = 1e-5;
  // The naive bf16 computation of the outputs / of the gradients (inputs, dL/dout), for the bf16
  // rule; null: the reference (the CPU backward's gradients) rounded to bf16 once.
  std::function<DBufs(const DBufs&)> naive_bf16;
  std::function<DBufs(const Bufs&, const Bufs&)> naive_bf16_grads;
  // Cases whose inputs with gradients hold more than this many values skip the finite differences
  // (each one costs two reference evaluations); they exist for the CUDA kernels' tile and grid
  // boundaries, and their backward is checked against the CPU backward on the CUDA side.
  size_t fd_max_values = 4096;
  std::vector<CudaVariant> cuda;  // filled only in the GPU test binary (ZAYA_OP_TESTS_CUDA)
};
using Cases = std::vector<OpCase>;

// The table, built once (op_cases.cpp).
const Cases& registry();

// ---- drivers -----------------------------------------------------------------------------------

inline DBufs widen(const Bufs& v) {
  DBufs out;
  for (const Buf& b : v) out.emplace_back(b.begin(), b.end());
  return out;
}
inline Bufs inputs_of(const OpCase& c) {
  Bufs v;
  for (const Input& i : c.in) v.push_back(i.data);
  return v;
}

// The functional's weights w (bf16 grid, so that a CUDA backward reading dL/dout in bf16 sees the
// same values; zeros for non-differentiable outputs) and the gradient buffers' random prior
// content (empty where an input has no gradient), drawn from one seed.
struct BackwardSetup {
  Bufs w, prefill;
};
inline BackwardSetup backward_setup(const OpCase& c, const std::vector<size_t>& out_sizes,
                                    const std::vector<Grad>& grads, uint64_t seed) {
  Rng r(seed);
  BackwardSetup s;
  for (size_t o = 0; o < c.out.size(); o++) {
    Buf w(out_sizes[o], 0.0f);
    if (c.out[o].differentiable)
      for (float& x : w) x = round_bf16(r.normal());
    s.w.push_back(w);
  }
  for (size_t i = 0; i < c.in.size(); i++) {
    Buf p;
    if (grads[i] != Grad::None) {
      p.resize(c.in[i].data.size());
      for (float& x : p) x = 0.5f * r.normal();
    }
    s.prefill.push_back(p);
  }
  return s;
}
inline std::vector<Grad> case_grads(const OpCase& c) {
  std::vector<Grad> g;
  for (const Input& i : c.in) g.push_back(i.grad);
  return g;
}
// What the backward added to (+=) or wrote into (=) each gradient buffer.
inline Bufs derivative(const Bufs& grads, const Bufs& prefill, const std::vector<Grad>& contract) {
  Bufs d = grads;
  for (size_t i = 0; i < d.size(); i++)
    if (contract[i] == Grad::Accumulate)
      for (size_t k = 0; k < d[i].size(); k++) d[i][k] -= prefill[i][k];
  return d;
}

// Runs one case on the CPU; returns human-readable failures (empty when the op passes). Kept
// separate from gtest assertions so the self-test can check that broken ops are caught.
inline std::vector<std::string> check_case(const OpCase& c, uint64_t seed = 1234) {
  std::vector<std::string> fails;
  const Bufs in = inputs_of(c);
  const Bufs out = c.op(in);
  const DBufs ref = c.ref(widen(in));
  if (out.size() != c.out.size() || ref.size() != c.out.size()) {
    fails.push_back("op/reference returned the wrong number of outputs");
    return fails;
  }
  std::vector<size_t> out_sizes;
  for (size_t o = 0; o < c.out.size(); o++) {
    const std::string what = c.name + " forward " + c.out[o].name;
    out_sizes.push_back(out[o].size());
    std::optional<std::string> f = shape_or_nonfinite(what, out[o], ref[o]);
    if (!f)
      f = c.out[o].exact ? exact_failure(what, out[o], ref[o])
                         : fp32_failure(what, out[o], ref[o], c.fwd_tol);
    if (f) fails.push_back(*f);
  }
  if (!c.backward || !fails.empty()) return fails;

  const std::vector<Grad> contract = case_grads(c);
  size_t n_fd = 0;
  for (size_t i = 0; i < c.in.size(); i++)
    if (contract[i] != Grad::None) n_fd += in[i].size();
  if (n_fd > c.fd_max_values) return fails;
  const BackwardSetup s = backward_setup(c, out_sizes, contract, seed);
  Bufs grads = s.prefill;
  c.backward(in, s.w, grads);
  const Bufs analytic = derivative(grads, s.prefill, contract);
  auto L = [&](const DBufs& x) {
    const DBufs y = c.ref(x);
    double sum = 0;
    for (size_t o = 0; o < y.size(); o++)
      for (size_t i = 0; i < y[o].size(); i++) sum += double(s.w[o][i]) * y[o][i];
    return sum;
  };
  DBufs x = widen(in);
  for (size_t i = 0; i < c.in.size(); i++) {
    if (contract[i] == Grad::None) continue;
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
    const std::string what =
        fmt::format("{} backward d{} ({}) vs finite differences", c.name, c.in[i].name,
                    contract[i] == Grad::Accumulate ? "+=" : "=");
    if (auto f = fp32_failure(what, analytic[i], fd, c.bwd_tol)) fails.push_back(*f);
  }
  return fails;
}

// Runs one CUDA variant of a case against the double reference (outputs) and the CPU backward
// (gradients); returns failures as check_case does.
inline std::vector<std::string> check_cuda(const OpCase& c, const CudaVariant& v,
                                           uint64_t seed = 1234) {
  std::vector<std::string> fails;
  const std::string label = v.name.empty() ? c.name : c.name + " [" + v.name + "]";
  const Bufs in = inputs_of(c);
  const DBufs x = widen(in);
  const DBufs ref = c.ref(x);
  const Bufs got = v.fwd(in);
  if (got.size() != c.out.size() || v.out_bf16.size() != c.out.size()) {
    fails.push_back(label + ": the CUDA variant returned the wrong number of outputs");
    return fails;
  }
  const DBufs naive = c.naive_bf16 ? c.naive_bf16(x) : DBufs{};
  std::vector<size_t> out_sizes;
  for (size_t o = 0; o < c.out.size(); o++) {
    out_sizes.push_back(ref[o].size());
    if (got[o].empty()) continue;  // not produced by this variant
    const std::string what = label + " forward " + c.out[o].name;
    std::optional<std::string> f;
    if (c.out[o].exact)
      f = exact_failure(what, got[o], ref[o]);
    else if (v.out_bf16[o])
      f = bf16_failure(what, got[o], ref[o], naive.empty() ? rounded_bf16(ref[o]) : naive[o],
                       c.bf16_fwd_rel);
    else
      f = fp32_failure(what, got[o], ref[o], c.fwd_tol);
    if (f) fails.push_back(*f);
  }
  if (!v.bwd || !c.backward || !fails.empty()) return fails;

  const std::vector<Grad> cpu_contract = case_grads(c);
  const std::vector<Grad> dev_contract = v.grads.empty() ? cpu_contract : v.grads;
  std::vector<Grad> any(c.in.size(), Grad::None);
  for (size_t i = 0; i < any.size(); i++)
    if (cpu_contract[i] != Grad::None) any[i] = Grad::Overwrite;
  const BackwardSetup s = backward_setup(c, out_sizes, any, seed);
  Bufs cpu = s.prefill;
  c.backward(in, s.w, cpu);
  const Bufs want = derivative(cpu, s.prefill, cpu_contract);
  const DBufs naive_g = c.naive_bf16_grads ? c.naive_bf16_grads(in, s.w) : DBufs{};
  auto run = [&] {
    Bufs g = s.prefill;
    v.bwd(in, s.w, g);
    return g;
  };
  const Bufs dev = run();
  const Bufs have = derivative(dev, s.prefill, dev_contract);
  for (size_t i = 0; i < c.in.size(); i++) {
    if (dev_contract[i] == Grad::None || cpu_contract[i] == Grad::None) continue;
    const std::string what =
        fmt::format("{} backward d{} ({}) vs the CPU backward", label, c.in[i].name,
                    dev_contract[i] == Grad::Accumulate ? "+=" : "=");
    const bool bf = i < v.grad_bf16.size() && v.grad_bf16[i];
    std::optional<std::string> f =
        bf ? bf16_failure(what, have[i], want[i],
                          naive_g.empty() ? rounded_bf16(want[i]) : naive_g[i], c.bf16_bwd_rel)
           : fp32_failure(what, have[i], want[i], c.bwd_tol);
    if (f) fails.push_back(*f);
  }
  if (v.bwd_repeatable && fails.empty()) {
    const Bufs again = run();
    for (size_t i = 0; i < dev.size(); i++)
      if (again[i].size() != dev[i].size() ||
          std::memcmp(again[i].data(), dev[i].data(), dev[i].size() * sizeof(float)) != 0)
        fails.push_back(fmt::format("{} backward d{}: not bit-reproducible", label, c.in[i].name));
  }
  return fails;
}

// ---- case helpers
// --------------------------------------------------------------------------------

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}
inline Buf randn(Rng& r, int64_t n, float scale = 1.0f) {
  Buf v(sz(n));
  for (float& x : v) x = r.normal() * scale;
  return v;
}
// Normal values on the bf16 grid (inputs that a CUDA kernel reads as bf16).
inline Buf randn_bf16(Rng& r, int64_t n, float scale = 1.0f) {
  Buf v = randn(r, n, scale);
  for (float& x : v) x = round_bf16(x);
  return v;
}
inline Buf randu(Rng& r, int64_t n, float lo, float hi) {
  Buf v(sz(n));
  for (float& x : v) x = lo + (hi - lo) * r.uniform();
  return v;
}
inline int64_t randint(Rng& r, int64_t n) {
  return int64_t(r.next_u32() % uint32_t(n));
}

}  // namespace zaya::op_test
