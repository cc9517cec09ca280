// GPU tests of the fused flash attention (backend/cuda/kernels/attention.cu) against the CPU reference
// cpu::attention / cpu::attention_backward on random bf16-representable inputs: head dims 32, 64,
// 128, sequence lengths that are not multiples of the 64-row tiles, GQA (Hq 8 / Hkv 2) and plain
// multi-head (4 / 4), full causal and sliding window, and decoding with q_start > 0 against a
// longer key cache (forward only, as in the model). Outputs are compared with the bf16 rule (max|Δ|
// <= 2e-2·max|ref|), lse (fp32) tighter; the backward must also be bit-reproducible. Skipped
// without a CUDA device.
//
// ZAYA_ATTN_BENCH=1 additionally enables AttentionCuda.Benchmark, which times forward and backward
// at the ZAYA1 shape (B 4, S 4096, Hq 8, Hkv 2, d 128, causal) and prints ms and TFLOP/s.
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

#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace zaya::cuda {
namespace {

using test_util::DeviceBuffer;
using test_util::download;
using test_util::have_gpu;
using test_util::max_abs;
using test_util::max_diff;
using test_util::upload;

// Random normal values rounded to bf16: `f` holds the exact fp32 value of each bf16 in `h`, so
// the CPU reference and the GPU see identical inputs.
void random_bf16(std::vector<float>& f, std::vector<uint16_t>& h, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  f.resize(n);
  h.resize(n);
  for (size_t i = 0; i < n; i++) {
    h[i] = zaya::f32_to_bf16(nd(rng));
    f[i] = zaya::bf16_to_f32(h[i]);
  }
}

struct Case {
  int64_t B, S, Sk, q_start, Hq, Hkv, d, window;
  bool backward;
  std::string name() const {
    return "B" + std::to_string(B) + " S" + std::to_string(S) + " Sk" + std::to_string(Sk) +
           " q_start" + std::to_string(q_start) + " Hq" + std::to_string(Hq) + " Hkv" +
           std::to_string(Hkv) + " d" + std::to_string(d) + " window" + std::to_string(window);
  }
};

void check_bf16(const char* what, const std::vector<uint16_t>& got_h, const std::vector<float>& ref,
                const Case& c) {
  const std::vector<float> got = test_util::bf16_bits_to_f32(got_h);
  bool bad = false;
  const float diff = max_diff(got, ref, &bad), scale = max_abs(ref);
  EXPECT_FALSE(bad) << what << " has non-finite values, " << c.name();
  EXPECT_LE(diff, 2e-2f * scale) << what << " max|ref| " << scale << ", " << c.name();
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name());
  std::mt19937 rng(uint32_t(1234 + c.S * 7 + c.d * 13 + c.window + c.Hq * 31 + c.q_start));
  const size_t nq = size_t(c.B * c.S * c.Hq * c.d), nkv = size_t(c.B * c.Sk * c.Hkv * c.d);
  const size_t nl = size_t(c.B * c.Hq * c.S);
  std::vector<float> qf, kf, vf, gof;
  std::vector<uint16_t> qh, kh, vh, goh;
  random_bf16(qf, qh, nq, rng);
  random_bf16(kf, kh, nkv, rng);
  random_bf16(vf, vh, nkv, rng);

  std::vector<float> o_ref(nq), lse_ref(nl);
  cpu::attention(o_ref.data(), lse_ref.data(), qf.data(), kf.data(), vf.data(), c.B, c.S, c.Sk,
                 c.q_start, c.Hq, c.Hkv, c.d, c.window);

  DeviceBuffer<bf16> q(nq), k(nkv), v(nkv), o(nq);
  DeviceBuffer<float> lse(nl);
  ASSERT_TRUE(q.p && k.p && v.p && o.p && lse.p);
  upload(reinterpret_cast<uint16_t*>(q.p), qh);
  upload(reinterpret_cast<uint16_t*>(k.p), kh);
  upload(reinterpret_cast<uint16_t*>(v.p), vh);
  attention_fwd(o.p, lse.p, q.p, k.p, v.p, c.B, c.S, c.Sk, c.q_start, c.Hq, c.Hkv, c.d, c.window,
                nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  const std::vector<uint16_t> oh = download(reinterpret_cast<const uint16_t*>(o.p), nq);
  const std::vector<float> lse_got = download(lse.p, nl);
  check_bf16("o", oh, o_ref, c);
  bool bad = false;
  const float lse_diff = max_diff(lse_got, lse_ref, &bad);
  EXPECT_FALSE(bad) << "lse has non-finite values";
  EXPECT_LE(lse_diff, 1e-3f * (1.f + max_abs(lse_ref))) << "lse";

  if (!c.backward) return;
  random_bf16(gof, goh, nq, rng);
  std::vector<float> dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  cpu::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), gof.data(), o_ref.data(),
                          lse_ref.data(), qf.data(), kf.data(), vf.data(), c.B, c.S, c.Hq, c.Hkv,
                          c.d, c.window);

  DeviceBuffer<bf16> dout(nq), dq(nq), dk(nkv), dv(nkv);
  const size_t ws_bytes = attention_bwd_workspace_bytes(c.B, c.S, c.Hq, c.Hkv, c.d);
  DeviceBuffer<char> arena(ws_bytes);
  ASSERT_TRUE(dout.p && dq.p && dk.p && dv.p && arena.p);
  upload(reinterpret_cast<uint16_t*>(dout.p), goh);
  Workspace ws{arena.p, ws_bytes, 0};

  // Backward on the GPU's own forward outputs (o bf16, lse fp32), as the model runs it.
  std::vector<uint16_t> dqh[2], dkh[2], dvh[2];
  for (int rep = 0; rep < 2; rep++) {
    ws.reset();
    attention_bwd(dq.p, dk.p, dv.p, dout.p, o.p, lse.p, q.p, k.p, v.p, c.B, c.S, c.Hq, c.Hkv, c.d,
                  c.window, ws, nullptr);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    dqh[rep] = download(reinterpret_cast<const uint16_t*>(dq.p), nq);
    dkh[rep] = download(reinterpret_cast<const uint16_t*>(dk.p), nkv);
    dvh[rep] = download(reinterpret_cast<const uint16_t*>(dv.p), nkv);
  }
  check_bf16("dq", dqh[0], dq_ref, c);
  check_bf16("dk", dkh[0], dk_ref, c);
  check_bf16("dv", dvh[0], dv_ref, c);
  EXPECT_TRUE(dqh[0] == dqh[1] && dkh[0] == dkh[1] && dvh[0] == dvh[1])
      << "backward is not bit-reproducible";
}

TEST(AttentionCuda, TrainingShapesMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t d : {32, 64, 128})
    for (int64_t S : {100, 257})
      for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}})
        for (int64_t window : {0, 64}) run_case({2, S, S, 0, Hq, Hkv, d, window, true});
}

TEST(AttentionCuda, ExactTileMultiplesAndLongWindow) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Tile-aligned S (no partial tiles), a window longer than several tiles, a single short
  // sequence, and a window of 2 (a window of 1 makes dq and dk exactly zero).
  run_case({1, 256, 256, 0, 8, 2, 128, 0, true});
  run_case({1, 384, 384, 0, 8, 2, 128, 150, true});
  run_case({2, 3, 3, 0, 4, 2, 64, 0, true});
  run_case({1, 130, 130, 0, 2, 1, 32, 2, true});
}

TEST(AttentionCuda, BackwardTileBoundaries) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // The dK/dV blocks own 128 keys and the dQ blocks 128 query rows (64-row steps and 64-key tiles
  // inside them): S just past one block (129), inside the second (200), past two with a partial
  // 64-row step (300), and several blocks with a window shorter than a block; GQA 4:1, 3:1, 1:1.
  for (int64_t d : {32, 64, 128}) {
    run_case({1, 129, 129, 0, 4, 1, d, 0, true});
    run_case({2, 200, 200, 0, 8, 2, d, 0, true});
    run_case({1, 300, 300, 0, 8, 2, d, 100, true});
    run_case({1, 200, 200, 0, 3, 3, d, 150, true});
  }
  run_case({1, 385, 385, 0, 6, 2, 128, 2, true});
  run_case({1, 513, 513, 0, 4, 1, 128, 0, true});
}

TEST(AttentionCuda, DecodeWithQueryOffsetMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t d : {32, 64, 128})
    for (int64_t S : {1, 5})
      for (int64_t window : {0, 64}) run_case({2, S, 300, 300 - S, 8, 2, d, window, false});
  // Queries in the middle of the cache (keys beyond the last query are never visible).
  run_case({1, 70, 400, 130, 8, 2, 128, 0, false});
}

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

}  // namespace
}  // namespace zaya::cuda
