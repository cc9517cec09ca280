// GPU tests of backend/cuda/kernels/norm.cu beyond the RMSNorm and residual cases of the op-test
// registry (tests/backend/op_cases.cpp) and test_cuda_pointwise.cpp: the fused rmsnorm_residual_bwd against the CPU reference composition
// (cpu::rmsnorm_backward, then cpu::residual_scale_backward on acc + dx) and bit for bit against
// the two separate calls it replaces in the model (rmsnorm_bwd_f32 accumulating into a buffer, then
// residual_scale_bwd from it; CudaModel relies on this for recompute on/off agreement), in place
// (dh = acc), the dw-only rmsnorm_bwd (dx null), pointers that are not 16-byte aligned, and rows
// wider than the register layout (the generic path). Every layout of norm.cu is reached: W = 4
// and W = 1 with V = 1, 2, 4, and the generic kernels. Label gpu; skipped without a CUDA device.
//
// ZAYA_NORM_BENCH=1 additionally enables CudaNorm.Benchmark: every norm kernel at the ZAYA1-base
// training shape (N 16384, D 2048; router norms at R 256), median ms over 30 runs, GB/s of the
// fewest bytes each op must move, the byte floor at 4.2 TB/s, and the norms' share of one training
// step of 8 layers (the call counts of CudaModel's no-recompute schedule).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace zaya::cuda {
namespace {

using test_util::download;
using test_util::download_bf16;
using test_util::expect_close;

class Dev : public test_util::DeviceArena {
 public:
  explicit Dev(size_t ws_bytes = size_t(64) << 20) {
    ws.base = alloc<char>(ws_bytes);
    ws.capacity = ws_bytes;
  }
  // A copy of v placed `off` elements past a 256-byte aligned start (off = 1: not 16-byte aligned).
  template <typename T>
  T* up_at(const std::vector<T>& v, size_t off) {
    T* p = alloc<T>(v.size() + off);
    if (p) test_util::upload(p + off, v);
    return p ? p + off : nullptr;
  }
  Workspace ws;
};

constexpr double kF32 = 2e-5;   // fp32 outputs, column sums over up to a few thousand tokens
constexpr double kBf16 = 2e-2;  // bf16 outputs

std::vector<uint16_t> bf16_bits(const bf16* p, size_t n) {
  return download(reinterpret_cast<const uint16_t*>(p), n);
}

// ---- fused norm + residual backward ----------------------------------------------------------
// off: element offset of x (1: not 16-byte aligned, so the scalar layout).
void fused_case(int64_t N, int64_t D, uint64_t seed, bool with_acc, size_t off = 0) {
  SCOPED_TRACE("N " + std::to_string(N) + " D " + std::to_string(D) +
               (with_acc ? " acc" : " no acc") + " off " + std::to_string(off));
  std::mt19937_64 g(seed);
  auto uni = [&](int64_t n, float lo, float hi, bool bf = false) {
    return test_util::random_uniform(g, size_t(n), lo, hi, bf);
  };
  const float eps = 1e-5f;
  const auto x = uni(N * D, -2, 2), w = uni(D, 0.5f, 1.5f), dy = uni(N * D, -1, 1);
  const auto acc = uni(N * D, -1, 1), a = uni(N * D, -1, 1, true), h = uni(N * D, -2, 2);
  const auto hs = uni(D, 0.5f, 1.5f), hb = uni(D, -0.1f, 0.1f), rs = uni(D, 0.5f, 1.5f),
             rb = uni(D, -0.1f, 0.1f);
  std::vector<std::vector<float>> p0(5);
  for (auto& p : p0) p = uni(D, -1, 1);
  std::vector<float> ytmp(size_t(N * D)), rstd(static_cast<size_t>(N));
  cpu::rmsnorm(ytmp.data(), rstd.data(), x.data(), w.data(), eps, N, D);

  // Reference: dx of the norm, g = acc + dx, then the residual backward from g.
  std::vector<float> dx_ref(size_t(N * D)), da_ref(size_t(N * D)), dh_ref(size_t(N * D));
  auto pr = p0;
  cpu::rmsnorm_backward(dx_ref.data(), pr[0].data(), dy.data(), x.data(), w.data(), rstd.data(), N,
                        D);
  std::vector<float> gref = dx_ref;
  if (with_acc)
    for (size_t i = 0; i < gref.size(); i++) gref[i] += acc[i];
  cpu::residual_scale_backward(da_ref.data(), dh_ref.data(), pr[1].data(), pr[2].data(),
                               pr[3].data(), pr[4].data(), gref.data(), a.data(), h.data(),
                               hs.data(), hb.data(), rs.data(), rb.data(), N, D);

  Dev dev;
  float *d_x = dev.up_at(x, off), *d_w = dev.up(w), *d_dy = dev.up(dy), *d_acc = dev.up(acc),
        *d_h = dev.up(h), *d_hs = dev.up(hs), *d_hb = dev.up(hb), *d_rs = dev.up(rs),
        *d_rb = dev.up(rb), *d_rstd = dev.up(rstd), *d_dh = dev.alloc<float>(size_t(N * D));
  bf16 *d_a = dev.up_bf16(a), *d_da = dev.alloc<bf16>(size_t(N * D));
  float* d_p[5];
  for (int k = 0; k < 5; k++) d_p[k] = dev.up(p0[size_t(k)]);
  ASSERT_LE(rmsnorm_residual_bwd_workspace_bytes(N, D), dev.ws.capacity);
  rmsnorm_residual_bwd(d_da, d_dh, d_p[0], d_p[1], d_p[2], d_p[3], d_p[4], d_dy, d_x, d_w, d_rstd,
                       with_acc ? d_acc : nullptr, d_a, d_h, d_hs, d_hb, d_rs, d_rb, N, D, dev.ws,
                       nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  expect_close("fused da", download_bf16(d_da, size_t(N * D)), da_ref, kBf16);
  expect_close("fused dh", download(d_dh, size_t(N * D)), dh_ref, 1e-5);
  const char* names[5] = {"fused dw", "fused dhs", "fused dhb", "fused drs", "fused drb"};
  std::vector<std::vector<float>> fused_p(5);
  for (int k = 0; k < 5; k++) {
    fused_p[size_t(k)] = download(d_p[k], size_t(D));
    expect_close(names[k], fused_p[size_t(k)], pr[size_t(k)], kF32);
  }
  const auto fused_da = bf16_bits(d_da, size_t(N * D));
  const auto fused_dh = download(d_dh, size_t(N * D));

  // The two calls the model makes without fusion: the same bits (when both select the layout the
  // fused call does; with a misaligned x only the norm's call falls back to scalar accesses).
  if (off != 0) return;
  float* d_buf = dev.up(acc);
  bf16* d_da2 = dev.alloc<bf16>(size_t(N * D));
  float* d_q[5];
  for (int k = 0; k < 5; k++) d_q[k] = dev.up(p0[size_t(k)]);
  dev.ws.reset();
  rmsnorm_bwd_f32(d_buf, d_q[0], d_dy, d_x, d_w, d_rstd, with_acc, N, D, dev.ws, nullptr);
  dev.ws.reset();
  residual_scale_bwd(d_da2, d_buf, d_q[1], d_q[2], d_q[3], d_q[4], d_buf, d_a, d_h, d_hs, d_hb,
                     d_rs, d_rb, N, D, dev.ws, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(bf16_bits(d_da2, size_t(N * D)), fused_da) << "da: fused vs separate calls";
  EXPECT_EQ(download(d_buf, size_t(N * D)), fused_dh) << "dh: fused vs separate calls";
  for (int k = 0; k < 5; k++)
    EXPECT_EQ(download(d_q[k], size_t(D)), fused_p[size_t(k)]) << names[k] << " vs separate calls";

  // In place (dh = acc) and repeated: the same bits again.
  if (with_acc) {
    float* d_io = dev.up(acc);
    for (int k = 0; k < 5; k++)
      ASSERT_CUDA_OK(test_util::to_device(d_q[k], p0[size_t(k)].data(), size_t(D) * 4));
    dev.ws.reset();
    rmsnorm_residual_bwd(d_da2, d_io, d_q[0], d_q[1], d_q[2], d_q[3], d_q[4], d_dy, d_x, d_w,
                         d_rstd, d_io, d_a, d_h, d_hs, d_hb, d_rs, d_rb, N, D, dev.ws, nullptr);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(bf16_bits(d_da2, size_t(N * D)), fused_da) << "da in place";
    EXPECT_EQ(download(d_io, size_t(N * D)), fused_dh) << "dh in place";
    for (int k = 0; k < 5; k++)
      EXPECT_EQ(download(d_q[k], size_t(D)), fused_p[size_t(k)]) << names[k] << " in place";
  }
}

TEST(CudaNorm, FusedResidualBackward) {
  SKIP_WITHOUT_GPU();
  fused_case(37, 64, 1, true);      // W 4, V 1, one row per chunk
  fused_case(5, 33, 2, false);      // W 1, V 1
  fused_case(300, 2048, 3, true);   // W 4, V 2 (the model's layout)
  fused_case(300, 2048, 4, false);  // without acc (the final norm)
  fused_case(2000, 2048, 5, true);  // several rows per chunk
  fused_case(123, 1001, 6, true);   // W 1, V 4: the two-pass fallback
  fused_case(40, 4096, 7, true);    // W 4, V 4: the two-pass fallback
  fused_case(20, 2051, 8, true);    // wider than the layout: generic kernels
  fused_case(64, 256, 9, true, 1);  // misaligned x: W 1, V 1
}

// ---- rmsnorm: dw only, misaligned and generic forward / backward
// ----------------------------------
void rmsnorm_extra_case(int64_t N, int64_t D, uint64_t seed, size_t off) {
  SCOPED_TRACE("N " + std::to_string(N) + " D " + std::to_string(D) + " off " +
               std::to_string(off));
  std::mt19937_64 g(seed);
  auto uni = [&](int64_t n, float lo, float hi, bool bf = false) {
    return test_util::random_uniform(g, size_t(n), lo, hi, bf);
  };
  const float eps = 1e-5f;
  const auto x = uni(N * D, -2, 2), w = uni(D, 0.5f, 1.5f), dy = uni(N * D, -1, 1, true);
  const auto dw0 = uni(D, -1, 1);
  std::vector<float> y_ref(size_t(N * D)), rstd_ref(static_cast<size_t>(N)), dx_ref(size_t(N * D));
  cpu::rmsnorm(y_ref.data(), rstd_ref.data(), x.data(), w.data(), eps, N, D);
  auto dw_ref = dw0;
  cpu::rmsnorm_backward(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(),
                        rstd_ref.data(), N, D);
  Dev dev;
  float *d_x = dev.up_at(x, off), *d_w = dev.up(w), *d_rstd = dev.alloc<float>(size_t(N));
  float *d_dy = dev.up(dy), *d_dw = dev.up(dw0), *d_dx = dev.alloc<float>(size_t(N * D));
  bf16* d_y = dev.alloc<bf16>(size_t(N * D));
  rmsnorm_fwd(d_y, d_rstd, d_x, d_w, eps, N, D, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  expect_close("y", download_bf16(d_y, size_t(N * D)), y_ref, kBf16);
  expect_close("rstd", download(d_rstd, size_t(N)), rstd_ref, 1e-5);
  // dw only (dx null), then dx with dw: dw sums are the same bits both times.
  rmsnorm_bwd_f32(nullptr, d_dw, d_dy, d_x, d_w, d_rstd, false, N, D, dev.ws, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const auto dw_only = download(d_dw, size_t(D));
  expect_close("dw (dx null)", dw_only, dw_ref, kF32);
  ASSERT_CUDA_OK(test_util::to_device(d_dw, dw0.data(), dw0.size() * 4));
  dev.ws.reset();
  rmsnorm_bwd_f32(d_dx, d_dw, d_dy, d_x, d_w, d_rstd, false, N, D, dev.ws, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  expect_close("dx", download(d_dx, size_t(N * D)), dx_ref, 1e-5);
  EXPECT_EQ(download(d_dw, size_t(D)), dw_only) << "dw with and without dx";

  // Residual + norm forward with misaligned h (in place), against the reference.
  const auto a = uni(N * D, -1, 1, true), hs = uni(D, 0.5f, 1.5f), hb = uni(D, -0.1f, 0.1f),
             rs = uni(D, 0.5f, 1.5f), rb = uni(D, -0.1f, 0.1f);
  std::vector<float> hout_ref(size_t(N * D));
  cpu::residual_scale(hout_ref.data(), a.data(), x.data(), hs.data(), hb.data(), rs.data(),
                      rb.data(), N, D);
  cpu::rmsnorm(y_ref.data(), rstd_ref.data(), hout_ref.data(), w.data(), eps, N, D);
  bf16* d_a = dev.up_bf16(a);
  float *d_hs = dev.up(hs), *d_hb = dev.up(hb), *d_rs = dev.up(rs), *d_rb = dev.up(rb);
  residual_scale_rmsnorm_fwd(d_x, d_y, d_rstd, d_a, d_x, d_hs, d_hb, d_rs, d_rb, d_w, eps, N, D,
                             nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  expect_close("residual h_out in place", download(d_x, size_t(N * D)), hout_ref, 1e-6);
  expect_close("residual y", download_bf16(d_y, size_t(N * D)), y_ref, kBf16);
  expect_close("residual rstd", download(d_rstd, size_t(N)), rstd_ref, 1e-5);
}

TEST(CudaNorm, RmsNormLayouts) {
  SKIP_WITHOUT_GPU();
  rmsnorm_extra_case(33, 256, 20, 0);   // W 4, V 1 (the router's width)
  rmsnorm_extra_case(33, 256, 21, 1);   // W 1, V 1
  rmsnorm_extra_case(17, 2048, 22, 0);  // W 4, V 2
  rmsnorm_extra_case(17, 2048, 23, 1);  // W 1, D > 1024: generic kernels
  rmsnorm_extra_case(9, 4096, 24, 0);   // W 4, V 4
  rmsnorm_extra_case(9, 700, 25, 1);    // W 1, V 4
  rmsnorm_extra_case(5, 9000, 26, 0);   // W 4, D > 4096: generic kernels
}

// ---- benchmark
// ------------------------------------------------------------------------------------
TEST(CudaNorm, Benchmark) {
  const char* env = std::getenv("ZAYA_NORM_BENCH");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set ZAYA_NORM_BENCH=1 to run";
  SKIP_WITHOUT_GPU();
  const int64_t N = 16384, D = 2048, R = 256;
  const size_t ND = size_t(N * D), NR = size_t(N * R), Nn = size_t(N);
  const float eps = 1e-5f;
  test_util::DeviceBuffer<float> x(ND), h(ND), hout(ND), dy(ND), acc(ND), dh(ND),
      par(10 * size_t(D));
  test_util::DeviceBuffer<float> rstd(Nn), xr(NR), yr(NR), dyr(NR), dxr(NR), rstd_r(Nn);
  test_util::DeviceBuffer<bf16> a(ND), y(ND), da(ND);
  size_t ws_bytes =
      std::max({rmsnorm_residual_bwd_workspace_bytes(N, D), rmsnorm_bwd_workspace_bytes(N, D),
                rmsnorm_bwd_workspace_bytes(N, R), residual_scale_bwd_workspace_bytes(N, D)});
  test_util::DeviceBuffer<char> arena(ws_bytes);
  ASSERT_TRUE(x.p && h.p && hout.p && dy.p && acc.p && dh.p && par.p && rstd.p && xr.p && yr.p &&
              dyr.p && dxr.p && rstd_r.p && a.p && y.p && da.p && arena.p);
  {
    // Cheap uniform values in [-1, 1); parameters in [0.5, 1.5).
    uint64_t s = 0x9E3779B97F4A7C15ull;
    auto next = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return float(int32_t(s >> 32)) * (1.0f / 2147483648.0f);
    };
    std::vector<float> v(ND);
    for (float* p : {x.p, h.p, dy.p, acc.p}) {
      for (auto& e : v) e = next();
      ASSERT_CUDA_OK(test_util::to_device(p, v.data(), ND * 4));
    }
    for (auto& e : v) e = next();
    ASSERT_CUDA_OK(test_util::to_device(a.p, test_util::f32_to_bf16_bits(v).data(), ND * 2));
    std::vector<float> pv(10 * size_t(D));
    for (auto& e : pv) e = 1.0f + 0.5f * next();
    ASSERT_CUDA_OK(test_util::to_device(par.p, pv.data(), pv.size() * 4));
    v.resize(NR);
    for (float* p : {xr.p, dyr.p}) {
      for (auto& e : v) e = next();
      ASSERT_CUDA_OK(test_util::to_device(p, v.data(), NR * 4));
    }
  }
  float *w = par.p, *hs = par.p + D, *hb = par.p + 2 * D, *rs = par.p + 3 * D, *rb = par.p + 4 * D;
  // Gradient sums land in g[0..4] (their values do not matter here).
  float* g[5] = {par.p + 5 * D, par.p + 6 * D, par.p + 7 * D, par.p + 8 * D, par.p + 9 * D};
  rmsnorm_fwd(y.p, rstd.p, x.p, w, eps, N, D, nullptr);
  rmsnorm_fwd_f32(yr.p, rstd_r.p, xr.p, w, eps, N, R, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  Workspace ws{arena.p, ws_bytes, 0};

  cudaEvent_t e0, e1;
  ASSERT_CUDA_OK(cudaEventCreate(&e0));
  ASSERT_CUDA_OK(cudaEventCreate(&e1));
  auto median_ms = [&](const std::function<void()>& fn) {
    for (int i = 0; i < 3; i++) fn();
    std::vector<float> t;
    for (int i = 0; i < 30; i++) {
      cudaEventRecord(e0);
      fn();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return double(t[t.size() / 2]);
  };
  struct Op {
    const char* name;
    double bytes;  // fewest bytes the op must move (parameter vectors left out)
    int per_step;  // calls per step of CudaModel (8 layers, recompute off)
    std::function<void()> fn;
  };
  const double nd = double(ND), nr = double(NR), n4 = 4.0 * double(N);
  const std::vector<Op> ops = {
      {"rmsnorm_fwd bf16 (D)", 6 * nd + n4, 1,
       [&] { rmsnorm_fwd(y.p, rstd.p, x.p, w, eps, N, D, nullptr); }},
      {"residual_scale_rmsnorm_fwd", 12 * nd + n4, 16,
       [&] {
         residual_scale_rmsnorm_fwd(hout.p, y.p, rstd.p, a.p, h.p, hs, hb, rs, rb, w, eps, N, D,
                                    nullptr);
       }},
      {"rmsnorm_fwd_f32 (R)", 8 * nr + n4, 8,
       [&] { rmsnorm_fwd_f32(yr.p, rstd_r.p, xr.p, w, eps, N, R, nullptr); }},
      {"rmsnorm_residual_bwd, no acc", 20 * nd + n4, 1,
       [&] {
         ws.reset();
         rmsnorm_residual_bwd(da.p, dh.p, g[0], g[1], g[2], g[3], g[4], dy.p, x.p, w, rstd.p,
                              nullptr, a.p, h.p, hs, hb, rs, rb, N, D, ws, nullptr);
       }},
      {"rmsnorm_residual_bwd, acc", 24 * nd + n4, 15,
       [&] {
         ws.reset();
         rmsnorm_residual_bwd(da.p, dh.p, g[0], g[1], g[2], g[3], g[4], dy.p, x.p, w, rstd.p, acc.p,
                              a.p, h.p, hs, hb, rs, rb, N, D, ws, nullptr);
       }},
      {"rmsnorm_bwd_f32 (D), accumulate", 16 * nd + n4, 1,
       [&] {
         ws.reset();
         rmsnorm_bwd_f32(acc.p, g[0], dy.p, x.p, w, rstd.p, true, N, D, ws, nullptr);
       }},
      {"rmsnorm_bwd_f32 (D), =", 12 * nd + n4, 0,
       [&] {
         ws.reset();
         rmsnorm_bwd_f32(dh.p, g[0], dy.p, x.p, w, rstd.p, false, N, D, ws, nullptr);
       }},
      {"rmsnorm_bwd bf16 dy (D), =", 10 * nd + n4, 0,
       [&] {
         ws.reset();
         rmsnorm_bwd(dh.p, g[0], a.p, x.p, w, rstd.p, false, N, D, ws, nullptr);
       }},
      {"residual_scale_bwd", 16 * nd, 0,
       [&] {
         ws.reset();
         residual_scale_bwd(da.p, dh.p, g[1], g[2], g[3], g[4], acc.p, a.p, h.p, hs, hb, rs, rb, N,
                            D, ws, nullptr);
       }},
      {"rmsnorm_bwd_f32 (R), =", 12 * nr + n4, 8,
       [&] {
         ws.reset();
         rmsnorm_bwd_f32(dxr.p, g[0], dyr.p, xr.p, w, rstd_r.p, false, N, R, ws, nullptr);
       }},
      {"rmsnorm_bwd_f32 (R), dw only", 8 * nr + n4, 0,
       [&] {
         ws.reset();
         rmsnorm_bwd_f32(nullptr, g[0], dyr.p, xr.p, w, rstd_r.p, false, N, R, ws, nullptr);
       }},
  };
  const double kFloorBw = 4.2e12;  // bytes/s (DESIGN.md §Performance method)
  double step_ms = 0, step_floor = 0;
  std::printf("norm kernels, N %lld, D %lld, R %lld (median of 30)\n", (long long)N, (long long)D,
              (long long)R);
  std::printf("%-34s %9s %9s %9s %7s %6s\n", "op", "ms", "GB/s", "floor ms", "floor%", "calls");
  for (const Op& op : ops) {
    const double ms = median_ms(op.fn);
    ASSERT_CUDA_OK(cudaGetLastError());
    const double floor_ms = op.bytes / kFloorBw * 1e3;
    std::printf("%-34s %9.4f %9.1f %9.4f %6.1f%% %6d\n", op.name, ms, op.bytes / (ms * 1e-3) / 1e9,
                floor_ms, 100.0 * floor_ms / ms, op.per_step);
    step_ms += op.per_step * ms;
    step_floor += op.per_step * floor_ms;
  }
  std::printf(
      "norms per training step (8 layers, recompute off): %.3f ms, floor %.3f ms (%.1f%%)\n",
      step_ms, step_floor, 100.0 * step_floor / step_ms);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace zaya::cuda
