// GPU tests of the CCA kernels (backend/cuda/kernels/cca.cu; label gpu, skipped without a CUDA
// device): cca_conv_fwd + cca_qkv_finish_fwd and their backward passes against the CPU reference
// ops composed exactly as ZayaModel / Trainer compose them (mean skip, the two convolutions,
// QK-norm with temperature on k, partial NeoX RoPE, delayed values), on random bf16-representable
// packed projections; bit-identical repeated backward (determinism); the same for a
// context-parallel chunk (a random conv history with its gradient dhist, RoPE positions from an
// offset pos0); and decoding with the conv history and the delayed-value state (prefix, then short
// segments including S < P) against the full sequence. Tolerances: fp32 paths (mid, norms, dconv)
// as before; the tensor-core conv outputs and the gradients that flow through them by the bf16 rule
// of expect_bf16_rule (twice the error of a naive bf16-operand computation against the fp32
// reference), and conv additionally within 1e-5·max|ref| of the exact bf16-operand product.
// ZAYA_CCA_BENCH=1 additionally enables CudaCca.Benchmark (ZAYA1 training shape and a decode step;
// prints ms per call, GB/s and, for the convs, TFLOP/s).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../backend/op_registry.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace zaya::cuda {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device buffers freed at scope end.
class DeviceBuffers {
 public:
  ~DeviceBuffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) return nullptr;
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    if (p) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
  }
  // bf16 values kept on the host as raw 16-bit patterns (core/dtype.h), same bits on the device.
  bf16* upload_bf16(const std::vector<uint16_t>& v) {
    return reinterpret_cast<bf16*>(upload<uint16_t>(v));
  }

 private:
  std::vector<void*> ptrs_;
};

template <typename T>
std::vector<T> download(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}
std::vector<float> download_bf16(const bf16* p, size_t n) {
  const auto raw = download(reinterpret_cast<const uint16_t*>(p), n);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = zaya::bf16_to_f32(raw[i]);
  return v;
}

// max|got - ref| <= rel · max|ref| (+ a floor for all-zero references); non-finite values fail.
void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& ref, double rel) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double mx = 0, md = 0;
  size_t worst = 0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); i++) {
    mx = std::max(mx, double(std::fabs(ref[i])));
    if (!std::isfinite(got[i])) finite = false;
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (d > md) {
      md = d;
      worst = i;
    }
  }
  EXPECT_TRUE(finite) << what << ": non-finite values";
  EXPECT_LE(md, rel * mx + 1e-30) << what << ": max |diff| " << md << " at " << worst << " (got "
                                  << got[worst] << ", ref " << ref[worst] << "), max |ref| " << mx;
}

// max |a_i − b_i|.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}
double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}
float round_bf16(float x) {
  return zaya::bf16_to_f32(zaya::f32_to_bf16(x));
}
std::vector<float> rounded_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

// Tolerance of the tensor-core conv (bf16 operands, fp32 accumulation): the registry's bf16 rule
// (tests/backend/op_registry.h, tests/README.md) with the naive computation done with
// bf16-rounded operands (exact products, double sums) and `fp32_rel`·max|ref| for what the fp32
// parts (summation order, the fp32 inputs' own tolerance) contribute. Random inputs at these sizes
// put the naive error at 2–3e-3·max|ref|: one bf16 rounding (2^-9 relative) per operand, summed
// with random signs over d·t1 (conv) or B·S (weight gradient) terms. A wrong tap, group or
// transposition is an O(max|ref|) error and fails by two orders of magnitude.
void expect_bf16_rule(const std::string& what, const std::vector<float>& got,
                      const std::vector<float>& ref, const std::vector<float>& naive,
                      double fp32_rel) {
  if (auto f = op_test::bf16_failure(what, got, ref, naive, fp32_rel)) ADD_FAILURE() << *f;
}

struct Shape {
  int64_t B, S, Hq, Hkv, d, t0, t1, r;
  double theta;
  int64_t QD() const { return Hq * d; }
  int64_t KD() const { return Hkv * d; }
  int64_t VH() const { return KD() / 2; }
  int64_t C() const { return (Hq + Hkv) * d; }
  int64_t ld() const { return C() + KD() + 8; }  // 8 spare columns: strided rows, left untouched
  int64_t N() const { return B * S; }
  int64_t P() const { return (t0 - 1) + (t1 - 1); }
  int64_t M() const { return S + t1 - 1; }
};

std::string name(const Shape& s) {
  return "B" + std::to_string(s.B) + " S" + std::to_string(s.S) + " Hq" + std::to_string(s.Hq) +
         " Hkv" + std::to_string(s.Hkv) + " d" + std::to_string(s.d) +
         " t0=" + std::to_string(s.t0) + " t1=" + std::to_string(s.t1) + " r" + std::to_string(s.r);
}

std::vector<float> randn(Rng& g, size_t n, float scale, float offset = 0.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = offset + scale * g.normal();
  return v;
}
// Rounds to bf16 in place and returns the bit patterns.
std::vector<uint16_t> to_bf16(std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); i++) {
    b[i] = zaya::f32_to_bf16(v[i]);
    v[i] = zaya::bf16_to_f32(b[i]);
  }
  return b;
}

struct Params {
  std::vector<float> wdw, bdw, wg, bg, temp;
};
Params make_params(const Shape& s, Rng& g) {
  Params p;
  p.wdw = randn(g, size_t(s.C() * s.t0), 0.5f);
  p.bdw = randn(g, size_t(s.C()), 0.1f);
  p.wg = randn(g, size_t(s.C() * s.d * s.t1), 1.0f / std::sqrt(float(s.d * s.t1)));
  p.bg = randn(g, size_t(s.C()), 0.1f);
  p.temp = randn(g, size_t(s.Hkv), 0.2f, 1.0f);
  return p;
}

// The CPU reference forward and backward, composed as Trainer::attention_fwd / attention_bwd do.
// hist (fp32 [B,P,C], empty: zero padding) and pos0 (RoPE positions pos0 + t) are the inputs of a
// context-parallel chunk; dhist is the history's gradient (with hist only).
struct CpuRef {
  std::vector<float> hist;
  int64_t pos0 = 0;
  std::vector<float> qk0, conv, mid, qpre, kpre, qnorm, knorm, q, k, v;
  std::vector<float> dconv, dq0, dk0, dvc, dvd, dwdw, dbdw, dwg, dbg, dtemp, dhist;
};

const float* hist_of(const CpuRef& R) {
  return R.hist.empty() ? nullptr : R.hist.data();
}

// The step after the convolutions (mean skip, QK-norm, RoPE, delayed values) from R.conv.
void cpu_finish(CpuRef& R, const Shape& s, const Params& p, const std::vector<float>& qkv) {
  const int64_t N = s.N(), QD = s.QD(), KD = s.KD(), VH = s.VH(), C = s.C(), ld = s.ld();
  std::vector<float> q0(size_t(N * QD)), k0(size_t(N * KD)), mq(size_t(N * QD)), mk(size_t(N * KD));
  for (int64_t n = 0; n < N; n++) {
    for (int64_t i = 0; i < QD; i++) q0[size_t(n * QD + i)] = qkv[size_t(n * ld + i)];
    for (int64_t i = 0; i < KD; i++) k0[size_t(n * KD + i)] = qkv[size_t(n * ld + QD + i)];
  }
  cpu::cca_mean_skip(mq.data(), mk.data(), q0.data(), k0.data(), N, s.Hq, s.Hkv, s.d);
  R.qpre.assign(size_t(N * QD), 0.0f);
  R.kpre.assign(size_t(N * KD), 0.0f);
  for (int64_t n = 0; n < N; n++) {
    for (int64_t i = 0; i < QD; i++)
      R.qpre[size_t(n * QD + i)] = R.conv[size_t(n * C + i)] + mq[size_t(n * QD + i)];
    for (int64_t i = 0; i < KD; i++)
      R.kpre[size_t(n * KD + i)] = R.conv[size_t(n * C + QD + i)] + mk[size_t(n * KD + i)];
  }
  R.v.assign(size_t(N * KD), 0.0f);
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < VH; i++) {
      R.v[size_t(n * KD + i)] = qkv[size_t(n * ld + C + i)];
      if (n % s.S > 0) R.v[size_t(n * KD + VH + i)] = qkv[size_t((n - 1) * ld + C + VH + i)];
    }
  R.q.assign(size_t(N * QD), 0.0f);
  R.k.assign(size_t(N * KD), 0.0f);
  R.qnorm.assign(size_t(N * s.Hq), 0.0f);
  R.knorm.assign(size_t(N * s.Hkv), 0.0f);
  cpu::qk_norm(R.q.data(), R.qnorm.data(), R.qpre.data(), nullptr, N, s.Hq, s.d);
  cpu::qk_norm(R.k.data(), R.knorm.data(), R.kpre.data(), p.temp.data(), N, s.Hkv, s.d);
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; n++) pos[size_t(n)] = R.pos0 + n % s.S;
  cpu::rope(R.q.data(), pos.data(), s.theta, N, s.Hq, s.d, s.r);
  cpu::rope(R.k.data(), pos.data(), s.theta, N, s.Hkv, s.d, s.r);
}

void cpu_forward(CpuRef& R, const Shape& s, const Params& p, const std::vector<float>& qkv) {
  const int64_t N = s.N(), C = s.C(), ld = s.ld();
  R.qk0.assign(size_t(N * C), 0.0f);
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < C; i++) R.qk0[size_t(n * C + i)] = qkv[size_t(n * ld + i)];
  R.conv.assign(size_t(N * C), 0.0f);
  R.mid.assign(size_t(s.B * s.M() * C), 0.0f);
  cpu::cca_conv(R.conv.data(), R.mid.data(), R.qk0.data(), hist_of(R), p.wdw.data(), p.bdw.data(),
                p.wg.data(), p.bg.data(), s.B, s.S, C, s.d, s.t0, s.t1);
  cpu_finish(R, s, p, qkv);
}

void cpu_backward(CpuRef& R, const Shape& s, const Params& p, std::vector<float> dq,
                  std::vector<float> dk, const std::vector<float>& dv) {
  const int64_t N = s.N(), QD = s.QD(), KD = s.KD(), VH = s.VH(), C = s.C(), G = s.Hq / s.Hkv,
                d = s.d;
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; n++) pos[size_t(n)] = R.pos0 + n % s.S;
  cpu::rope_backward(dq.data(), pos.data(), s.theta, N, s.Hq, d, s.r);
  cpu::rope_backward(dk.data(), pos.data(), s.theta, N, s.Hkv, d, s.r);
  std::vector<float> dqpre(size_t(N * QD)), dkpre(size_t(N * KD));
  cpu::qk_norm_backward(dqpre.data(), nullptr, dq.data(), R.qpre.data(), R.qnorm.data(), nullptr, N,
                        s.Hq, d);
  cpu::qk_norm_backward(dkpre.data(), R.dtemp.data(), dk.data(), R.kpre.data(), R.knorm.data(),
                        p.temp.data(), N, s.Hkv, d);
  R.dconv.assign(size_t(N * C), 0.0f);
  for (int64_t n = 0; n < N; n++) {
    std::copy_n(dqpre.data() + n * QD, QD, R.dconv.data() + n * C);
    std::copy_n(dkpre.data() + n * KD, KD, R.dconv.data() + n * C + QD);
  }
  std::vector<float> dqk0(size_t(N * C));
  if (hist_of(R)) R.dhist.assign(size_t(s.B * s.P() * C), 0.0f);
  cpu::cca_conv_backward(dqk0.data(), R.dwdw.data(), R.dbdw.data(), R.dwg.data(), R.dbg.data(),
                         R.dconv.data(), R.qk0.data(), R.mid.data(), p.wdw.data(), p.wg.data(), s.B,
                         s.S, C, d, s.t0, s.t1, hist_of(R), hist_of(R) ? R.dhist.data() : nullptr);
  R.dq0.assign(size_t(N * QD), 0.0f);
  R.dk0.assign(size_t(N * KD), 0.0f);
  for (int64_t n = 0; n < N; n++) {
    for (int64_t i = 0; i < KD; i++) R.dk0[size_t(n * KD + i)] = dqk0[size_t(n * C + QD + i)];
    for (int64_t h = 0; h < s.Hq; h++) {
      const int64_t gk = h / G;
      for (int64_t i = 0; i < d; i++) {
        const float t = 0.5f * (dqpre[size_t((n * s.Hq + h) * d + i)] +
                                dkpre[size_t((n * s.Hkv + gk) * d + i)] / float(G));
        R.dq0[size_t(n * QD + h * d + i)] = dqk0[size_t(n * C + h * d + i)] + t;
        R.dk0[size_t(n * KD + gk * d + i)] += t;
      }
    }
  }
  R.dvc.assign(size_t(N * VH), 0.0f);
  R.dvd.assign(size_t(N * VH), 0.0f);
  for (int64_t n = 0; n < N; n++) {
    std::copy_n(dv.data() + n * KD, VH, R.dvc.data() + n * VH);
    if (n % s.S + 1 < s.S) std::copy_n(dv.data() + (n + 1) * KD + VH, VH, R.dvd.data() + n * VH);
  }
}

// Columns [c0, c0+w) of each of N rows with stride ld.
std::vector<float> columns(const std::vector<float>& rows, int64_t N, int64_t ld, int64_t c0,
                           int64_t w) {
  std::vector<float> out(size_t(N * w));
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < w; i++) out[size_t(n * w + i)] = rows[size_t(n * ld + c0 + i)];
  return out;
}

// The grouped conv from a given depthwise output with both operands rounded to bf16 (exact
// products, double sums): y[n, co] = bg[co] + Σ_{ci, j} bf16(mid[b, t+j, c0+ci]) · bf16(wg[co, ci,
// j]).
std::vector<float> conv_bf16_operands(const Shape& s, const Params& p,
                                      const std::vector<float>& mid) {
  const int64_t C = s.C(), d = s.d, t1 = s.t1, M = s.M();
  const std::vector<float> wb = rounded_bf16(p.wg), mb = rounded_bf16(mid);
  std::vector<float> y(size_t(s.N() * C));
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t t = 0; t < s.S; t++)
      for (int64_t co = 0; co < C; co++) {
        const int64_t c0 = co / d * d;
        double acc = p.bg[size_t(co)];
        for (int64_t j = 0; j < t1; j++) {
          const float* u = mb.data() + (b * M + t + j) * C + c0;
          for (int64_t ci = 0; ci < d; ci++)
            acc += double(u[ci]) * double(wb[size_t((co * d + ci) * t1 + j)]);
        }
        y[size_t((b * s.S + t) * C + co)] = float(acc);
      }
  return y;
}

// A context-parallel chunk: with `hist`, the conv runs after a random fp32 history [B,P,C] (the
// previous chunk's raw columns) and backward returns its gradient dhist; RoPE positions start at
// pos0. The default is a training sequence (no history, positions from 0), which takes the
// overloads without these arguments; anything else takes the overloads with them.
struct Chunk {
  bool hist = false;
  int64_t pos0 = 0;
};

// Forward and backward against the CPU reference, and a repeated backward for determinism.
void check_train(const Shape& s, uint64_t seed, const Chunk& ck = {}) {
  SCOPED_TRACE(name(s) + (ck.hist ? " with history" : "") + " pos0 " + std::to_string(ck.pos0));
  Rng g(seed);
  const int64_t N = s.N(), QD = s.QD(), KD = s.KD(), VH = s.VH(), C = s.C(), ld = s.ld(),
                H = s.Hq + s.Hkv;
  const Params p = make_params(s, g);
  std::vector<float> qkv = randn(g, size_t(N * ld), 0.5f);
  const auto qkv_b = to_bf16(qkv);
  std::vector<float> dq = randn(g, size_t(N * QD), 0.05f), dk = randn(g, size_t(N * KD), 0.05f),
                     dv = randn(g, size_t(N * KD), 0.05f);
  const auto dq_b = to_bf16(dq), dk_b = to_bf16(dk), dv_b = to_bf16(dv);
  // Gradient accumulators start from nonzero values to check (+=).
  std::vector<float> dwdw0 = randn(g, size_t(C * s.t0), 0.1f), dbdw0 = randn(g, size_t(C), 0.1f),
                     dwg0 = randn(g, size_t(C * s.d * s.t1), 0.1f),
                     dbg0 = randn(g, size_t(C), 0.1f), dtemp0 = randn(g, size_t(s.Hkv), 0.1f);
  std::vector<float> dqkv_init = randn(g, size_t(N * ld), 1.0f);  // garbage: (=) must overwrite
  const auto dqkv_init_b = to_bf16(dqkv_init);
  // Drawn after everything above, so that the training cases' inputs do not depend on ck.
  const bool cp = ck.hist || ck.pos0 != 0;
  const size_t nh = size_t(s.B * s.P() * C);
  std::vector<float> hist, dhist_init;
  if (ck.hist) {
    hist = randn(g, nh, 0.5f);        // fp32, the scale of the raw columns
    dhist_init = randn(g, nh, 1.0f);  // garbage: (=) must overwrite
  }

  CpuRef R;
  R.hist = hist;
  R.pos0 = ck.pos0;
  cpu_forward(R, s, p, qkv);
  R.dwdw = dwdw0;
  R.dbdw = dbdw0;
  R.dwg = dwg0;
  R.dbg = dbg0;
  R.dtemp = dtemp0;
  cpu_backward(R, s, p, dq, dk, dv);

  DeviceBuffers db;
  bf16* d_qkv = db.upload_bf16(qkv_b);
  float *d_wdw = db.upload(p.wdw), *d_bdw = db.upload(p.bdw), *d_wg = db.upload(p.wg),
        *d_bg = db.upload(p.bg), *d_temp = db.upload(p.temp);
  float* d_conv = db.alloc<float>(size_t(N * C));
  float* d_mid = db.alloc<float>(size_t(s.B * s.M() * C));
  float* d_norms = db.alloc<float>(size_t(N * H));
  bf16* d_q = db.alloc<bf16>(size_t(N * QD));
  bf16* d_k = db.alloc<bf16>(size_t(N * KD));
  bf16* d_v = db.alloc<bf16>(size_t(N * KD));
  bf16 *d_dq = db.upload_bf16(dq_b), *d_dk = db.upload_bf16(dk_b), *d_dv = db.upload_bf16(dv_b);
  float* d_dconv = db.alloc<float>(size_t(N * C));
  bf16* d_dqkv = db.upload_bf16(dqkv_init_b);
  float *d_dwdw = db.upload(dwdw0), *d_dbdw = db.upload(dbdw0), *d_dwg = db.upload(dwg0),
        *d_dbg = db.upload(dbg0), *d_dtemp = db.upload(dtemp0);
  // Both take from one arena between resets, so it holds the sum.
  const size_t ws_bytes = cca_conv_bwd_workspace_bytes(s.B, s.S, C, s.d, s.t0, s.t1) +
                          cca_qkv_finish_bwd_workspace_bytes(N, s.Hq, s.Hkv);
  char* d_ws = db.alloc<char>(ws_bytes);
  float* d_hist = ck.hist ? db.upload(hist) : nullptr;
  float* d_dhist = ck.hist ? db.upload(dhist_init) : nullptr;
  ASSERT_TRUE(d_qkv && d_conv && d_mid && d_norms && d_q && d_k && d_v && d_dconv && d_dqkv &&
              d_dwg && d_ws && (!ck.hist || (d_hist && d_dhist)));
  Workspace ws{d_ws, ws_bytes, 0};
  cudaStream_t st = nullptr;

  // Training: no history update (the history is an input of the chunk).
  cca_conv_fwd(d_conv, d_mid, d_qkv, ld, d_hist, false, d_wdw, d_bdw, d_wg, d_bg, s.B, s.S, C, s.d,
               s.t0, s.t1, st);
  cca_qkv_finish_fwd(d_q, d_k, d_v, d_norms, d_conv, d_qkv, ld, d_temp, nullptr, false, ck.pos0,
                     s.theta, s.r, s.B, s.S, s.Hq, s.Hkv, s.d, st);
  auto backward = [&] {
    ws.reset();
    if (cp) {
      cca_qkv_finish_bwd(d_dconv, d_dqkv, ld, d_dtemp, d_dq, d_dk, d_dv, d_conv, d_qkv, d_norms,
                         d_temp, ck.pos0, s.theta, s.r, s.B, s.S, s.Hq, s.Hkv, s.d, ws, st);
      cca_conv_bwd(d_dqkv, ld, d_dwdw, d_dbdw, d_dwg, d_dbg, d_dconv, d_qkv, d_mid, d_wdw, d_wg,
                   s.B, s.S, C, s.d, s.t0, s.t1, d_hist, d_dhist, ws, st);
    } else {
      cca_qkv_finish_bwd(d_dconv, d_dqkv, ld, d_dtemp, d_dq, d_dk, d_dv, d_conv, d_qkv, d_norms,
                         d_temp, s.theta, s.r, s.B, s.S, s.Hq, s.Hkv, s.d, ws, st);
      cca_conv_bwd(d_dqkv, ld, d_dwdw, d_dbdw, d_dwg, d_dbg, d_dconv, d_qkv, d_mid, d_wdw, d_wg,
                   s.B, s.S, C, s.d, s.t0, s.t1, ws, st);
    }
  };
  backward();
  CK(cudaDeviceSynchronize());

  // Forward. mid (the fp32 depthwise output) and norms stay tight. conv: (1) against the same
  // bf16-operand product formed from the GPU's own mid, only the fp32 summation order may differ
  // (1e-5·max|ref|, as the fp32 GEMMs); (2) against the fp32 reference, the bf16 rule above.
  const auto conv = download(d_conv, size_t(N * C)), mid = download(d_mid, size_t(s.B * s.M() * C));
  expect_close("mid", mid, R.mid, 1e-5);
  expect_close("conv vs bf16-operand product", conv, conv_bf16_operands(s, p, mid), 1e-5);
  const auto conv_naive = conv_bf16_operands(s, p, R.mid);
  expect_bf16_rule("conv", conv, R.conv, conv_naive, 1e-5);
  // q and k are bf16 outputs (8e-3: about two bf16 ulps at the largest value) of a normalisation of
  // conv + skip; the conv's bf16 error carries through the norm at about its relative size, so it
  // is added with the same factor-two margin (and another two for rows whose norm is below the
  // typical one).
  const double conv_rel = max_abs_diff(conv_naive, R.conv) / max_abs(R.conv);
  // The finish step is checked twice: tightly against the CPU finish fed the GPU's own conv (G:
  // the finish kernels' own error only), and against the fp32 reference by the bf16 rule, the
  // naive error being the CPU finish fed the naive bf16-operand conv (Nf): the conv's bf16 error
  // carried through the norms, RoPE and the backward.
  auto finish_from = [&](const std::vector<float>& c) {
    CpuRef X = R;
    X.conv = c;
    cpu_finish(X, s, p, qkv);
    X.dtemp = dtemp0;
    cpu_backward(X, s, p, dq, dk, dv);
    return X;
  };
  const CpuRef G = finish_from(conv), Nf = finish_from(conv_naive);
  auto norms_of = [&](const CpuRef& X) {
    std::vector<float> ref(size_t(N * H));
    for (int64_t n = 0; n < N; n++) {
      for (int64_t h = 0; h < s.Hq; h++) ref[size_t(n * H + h)] = X.qnorm[size_t(n * s.Hq + h)];
      for (int64_t h = 0; h < s.Hkv; h++)
        ref[size_t(n * H + s.Hq + h)] = X.knorm[size_t(n * s.Hkv + h)];
    }
    return ref;
  };
  const auto norms = download(d_norms, size_t(N * H));
  expect_close("norms (from the GPU's conv)", norms, norms_of(G), 1e-5);
  expect_bf16_rule("norms", norms, norms_of(R), norms_of(Nf), 1e-5);
  const auto q = download_bf16(d_q, size_t(N * QD)), k = download_bf16(d_k, size_t(N * KD));
  expect_close("q (from the GPU's conv)", q, G.q, 8e-3);
  expect_close("k (from the GPU's conv)", k, G.k, 8e-3);
  expect_close("q", q, R.q, 8e-3 + 4 * conv_rel);
  expect_close("k", k, R.k, 8e-3 + 4 * conv_rel);
  expect_close("v", download_bf16(d_v, size_t(N * KD)), R.v, 0.0);  // a copy of bf16 values

  // Backward.
  const auto dconv = download(d_dconv, size_t(N * C));
  expect_close("dconv (from the GPU's conv)", dconv, G.dconv, 1e-3);
  expect_bf16_rule("dconv", dconv, R.dconv, Nf.dconv, 1e-3);
  // dq0/dk0: bf16 outputs (2e-2); the conv's data gradient adds its bf16-operand error (2–3e-3 of
  // its own scale, which is below the skip path's) well inside that.
  const auto dqkv = download_bf16(d_dqkv, size_t(N * ld));
  expect_close("dq0", columns(dqkv, N, ld, 0, QD), R.dq0, 2e-2);
  expect_close("dk0", columns(dqkv, N, ld, QD, KD), R.dk0, 2e-2);
  expect_close("dvc", columns(dqkv, N, ld, C, VH), R.dvc, 0.0);
  expect_close("dvd", columns(dqkv, N, ld, C + VH, VH), R.dvd, 0.0);
  expect_close("dqkv spare columns untouched", columns(dqkv, N, ld, C + KD, ld - C - KD),
               columns(dqkv_init, N, ld, C + KD, ld - C - KD), 0.0);
  const auto dwdw = download(d_dwdw, dwdw0.size()), dbdw = download(d_dbdw, dbdw0.size()),
             dwg = download(d_dwg, dwg0.size()), dbg = download(d_dbg, dbg0.size()),
             dtemp = download(d_dtemp, dtemp0.size());
  const auto dhist = ck.hist ? download(d_dhist, nh) : std::vector<float>();
  // Parameter gradients: the bf16 rule against the naive bf16-operand backward (the CPU backward
  // fed bf16-rounded dy, wg and mid, the operands the tensor cores see), with the fp32 budget of
  // 1e-3·max|ref| these sums over thousands of tokens always had (summation order; dy = dconv is
  // itself only within 1e-3).
  {
    CpuRef Nv = R;  // naive: same accumulator starting values
    Nv.dwdw = dwdw0, Nv.dbdw = dbdw0, Nv.dwg = dwg0, Nv.dbg = dbg0;
    std::vector<float> dqk0(size_t(N * C));
    cpu::cca_conv_backward(dqk0.data(), Nv.dwdw.data(), Nv.dbdw.data(), Nv.dwg.data(),
                           Nv.dbg.data(), rounded_bf16(R.dconv).data(), R.qk0.data(),
                           rounded_bf16(R.mid).data(), p.wdw.data(), rounded_bf16(p.wg).data(), s.B,
                           s.S, C, s.d, s.t0, s.t1, hist_of(R),
                           hist_of(R) ? Nv.dhist.data() : nullptr);
    expect_bf16_rule("dwdw", dwdw, R.dwdw, Nv.dwdw, 1e-3);
    expect_bf16_rule("dbdw", dbdw, R.dbdw, Nv.dbdw, 1e-3);
    expect_bf16_rule("dwg", dwg, R.dwg, Nv.dwg, 1e-3);
    expect_bf16_rule("dbg", dbg, R.dbg, Nv.dbg, 1e-3);
    // The history's gradient is the depthwise data gradient at padded indices 0..P-1 (fp32 output):
    // the same bf16 rule against the fp32 reference; and, fed the GPU's own dconv (so the tensor
    // cores' operands, bf16 dconv and wg, are the CPU's too), only the fp32 summation order of du
    // differs.
    if (ck.hist) {
      expect_bf16_rule("dhist", dhist, R.dhist, Nv.dhist, 1e-3);
      CpuRef X = R;
      X.dwdw = dwdw0, X.dbdw = dbdw0, X.dwg = dwg0, X.dbg = dbg0;
      cpu::cca_conv_backward(dqk0.data(), X.dwdw.data(), X.dbdw.data(), X.dwg.data(), X.dbg.data(),
                             rounded_bf16(dconv).data(), R.qk0.data(), R.mid.data(), p.wdw.data(),
                             rounded_bf16(p.wg).data(), s.B, s.S, C, s.d, s.t0, s.t1, hist_of(R),
                             X.dhist.data());
      expect_close("dhist (from the GPU's dconv)", dhist, X.dhist, 1e-4);
    }
  }
  expect_close("dtemp (from the GPU's conv)", dtemp, G.dtemp, 1e-3);
  expect_bf16_rule("dtemp", dtemp, R.dtemp, Nf.dtemp, 1e-3);

  // Determinism: the same backward again from the same accumulator values is bit-identical.
  cudaMemcpy(d_dwdw, dwdw0.data(), dwdw0.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_dbdw, dbdw0.data(), dbdw0.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_dwg, dwg0.data(), dwg0.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_dbg, dbg0.data(), dbg0.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_dtemp, dtemp0.data(), dtemp0.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_dqkv, dqkv_init_b.data(), dqkv_init_b.size() * 2, cudaMemcpyHostToDevice);
  if (ck.hist) cudaMemcpy(d_dhist, dhist_init.data(), nh * 4, cudaMemcpyHostToDevice);
  backward();
  CK(cudaDeviceSynchronize());
  if (ck.hist) EXPECT_EQ(download(d_dhist, nh), dhist);
  EXPECT_EQ(download(d_dwdw, dwdw0.size()), dwdw);
  EXPECT_EQ(download(d_dbdw, dbdw0.size()), dbdw);
  EXPECT_EQ(download(d_dwg, dwg0.size()), dwg);
  EXPECT_EQ(download(d_dbg, dbg0.size()), dbg);
  EXPECT_EQ(download(d_dtemp, dtemp0.size()), dtemp);
  EXPECT_EQ(download_bf16(d_dqkv, size_t(N * ld)), dqkv);
}

TEST(CudaCca, TrainD128Hq8Hkv2Kernel2x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_train({2, 150, 8, 2, 128, 2, 2, 64, 10000.0}, 1);
}
TEST(CudaCca, TrainD128Hq4Hkv2Kernel3x2LongerThanABlock) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_train({2, 600, 4, 2, 128, 3, 2, 64, 500000.0}, 2);
}
TEST(CudaCca, TrainD32Hq4Hkv2Kernel3x2ManyChunks) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // S > 2048 spans several token chunks of the grouped weight gradient; r/2 = 8 < 32 puts the
  // rotation partners in other lanes.
  check_train({2, 2100, 4, 2, 32, 3, 2, 16, 10000.0}, 3);
}
TEST(CudaCca, TrainD32Hq8Hkv2Kernel2x3FullRotary) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_train({2, 97, 8, 2, 32, 2, 3, 32, 10000.0}, 4);
}

TEST(CudaCca, TrainD64Hq2Hkv1Kernel2x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // d 64: the conv GEMMs' 64-column tile (4 columns per thread), the one d 128 and 32 miss.
  check_train({2, 130, 2, 1, 64, 2, 2, 32, 10000.0}, 7);
}

// Context parallelism: a chunk whose conv input continues the previous chunk's (history, P raw
// columns) and whose RoPE positions start at its global offset; the shapes of the training cases.
TEST(CudaCca, TrainWithHistoryD128Hq8Hkv2Kernel2x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_train({2, 150, 8, 2, 128, 2, 2, 64, 10000.0}, 11, {true, 0});
}
TEST(CudaCca, TrainWithHistoryD32Hq4Hkv2Kernel3x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // S 200: several depthwise row chunks (kRB = 64) and conv row tiles; P = 3.
  check_train({2, 200, 4, 2, 32, 3, 2, 16, 10000.0}, 12, {true, 0});
}
TEST(CudaCca, TrainWithHistoryChunkShorterThanHistory) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // S 1 < P 3 (M = 2 depthwise rows, fewer than the history's columns); B·S = 2 takes the direct
  // forward kernel.
  check_train({2, 1, 4, 2, 32, 3, 2, 16, 10000.0}, 13, {true, 0});
}
TEST(CudaCca, TrainAtPos300D128Hq8Hkv2Kernel2x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_train({2, 150, 8, 2, 128, 2, 2, 64, 10000.0}, 14, {false, 300});
}
TEST(CudaCca, TrainAtPos300D32Hq4Hkv2Kernel3x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // r/2 = 8 < 32: rotation partners in other lanes.
  check_train({2, 200, 4, 2, 32, 3, 2, 16, 10000.0}, 15, {false, 300});
}
TEST(CudaCca, TrainContextParallelChunkD128Hq8Hkv2Kernel2x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_train({2, 150, 8, 2, 128, 2, 2, 64, 10000.0}, 16, {true, 300});
}

// Decoding: the full sequence in one call (no history) against a prefix followed by short segments
// that carry the conv history and the last delayed value; segments shorter than P included.
void check_decode(const Shape& full, const std::vector<int64_t>& segments, uint64_t seed) {
  SCOPED_TRACE(name(full));
  Rng g(seed);
  const int64_t B = full.B, S = full.S, QD = full.QD(), KD = full.KD(), VH = full.VH(),
                C = full.C(), ld = full.ld(), P = full.P(), N = full.N();
  const Params p = make_params(full, g);
  std::vector<float> qkv = randn(g, size_t(N * ld), 0.5f);
  const auto qkv_b = to_bf16(qkv);
  DeviceBuffers db;
  float *d_wdw = db.upload(p.wdw), *d_bdw = db.upload(p.bdw), *d_wg = db.upload(p.wg),
        *d_bg = db.upload(p.bg), *d_temp = db.upload(p.temp);
  cudaStream_t st = nullptr;

  // Full sequence.
  bf16* d_qkv = db.upload_bf16(qkv_b);
  float* d_conv = db.alloc<float>(size_t(N * C));
  bf16 *d_q = db.alloc<bf16>(size_t(N * QD)), *d_k = db.alloc<bf16>(size_t(N * KD)),
       *d_v = db.alloc<bf16>(size_t(N * KD));
  ASSERT_TRUE(d_qkv && d_conv && d_q && d_k && d_v);
  cca_conv_fwd(d_conv, nullptr, d_qkv, ld, nullptr, false, d_wdw, d_bdw, d_wg, d_bg, B, S, C,
               full.d, full.t0, full.t1, st);
  cca_qkv_finish_fwd(d_q, d_k, d_v, nullptr, d_conv, d_qkv, ld, d_temp, nullptr, false, 0,
                     full.theta, full.r, B, S, full.Hq, full.Hkv, full.d, st);
  CK(cudaDeviceSynchronize());
  const auto conv_full = download(d_conv, size_t(N * C));
  const auto q_full = download_bf16(d_q, size_t(N * QD)),
             k_full = download_bf16(d_k, size_t(N * KD)),
             v_full = download_bf16(d_v, size_t(N * KD));

  // Segments, with state zero-initialised as a fresh cache is.
  float* d_hist = db.upload(std::vector<float>(size_t(B * P * C), 0.0f));
  float* d_vd_last = db.upload(std::vector<float>(size_t(B * VH), 0.0f));
  int64_t pos0 = 0;
  for (const int64_t L : segments) {
    ASSERT_LE(pos0 + L, S);
    SCOPED_TRACE("segment at " + std::to_string(pos0) + " of length " + std::to_string(L));
    std::vector<uint16_t> seg(size_t(B * L * ld));
    for (int64_t b = 0; b < B; b++)
      std::copy_n(qkv_b.data() + (b * S + pos0) * ld, L * ld, seg.data() + b * L * ld);
    DeviceBuffers sb;
    bf16* s_qkv = sb.upload_bf16(seg);
    float* s_conv = sb.alloc<float>(size_t(B * L * C));
    bf16 *s_q = sb.alloc<bf16>(size_t(B * L * QD)), *s_k = sb.alloc<bf16>(size_t(B * L * KD)),
         *s_v = sb.alloc<bf16>(size_t(B * L * KD));
    ASSERT_TRUE(s_qkv && s_conv && s_q && s_k && s_v);
    cca_conv_fwd(s_conv, nullptr, s_qkv, ld, d_hist, true, d_wdw, d_bdw, d_wg, d_bg, B, L, C,
                 full.d, full.t0, full.t1, st);
    cca_qkv_finish_fwd(s_q, s_k, s_v, nullptr, s_conv, s_qkv, ld, d_temp, d_vd_last, true, pos0,
                       full.theta, full.r, B, L, full.Hq, full.Hkv, full.d, st);
    CK(cudaDeviceSynchronize());
    auto rows = [&](const std::vector<float>& all, int64_t w) {
      std::vector<float> out(size_t(B * L * w));
      for (int64_t b = 0; b < B; b++)
        std::copy_n(all.data() + (b * S + pos0) * w, L * w, out.data() + b * L * w);
      return out;
    };
    // The direct (decode) kernel rounds u and wg to bf16 as the tensor-core GEMM does, so only
    // the fp32 summation order differs.
    expect_close("conv", download(s_conv, size_t(B * L * C)), rows(conv_full, C), 1e-5);
    // Identical fp32 inputs give identical sums up to the order of the conv's tiles; allow one
    // bf16 rounding flip.
    expect_close("q", download_bf16(s_q, size_t(B * L * QD)), rows(q_full, QD), 1e-2);
    expect_close("k", download_bf16(s_k, size_t(B * L * KD)), rows(k_full, KD), 1e-2);
    expect_close("v", download_bf16(s_v, size_t(B * L * KD)), rows(v_full, KD), 0.0);
    pos0 += L;
  }
}

TEST(CudaCca, DecodeMatchesFullSequenceKernel2x2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_decode({2, 9, 8, 2, 128, 2, 2, 64, 10000.0}, {4, 1, 1, 2, 1}, 5);
}
TEST(CudaCca, DecodeMatchesFullSequenceKernel3x2ShortSegments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // P = 3: segments of 1 and 2 tokens are shorter than the history.
  check_decode({2, 10, 4, 2, 32, 3, 2, 16, 10000.0}, {3, 1, 2, 1, 1, 2}, 6);
}

TEST(CudaCca, PrefillWithHistoryMatchesFullSequence) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Segments of 20 and 14 tokens (B·S > 16) take the tensor-core GEMM with the history in its
  // loader; 5 and 1 take the direct kernel.
  check_decode({2, 40, 8, 2, 128, 2, 2, 64, 10000.0}, {5, 20, 1, 14}, 8);
}

// ZAYA_CCA_BENCH=1: times the four CCA calls at the ZAYA1 training shape of one layer (B 4, S 4096,
// Hq 8, Hkv 2, d 128, t0 = t1 = 2, packed row stride C + Hkv·d = 1536, r 64) and a decode step
// (B 4, S 1, with history); prints ms per call, effective GB/s (the bytes each call must move at
// the API: inputs read once, outputs written once, no workspace traffic) and, for the convs,
// TFLOP/s of the grouped conv (2·N·C·d·t1 forward, twice that backward).
TEST(CudaCca, Benchmark) {
  const char* env = std::getenv("ZAYA_CCA_BENCH");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set ZAYA_CCA_BENCH=1 to run";
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 4, S = 4096, Hq = 8, Hkv = 2, d = 128, t0 = 2, t1 = 2, r = 64;
  const double theta = 10000.0;
  const int64_t N = B * S, H = Hq + Hkv, C = H * d, KD = Hkv * d, ld = C + KD, M = S + t1 - 1,
                P = (t0 - 1) + (t1 - 1);
  Rng g(7);
  std::vector<float> qkv_f = randn(g, size_t(N * ld), 0.5f);
  const auto qkv_b = to_bf16(qkv_f);
  std::vector<float> dq_f = randn(g, size_t(N * Hq * d), 0.05f),
                     dk_f = randn(g, size_t(N * KD), 0.05f), dv_f = randn(g, size_t(N * KD), 0.05f);
  const auto dq_b = to_bf16(dq_f), dk_b = to_bf16(dk_f), dv_b = to_bf16(dv_f);
  const Params p = make_params({B, S, Hq, Hkv, d, t0, t1, r, theta}, g);

  DeviceBuffers db;
  bf16* d_qkv = db.upload_bf16(qkv_b);
  float *d_wdw = db.upload(p.wdw), *d_bdw = db.upload(p.bdw), *d_wg = db.upload(p.wg),
        *d_bg = db.upload(p.bg), *d_temp = db.upload(p.temp);
  float* d_conv = db.alloc<float>(size_t(N * C));
  float* d_mid = db.alloc<float>(size_t(B * M * C));
  float* d_norms = db.alloc<float>(size_t(N * H));
  bf16 *d_q = db.alloc<bf16>(size_t(N * Hq * d)), *d_k = db.alloc<bf16>(size_t(N * KD)),
       *d_v = db.alloc<bf16>(size_t(N * KD));
  bf16 *d_dq = db.upload_bf16(dq_b), *d_dk = db.upload_bf16(dk_b), *d_dv = db.upload_bf16(dv_b);
  float* d_dconv = db.alloc<float>(size_t(N * C));
  bf16* d_dqkv = db.alloc<bf16>(size_t(N * ld));
  float *d_dwdw = db.alloc<float>(size_t(C * t0)), *d_dbdw = db.alloc<float>(size_t(C)),
        *d_dwg = db.alloc<float>(size_t(C * d * t1)), *d_dbg = db.alloc<float>(size_t(C)),
        *d_dtemp = db.alloc<float>(size_t(Hkv));
  const size_t ws_bytes = cca_conv_bwd_workspace_bytes(B, S, C, d, t0, t1) +
                          cca_qkv_finish_bwd_workspace_bytes(N, Hq, Hkv);
  char* d_ws = db.alloc<char>(ws_bytes);
  // Decode step state: history and a one-token segment per sequence.
  float* d_hist = db.upload(std::vector<float>(size_t(B * P * C), 0.0f));
  float* d_conv1 = db.alloc<float>(size_t(B * C));
  ASSERT_TRUE(d_qkv && d_conv && d_mid && d_norms && d_q && d_k && d_v && d_dconv && d_dqkv &&
              d_dwg && d_ws && d_hist && d_conv1);
  CK(cudaMemset(d_dwdw, 0, size_t(C * t0) * 4));
  CK(cudaMemset(d_dbdw, 0, size_t(C) * 4));
  CK(cudaMemset(d_dwg, 0, size_t(C * d * t1) * 4));
  CK(cudaMemset(d_dbg, 0, size_t(C) * 4));
  CK(cudaMemset(d_dtemp, 0, size_t(Hkv) * 4));
  Workspace ws{d_ws, ws_bytes, 0};
  cudaStream_t st = nullptr;

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& fn, int iters) {
    for (int i = 0; i < 3; i++) fn();  // warm-up
    cudaEventRecord(e0, st);
    for (int i = 0; i < iters; i++) fn();
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return double(ms) / iters;
  };
  auto conv_fwd = [&] {
    cca_conv_fwd(d_conv, d_mid, d_qkv, ld, nullptr, false, d_wdw, d_bdw, d_wg, d_bg, B, S, C, d, t0,
                 t1, st);
  };
  auto finish_fwd = [&] {
    cca_qkv_finish_fwd(d_q, d_k, d_v, d_norms, d_conv, d_qkv, ld, d_temp, nullptr, false, 0, theta,
                       r, B, S, Hq, Hkv, d, st);
  };
  auto finish_bwd = [&] {
    ws.reset();
    cca_qkv_finish_bwd(d_dconv, d_dqkv, ld, d_dtemp, d_dq, d_dk, d_dv, d_conv, d_qkv, d_norms,
                       d_temp, theta, r, B, S, Hq, Hkv, d, ws, st);
  };
  auto conv_bwd = [&] {
    ws.reset();
    cca_conv_bwd(d_dqkv, ld, d_dwdw, d_dbdw, d_dwg, d_dbg, d_dconv, d_qkv, d_mid, d_wdw, d_wg, B, S,
                 C, d, t0, t1, ws, st);
  };
  auto decode = [&] {
    cca_conv_fwd(d_conv1, nullptr, d_qkv, ld, d_hist, true, d_wdw, d_bdw, d_wg, d_bg, B, 1, C, d,
                 t0, t1, st);
  };
  const int iters = 20;
  const double ms_cf = time_ms(conv_fwd, iters), ms_ff = time_ms(finish_fwd, iters),
               ms_fb = time_ms(finish_bwd, iters), ms_cb = time_ms(conv_bwd, iters),
               ms_dec = time_ms(decode, 200);
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());

  const double n = double(N), c = double(C), mrows = double(B * M),
               qkvd = double((Hq + 2 * Hkv) * d);
  const double by_cf = n * c * 2 + n * c * 4 + mrows * c * 4;
  const double by_ff = n * c * 4 + n * double(ld) * 2 + n * qkvd * 2 + n * double(H) * 4;
  const double by_fb =
      n * qkvd * 2 + n * c * 4 + n * c * 2 + n * double(H) * 4 + n * c * 4 + n * double(ld) * 2;
  const double by_cb = n * c * 4 + mrows * c * 4 + n * c * 2 + n * c * 4;
  const double fl_cf = 2.0 * n * c * double(d * t1), fl_cb = 2 * fl_cf;
  std::printf("CCA B=%lld S=%lld Hq=%lld Hkv=%lld d=%lld t0=%lld t1=%lld ld=%lld r=%lld:\n",
              (long long)B, (long long)S, (long long)Hq, (long long)Hkv, (long long)d,
              (long long)t0, (long long)t1, (long long)ld, (long long)r);
  auto line = [](const char* what, double ms, double bytes, double flops) {
    std::printf("  %-20s %8.3f ms  %7.1f GB/s", what, ms, bytes / (ms * 1e-3) / 1e9);
    if (flops > 0) std::printf("  %7.2f TFLOP/s (bf16 tensor cores)", flops / (ms * 1e-3) / 1e12);
    std::printf("\n");
  };
  line("cca_conv_fwd", ms_cf, by_cf, fl_cf);
  line("cca_qkv_finish_fwd", ms_ff, by_ff, 0);
  line("cca_qkv_finish_bwd", ms_fb, by_fb, 0);
  line("cca_conv_bwd", ms_cb, by_cb, fl_cb);
  std::printf("  %-20s %8.3f ms  (all four, per layer)\n", "total", ms_cf + ms_ff + ms_fb + ms_cb);
  std::printf("  %-20s %8.3f us  (B=%lld, S=1, with history)\n", "decode cca_conv_fwd",
              ms_dec * 1e3, (long long)B);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  EXPECT_GT(ms_cf, 0);
  EXPECT_GT(ms_cb, 0);
}

}  // namespace
}  // namespace zaya::cuda
