// Benchmark of the fused flash attention (backend/cuda/kernels/attention.cu). Its correctness
// against cpu::attention / cpu::attention_backward (head dims 32, 64, 128, sequence lengths that
// are not multiples of the tiles, GQA and plain multi-head, full causal and sliding window,
// decoding with q_start > 0, bit-reproducible backward) is the attention cases of the op-test
// registry (tests/backend/op_cases.cpp), run on the GPU by test_cuda_ops_registry.cpp.
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

#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
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

}  // namespace
}  // namespace zaya::cuda
