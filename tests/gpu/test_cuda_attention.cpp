// Benchmark of the fused flash attention (backend/cuda/kernels/attention.cu), and the GPU tests of
// its backward's general form. The correctness of the forward (every layout) and of the
// self-attention backward against cpu::attention / cpu::attention_backward (head dims 32, 64, 128,
// sequence lengths that are not multiples of the tiles, GQA and plain multi-head, full causal and
// sliding window, decoding with q_start > 0, bit-reproducible backward) is the attention cases of
// the op-test registry (tests/backend/op_cases.cpp), run on the GPU by test_cuda_ops_registry.cpp.
//
// Here (label gpu, skipped without a CUDA device): the general backward (S queries at q_start..
// against Sk >= q_start + S keys, context parallelism's local chunk) on the GPU forward's own o and
// lse against cpu::attention_backward's general form, by the registry's bf16 rule (op_registry.h:
// twice the error of the naive bf16 computation of op_cases.cpp's naive_attention, +
// 1e-5·max|ref|), with q_start on and off the tiles, Sk = q_start + S and Sk beyond it, and sliding
// windows; dk/dv rows of keys that no query sees exactly 0, every output element written (outputs
// pre-filled with NaN), the backward bit-reproducible; with no queries (S = 0) dk/dv all 0; and the
// general form at q_start 0, Sk = S bit-identical to the self-attention call.
//
// ZAYA_ATTN_BENCH=1 enables AttentionCuda.Benchmark, which times forward and backward at the ZAYA1
// shape (B 4, S 4096, Hq 8, Hkv 2, d 128, causal) and prints ms and TFLOP/s.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../backend/op_registry.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "gpu_test_util.h"

namespace zaya::cuda {
namespace {

using test_util::DeviceBuffer;
using test_util::have_gpu;

TEST(AttentionCuda, Benchmark) {
  const char* env = std::getenv("ZAYA_ATTN_BENCH");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set ZAYA_ATTN_BENCH=1 to run";
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 4, S = 4096, Hq = 8, Hkv = 2, d = 128;
  const size_t nq = size_t(B * S * Hq * d), nkv = size_t(B * S * Hkv * d), nl = size_t(B * Hq * S);
  DeviceBuffer<bf16> q(nq), k(nkv), v(nkv), o(nq), dout(nq), dq(nq), dk(nkv), dv(nkv);
  DeviceBuffer<float> lse(nl);
  const size_t ws_bytes = attention_bwd_workspace_bytes(B, S, Hq, Hkv, d);
  DeviceBuffer<char> arena(ws_bytes);
  ASSERT_TRUE(q.p && k.p && v.p && o.p && dout.p && dq.p && dk.p && dv.p && lse.p && arena.p);
  {
    // Cheap uniform values in [-2, 2) rounded to bf16: realistic magnitudes, no ties to care about.
    std::vector<uint16_t> h(nq);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    auto fill = [&](bf16* dst, size_t n) {
      for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = zaya::f32_to_bf16(float(int32_t(x >> 32)) * (2.0f / 2147483648.0f));
      }
      return test_util::to_device(dst, h.data(), n * 2);
    };
    ASSERT_CUDA_OK(fill(q.p, nq));
    ASSERT_CUDA_OK(fill(k.p, nkv));
    ASSERT_CUDA_OK(fill(v.p, nkv));
    ASSERT_CUDA_OK(fill(dout.p, nq));
  }
  Workspace ws{arena.p, ws_bytes, 0};
  cudaEvent_t e0, e1;
  ASSERT_CUDA_OK(cudaEventCreate(&e0));
  ASSERT_CUDA_OK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& fn, int iters) {
    for (int i = 0; i < 3; i++) fn();  // warm-up (also sets the shared-memory attributes)
    cudaEventRecord(e0);
    for (int i = 0; i < iters; i++) fn();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return double(ms) / iters;
  };
  const double fwd_ms = time_ms(
      [&] { attention_fwd(o.p, lse.p, q.p, k.p, v.p, B, S, S, 0, Hq, Hkv, d, 0, nullptr); }, 20);
  const double bwd_ms = time_ms(
      [&] {
        ws.reset();
        attention_bwd(dq.p, dk.p, dv.p, dout.p, o.p, lse.p, q.p, k.p, v.p, B, S, Hq, Hkv, d, 0, ws,
                      nullptr);
      },
      20);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_CUDA_OK(cudaGetLastError());
  const double fwd_flops = 4.0 * B * Hq * double(S) * double(S) * d / 2;  // causal half
  const double bwd_flops = 2.5 * fwd_flops;
  std::printf("attention B=%lld S=%lld Hq=%lld Hkv=%lld d=%lld causal:\n", (long long)B,
              (long long)S, (long long)Hq, (long long)Hkv, (long long)d);
  std::printf("  forward  %8.3f ms  %7.1f TFLOP/s\n", fwd_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12);
  std::printf("  backward %8.3f ms  %7.1f TFLOP/s\n", bwd_ms, bwd_flops / (bwd_ms * 1e-3) / 1e12);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  EXPECT_GT(fwd_ms, 0);
  EXPECT_GT(bwd_ms, 0);
}

// ---- the backward's general form ---------------------------------------------------------------

using Buf = std::vector<float>;

// One layout: B sequences of S queries at positions q_start..q_start+S-1 against Sk keys at
// 0..Sk-1.
struct BwdShape {
  int64_t B, S, Sk, q_start, Hq, Hkv, d, window;
  std::string name() const {
    return "B" + std::to_string(B) + " S" + std::to_string(S) + " Sk" + std::to_string(Sk) +
           " q_start" + std::to_string(q_start) + " Hq" + std::to_string(Hq) + " Hkv" +
           std::to_string(Hkv) + " d" + std::to_string(d) + " window" + std::to_string(window);
  }
  size_t nq() const { return size_t(B * S * Hq * d); }
  size_t nkv() const { return size_t(B * Sk * Hkv * d); }
  size_t nl() const { return size_t(B * Hq * S); }
  // Whether some query sees key j: j <= the last query position, and (window) j inside the window
  // of the first query.
  bool key_seen(int64_t j) const {
    return S > 0 && j <= q_start + S - 1 && (window <= 0 || j > q_start - window);
  }
};

struct Grads {
  Buf dq, dk, dv;
};

// The naive bf16 backward of op_cases.cpp's naive_attention (the bf16 rule's "naive"): scores q·kᵀ
// stored in bf16, scaled by 1/sqrt(d) in bf16, probabilities in bf16; dv = Pᵀ·dout, dP = dout·vᵀ in
// bf16, dS = P ⊙ (dP − Σ P⊙dP) in bf16 and scaled in bf16, dq = dS·k, dk = dSᵀ·q; outputs in bf16;
// math between the stores in double.
Grads naive_bf16_backward(const BwdShape& s, const Buf& q, const Buf& k, const Buf& v,
                          const Buf& dout) {
  auto rb = [](double x) { return double(op_test::round_bf16(float(x))); };
  const int64_t B = s.B, Sq = s.S, Sk = s.Sk, Hq = s.Hq, Hkv = s.Hkv, d = s.d;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> dq(s.nq(), 0.0), dk(s.nkv(), 0.0), dv(s.nkv(), 0.0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Hq; h++)
      for (int64_t t = 0; t < Sq; t++) {
        const int64_t g = h / (Hq / Hkv), pos = s.q_start + t, row = ((b * Sq + t) * Hq + h) * d;
        std::vector<int64_t> keys;
        std::vector<double> sc;
        for (int64_t j = 0; j <= pos; j++) {
          if (s.window > 0 && j <= pos - s.window) continue;
          const float* kr = k.data() + ((b * Sk + j) * Hkv + g) * d;
          double dot = 0;
          for (int64_t i = 0; i < d; i++) dot += double(q[size_t(row + i)]) * kr[i];
          sc.push_back(rb(rb(dot) * scale));
          keys.push_back(j);
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double z = 0;
        for (double x : sc) z += std::exp(x - mx);
        const size_t n = keys.size();
        std::vector<double> p(n), dp(n), ds(n);
        for (size_t m = 0; m < n; m++) p[m] = rb(std::exp(sc[m] - mx) / z);
        double D = 0;
        for (size_t m = 0; m < n; m++) {
          const float* vr = v.data() + ((b * Sk + keys[m]) * Hkv + g) * d;
          double acc = 0;
          for (int64_t i = 0; i < d; i++) acc += double(dout[size_t(row + i)]) * vr[i];
          dp[m] = rb(acc);
          D += p[m] * dp[m];
        }
        for (size_t m = 0; m < n; m++) ds[m] = rb(rb(p[m] * (dp[m] - D)) * scale);
        for (int64_t i = 0; i < d; i++) {
          double acc = 0;
          for (size_t m = 0; m < n; m++)
            acc += ds[m] * k[size_t(((b * Sk + keys[m]) * Hkv + g) * d + i)];
          dq[size_t(row + i)] = rb(acc);
        }
        for (size_t m = 0; m < n; m++) {
          const int64_t kr = ((b * Sk + keys[m]) * Hkv + g) * d;
          for (int64_t i = 0; i < d; i++) {
            dv[size_t(kr + i)] += p[m] * double(dout[size_t(row + i)]);
            dk[size_t(kr + i)] += ds[m] * double(q[size_t(row + i)]);
          }
        }
      }
  Grads r;
  r.dq.assign(dq.begin(), dq.end());
  r.dk.resize(dk.size());
  r.dv.resize(dv.size());
  for (size_t i = 0; i < dk.size(); i++) r.dk[i] = float(rb(dk[i])), r.dv[i] = float(rb(dv[i]));
  return r;
}

// The fp32 reference: cpu::attention, then cpu::attention_backward's general form on its o and lse.
Grads cpu_backward(const BwdShape& s, const Buf& q, const Buf& k, const Buf& v, const Buf& dout) {
  Buf o(s.nq()), lse(s.nl());
  cpu::attention(o.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.S, s.Sk, s.q_start,
                 s.Hq, s.Hkv, s.d, s.window);
  Grads g{Buf(s.nq()), Buf(s.nkv()), Buf(s.nkv())};
  cpu::attention_backward(g.dq.data(), g.dk.data(), g.dv.data(), dout.data(), o.data(), lse.data(),
                          q.data(), k.data(), v.data(), s.B, s.S, s.Sk, s.q_start, s.Hq, s.Hkv, s.d,
                          s.window);
  return g;
}

// Raw bf16 bits of the GPU gradients.
struct GpuGrads {
  std::vector<uint16_t> dq, dk, dv;
};

// Device copies of one case's inputs, the GPU forward's o and lse (attention_fwd's general form, as
// the model runs it), the gradient buffers and the backward's workspace.
struct GpuCase {
  BwdShape s;
  DeviceBuffer<bf16> q, k, v, dout, o, dq, dk, dv;
  DeviceBuffer<float> lse;
  DeviceBuffer<char> arena;
  GpuCase(const BwdShape& shape, const Buf& hq, const Buf& hk, const Buf& hv, const Buf& hdout)
      : s(shape),
        q(s.nq()),
        k(s.nkv()),
        v(s.nkv()),
        dout(s.nq()),
        o(s.nq()),
        dq(s.nq()),
        dk(s.nkv()),
        dv(s.nkv()),
        lse(s.nl()),
        arena(attention_bwd_workspace_bytes(s.B, s.S, s.Hq, s.Hkv, s.d)) {
    if (!ok()) return;
    test_util::upload_bf16(q.p, hq);
    test_util::upload_bf16(k.p, hk);
    test_util::upload_bf16(v.p, hv);
    test_util::upload_bf16(dout.p, hdout);
    attention_fwd(o.p, lse.p, q.p, k.p, v.p, s.B, s.S, s.Sk, s.q_start, s.Hq, s.Hkv, s.d, s.window,
                  nullptr);
  }
  bool ok() const {
    return q.p && k.p && v.p && dout.p && o.p && dq.p && dk.p && dv.p && lse.p && arena.p;
  }
  // One backward into gradient buffers pre-filled with the byte `fill` (0xFF: bf16 NaN, so that an
  // unwritten element fails the comparisons); self_form calls the self-attention overload (valid
  // only for q_start 0, Sk = S).
  cudaError_t backward(bool self_form, int fill, GpuGrads* out) {
    cudaError_t e = cudaSuccess;
    for (auto* b : {&dq, &dk, &dv})
      if (e == cudaSuccess) e = cudaMemset(b->p, fill, b->bytes());
    if (e != cudaSuccess) return e;
    Workspace ws{arena.p, arena.bytes(), 0};
    if (self_form)
      attention_bwd(dq.p, dk.p, dv.p, dout.p, o.p, lse.p, q.p, k.p, v.p, s.B, s.S, s.Hq, s.Hkv, s.d,
                    s.window, ws, nullptr);
    else
      attention_bwd(dq.p, dk.p, dv.p, dout.p, o.p, lse.p, q.p, k.p, v.p, s.B, s.S, s.Sk, s.q_start,
                    s.Hq, s.Hkv, s.d, s.window, ws, nullptr);
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return e;
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    out->dq = test_util::download(reinterpret_cast<const uint16_t*>(dq.p), s.nq());
    out->dk = test_util::download(reinterpret_cast<const uint16_t*>(dk.p), s.nkv());
    out->dv = test_util::download(reinterpret_cast<const uint16_t*>(dv.p), s.nkv());
    return cudaSuccess;
  }
};

struct Inputs {
  Buf q, k, v, dout;
};
// Normal values on the bf16 grid, q and k at 1.2 as the registry's attention cases.
Inputs random_inputs(const BwdShape& s, uint64_t seed) {
  Rng r(seed);
  Inputs in;
  in.q = op_test::randn_bf16(r, int64_t(s.nq()), 1.2f);
  in.k = op_test::randn_bf16(r, int64_t(s.nkv()), 1.2f);
  in.v = op_test::randn_bf16(r, int64_t(s.nkv()));
  in.dout = op_test::randn_bf16(r, int64_t(s.nq()));
  return in;
}

// The general backward of one layout against the CPU reference by the bf16 rule; dk/dv rows of the
// keys no query sees exactly 0; a second run bit-identical.
void check_general_backward(const BwdShape& s, uint64_t seed) {
  SCOPED_TRACE(s.name());
  const Inputs in = random_inputs(s, seed);
  GpuCase gc(s, in.q, in.k, in.v, in.dout);
  ASSERT_TRUE(gc.ok());
  GpuGrads got, again;
  ASSERT_CUDA_OK(gc.backward(false, 0xFF, &got));
  ASSERT_CUDA_OK(gc.backward(false, 0xFF, &again));
  const Grads ref = cpu_backward(s, in.q, in.k, in.v, in.dout);
  const Grads naive = naive_bf16_backward(s, in.q, in.k, in.v, in.dout);
  const Buf dq = test_util::bf16_bits_to_f32(got.dq), dk = test_util::bf16_bits_to_f32(got.dk),
            dv = test_util::bf16_bits_to_f32(got.dv);
  if (auto f = op_test::bf16_failure("dq", dq, ref.dq, naive.dq)) ADD_FAILURE() << *f;
  if (auto f = op_test::bf16_failure("dk", dk, ref.dk, naive.dk)) ADD_FAILURE() << *f;
  if (auto f = op_test::bf16_failure("dv", dv, ref.dv, naive.dv)) ADD_FAILURE() << *f;
  // Keys that no query sees: exactly zero (the pre-fill is NaN, so these rows were written).
  const int64_t row = s.Hkv * s.d;  // elements per key row of dk/dv
  int64_t unseen = 0, nonzero = 0;
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t j = 0; j < s.Sk; j++) {
      if (s.key_seen(j)) continue;
      unseen++;
      for (int64_t i = 0; i < row; i++) {
        const size_t at = size_t((b * s.Sk + j) * row + i);
        if (!(dk[at] == 0.0f && dv[at] == 0.0f)) nonzero++;
      }
    }
  EXPECT_EQ(nonzero, 0) << "dk/dv elements of the " << unseen << " unseen key rows not zero";
  EXPECT_TRUE(got.dq == again.dq && got.dk == again.dk && got.dv == again.dv)
      << "backward not bit-reproducible";
}

TEST(AttentionCuda, BackwardGeneralMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const BwdShape shapes[] = {
      // d 128: the self layout through the general call; q_start on a 64-row tile with Sk =
      // q_start + S; q_start off every tile; keys past the queries (Sk > q_start + S: partly and
      // wholly unseen 128-key tiles).
      {2, 96, 96, 0, 8, 2, 128, 0},
      {2, 128, 192, 64, 8, 2, 128, 0},
      {2, 200, 500, 300, 8, 2, 128, 0},
      {2, 96, 700, 300, 4, 2, 128, 0},
      // d 64
      {2, 96, 250, 0, 8, 2, 64, 0},
      {2, 200, 400, 64, 8, 2, 64, 0},
      {2, 128, 428, 300, 4, 2, 64, 0},
      // d 32, plain multi-head
      {2, 70, 150, 10, 2, 2, 32, 0},
  };
  uint64_t seed = 101;
  for (const BwdShape& s : shapes) check_general_backward(s, seed++);
}

TEST(AttentionCuda, BackwardGeneralWindowMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const BwdShape shapes[] = {
      // Keys 0..150 (the whole first 128-key tile) before every query's window and keys 500..599
      // after the queries are unseen.
      {2, 200, 600, 300, 8, 2, 128, 150},
      {2, 128, 192, 64, 4, 2, 64, 100},
      {2, 96, 396, 300, 8, 2, 64, 37},
  };
  uint64_t seed = 201;
  for (const BwdShape& s : shapes) check_general_backward(s, seed++);
}

// No queries (S = 0): nothing to launch but dk/dv, which are all zero.
TEST(AttentionCuda, BackwardGeneralNoQueries) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const BwdShape s{2, 0, 130, 64, 8, 2, 128, 0};
  GpuCase gc(s, {}, Buf(s.nkv(), 1.0f), Buf(s.nkv(), 1.0f), {});
  ASSERT_TRUE(gc.ok());
  GpuGrads got;
  ASSERT_CUDA_OK(gc.backward(false, 0xFF, &got));
  EXPECT_EQ(std::count(got.dk.begin(), got.dk.end(), uint16_t(0)), int64_t(s.nkv()));
  EXPECT_EQ(std::count(got.dv.begin(), got.dv.end(), uint16_t(0)), int64_t(s.nkv()));
}

// The general form at q_start 0, Sk = S is the self-attention backward bit for bit (the gradient
// buffers pre-filled differently, so that an element only one of them writes shows up).
TEST(AttentionCuda, BackwardGeneralSelfLayoutBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 301;
  for (int64_t d : {128, 64, 32})
    for (int64_t window : {0, 100}) {
      const BwdShape s{2, 200, 200, 0, 8, 2, d, window};
      SCOPED_TRACE(s.name());
      const Inputs in = random_inputs(s, seed++);
      GpuCase gc(s, in.q, in.k, in.v, in.dout);
      ASSERT_TRUE(gc.ok());
      GpuGrads self, general;
      ASSERT_CUDA_OK(gc.backward(true, 0xFF, &self));
      ASSERT_CUDA_OK(gc.backward(false, 0x00, &general));
      ASSERT_EQ(self.dq.size(), general.dq.size());
      EXPECT_EQ(std::memcmp(self.dq.data(), general.dq.data(), self.dq.size() * 2), 0) << "dq";
      EXPECT_EQ(std::memcmp(self.dk.data(), general.dk.data(), self.dk.size() * 2), 0) << "dk";
      EXPECT_EQ(std::memcmp(self.dv.data(), general.dv.data(), self.dv.size() * 2), 0) << "dv";
      // And finite everywhere (the 0xFF pre-fill of the self call is NaN).
      const Buf dq = test_util::bf16_bits_to_f32(self.dq);
      EXPECT_TRUE(std::all_of(dq.begin(), dq.end(), [](float x) { return std::isfinite(x); }));
    }
}

}  // namespace
}  // namespace zaya::cuda
