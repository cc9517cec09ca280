// GPU tests of the CUDA backend's GEMM layer (backend/cuda/gemm/gemm.h: GemmContext::gemm,
// grouped_gemm, grouped_wgrad), of Workspace::take and of the elementwise conversions in
// backend/cuda/ops.h. Every GEMM result is compared with a double-precision host reference computed
// from the same (bf16-rounded where the operand is bf16) inputs. Tolerances: bf16 outputs within
// 1e-2·max|ref| (a few bf16 ulps), fp32 outputs of bf16 operands within 5e-5·max|ref|, and fp32
// GEMMs within 1e-5·max|ref| — tight enough that TF32 (about 4e-4·max|ref| at these sizes) fails.
// Tests that need a device skip without one; the Workspace and size_bucket tests are host-only.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/ops.h"
#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "gpu_test_util.h"

namespace zaya::cuda {
namespace {

using test_util::have_gpu;

// One device allocation of raw bytes, freed on scope exit.
using DeviceMem = test_util::DeviceBuffer<std::byte>;

size_t elem_bytes(GemmType t) {
  return t == GemmType::BF16 ? 2 : 4;
}

// Values as the device sees them: bf16-rounded when the storage type is bf16.
std::vector<float> random_values(size_t n, std::mt19937_64& rng, GemmType t, float lo = -1.f,
                                 float hi = 1.f) {
  return test_util::random_uniform(rng, n, lo, hi, t == GemmType::BF16);
}

// Host floats to a device buffer of the given storage type (bf16 rounding is exact for values
// produced by random_values), through `st`: the GEMMs run on a non-blocking stream.
void upload(const DeviceMem& d, const std::vector<float>& h, GemmType t, cudaStream_t st) {
  ASSERT_GE(d.bytes(), h.size() * elem_bytes(t));
  if (t == GemmType::F32) {
    ZAYA_CUDA_CHECK(test_util::to_device(d.p, h.data(), h.size() * 4, st));
  } else {
    const std::vector<uint16_t> b = test_util::f32_to_bf16_bits(h);
    ZAYA_CUDA_CHECK(test_util::to_device(d.p, b.data(), b.size() * 2, st));
  }
}

std::vector<float> download(const DeviceMem& d, size_t n, GemmType t, cudaStream_t st) {
  std::vector<float> h(n);
  if (t == GemmType::F32) {
    ZAYA_CUDA_CHECK(test_util::to_host(h.data(), d.p, n * 4, st));
  } else {
    std::vector<uint16_t> b(n);
    ZAYA_CUDA_CHECK(test_util::to_host(b.data(), d.p, n * 2, st));
    h = test_util::bf16_bits_to_f32(b);
  }
  return h;
}

// C[m,n] = alpha · Σ_k op(A)[m,k]·op(B)[k,n] + beta · C[m,n] + bias[n], in double, in place.
void reference_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                    const std::vector<float>& A, int64_t lda, const std::vector<float>& B,
                    int64_t ldb, double beta, std::vector<double>& C, int64_t ldc,
                    const std::vector<float>* bias) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[size_t(k * lda + m)] : A[size_t(m * lda + k)];
        const double b = tb ? B[size_t(n * ldb + k)] : B[size_t(k * ldb + n)];
        s += a * b;
      }
      double& c = C[size_t(m * ldc + n)];
      c = alpha * s + (beta == 0 ? 0.0 : beta * c) + (bias ? double((*bias)[size_t(n)]) : 0.0);
    }
}

double tolerance(GemmType ab, GemmType c) {
  if (c == GemmType::BF16) return 1e-2;
  return ab == GemmType::BF16 ? 5e-5 : 1e-5;
}

// Largest |got - ref| and |ref| over the M×N block of row stride ld.
struct Deviation {
  double max_err = 0, max_ref = 0;
};
Deviation compare(const std::vector<float>& got, const std::vector<double>& ref, int64_t M,
                  int64_t N, int64_t ld) {
  Deviation d;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * ld + n);
      const double e = std::isfinite(got[i]) ? std::abs(double(got[i]) - ref[i])
                                             : std::numeric_limits<double>::infinity();
      d.max_err = std::max(d.max_err, e);
      d.max_ref = std::max(d.max_ref, std::abs(ref[i]));
    }
  return d;
}

struct GemmCase {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0, pad = 0;  // pad: extra elements per row of A, B and C
  GemmType ab = GemmType::BF16, c = GemmType::BF16;
  bool bias = false;
  float alpha = 1.f, beta = 0.f;
  int calls = 1;  // repeated calls (beta != 0 accumulates)
};

std::string describe(const GemmCase& g) {
  return "ta=" + std::to_string(g.ta) + " tb=" + std::to_string(g.tb) +
         " M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) + " K=" + std::to_string(g.K) +
         " pad=" + std::to_string(g.pad) + " ab=" + (g.ab == GemmType::BF16 ? "bf16" : "fp32") +
         " c=" + (g.c == GemmType::BF16 ? "bf16" : "fp32") + " bias=" + std::to_string(g.bias) +
         " alpha=" + std::to_string(g.alpha) + " beta=" + std::to_string(g.beta) +
         " calls=" + std::to_string(g.calls);
}

// Runs one case on the device and checks it against the reference; also checks that the padding
// columns of C are untouched. Returns the device result (for determinism checks).
std::vector<float> check_gemm(GemmContext& ctx, const GemmCase& g, cudaStream_t st, uint64_t seed) {
  SCOPED_TRACE(describe(g));
  std::mt19937_64 rng(seed);
  const int64_t lda = (g.ta ? g.M : g.K) + g.pad, ldb = (g.tb ? g.K : g.N) + g.pad,
                ldc = g.N + g.pad;
  const int64_t rows_a = g.ta ? g.K : g.M, rows_b = g.tb ? g.N : g.K;
  const std::vector<float> A = random_values(size_t(rows_a * lda), rng, g.ab);
  const std::vector<float> B = random_values(size_t(rows_b * ldb), rng, g.ab);
  const std::vector<float> bias = random_values(size_t(g.N), rng, GemmType::F32);
  // With beta = 0 C starts as NaN: the GEMM must not read it (BLAS semantics), since callers
  // hand it uninitialised buffers. Padding columns hold a sentinel that must survive.
  std::vector<float> C0 =
      g.beta != 0 ? random_values(size_t(g.M * ldc), rng, g.c)
                  : std::vector<float>(size_t(g.M * ldc), std::numeric_limits<float>::quiet_NaN());
  const float sentinel = 12.5f;
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t n = g.N; n < ldc; ++n) C0[size_t(m * ldc + n)] = sentinel;

  DeviceMem dA(A.size() * elem_bytes(g.ab)), dB(B.size() * elem_bytes(g.ab)),
      dC(C0.size() * elem_bytes(g.c)), dbias(bias.size() * 4);
  upload(dA, A, g.ab, st);
  upload(dB, B, g.ab, st);
  upload(dC, C0, g.c, st);
  upload(dbias, bias, GemmType::F32, st);
  for (int r = 0; r < g.calls; ++r)
    ctx.gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, dA.p, lda, dB.p, ldb, g.beta, dC.p, ldc, g.ab, g.c,
             g.bias ? dbias.as<float>() : nullptr, st);
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  const std::vector<float> got = download(dC, C0.size(), g.c, st);

  std::vector<double> ref(C0.begin(), C0.end());
  for (int r = 0; r < g.calls; ++r)
    reference_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, A, lda, B, ldb, g.beta, ref, ldc,
                   g.bias ? &bias : nullptr);
  const Deviation d = compare(got, ref, g.M, g.N, ldc);
  EXPECT_GT(d.max_ref, 0.0);
  EXPECT_LE(d.max_err, tolerance(g.ab, g.c) * d.max_ref)
      << "max |err| " << d.max_err << " max |ref| " << d.max_ref;
  int64_t touched = 0;
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t n = g.N; n < ldc; ++n) touched += got[size_t(m * ldc + n)] != sentinel;
  EXPECT_EQ(touched, 0) << "padding columns of C were written";
  return got;
}

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    ZAYA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (st) cudaStreamDestroy(st);
  }
  cudaStream_t st = nullptr;
};

TEST_F(CudaGemm, Bf16AllTransposesBothOutputs) {
  GemmContext ctx;
  uint64_t seed = 1;
  for (const auto [M, N, K, pad] :
       {std::array<int64_t, 4>{64, 48, 96, 0}, {40, 24, 56, 8}, {128, 256, 192, 16}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (GemmType c : {GemmType::BF16, GemmType::F32}) {
          GemmCase g;
          g.ta = ta;
          g.tb = tb;
          g.M = M;
          g.N = N;
          g.K = K;
          g.pad = pad;
          g.c = c;
          check_gemm(ctx, g, st, seed++);
        }
}

TEST_F(CudaGemm, Fp32OddSizesAllTransposesNoTf32) {
  GemmContext ctx;
  uint64_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t pad : {0, 3}) {
        GemmCase g;
        g.ta = ta;
        g.tb = tb;
        g.M = 37;
        g.N = 50;
        g.K = 72;
        g.pad = pad;
        g.ab = g.c = GemmType::F32;
        g.alpha = 0.75f;
        check_gemm(ctx, g, st, seed++);
      }
}

// Every transpose pair with every (input, output) type pair the backend uses: GemmCases with
// ta, tb, ab and c set.
std::vector<GemmCase> transposes_by_types() {
  std::vector<GemmCase> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [ab, c] : {std::pair{GemmType::BF16, GemmType::BF16},
                           {GemmType::BF16, GemmType::F32},
                           {GemmType::F32, GemmType::F32}}) {
        GemmCase g;
        g.ta = ta;
        g.tb = tb;
        g.ab = ab;
        g.c = c;
        out.push_back(g);
      }
  return out;
}

TEST_F(CudaGemm, BiasEpilogue) {
  GemmContext ctx;
  uint64_t seed = 200;
  for (GemmCase g : transposes_by_types()) {
    const bool odd = g.ab == GemmType::F32;
    g.M = odd ? 37 : 48;
    g.N = odd ? 50 : 64;
    g.K = odd ? 72 : 80;
    g.bias = true;
    g.alpha = 1.5f;
    check_gemm(ctx, g, st, seed++);
  }
}

// beta = 1 accumulation over repeated calls: also checks that the first call's autotune (which runs
// every candidate several times) did not modify C.
TEST_F(CudaGemm, BetaOneAccumulates) {
  GemmContext ctx;
  uint64_t seed = 300;
  for (GemmCase g : transposes_by_types()) {
    const bool odd = g.ab == GemmType::F32;
    g.M = odd ? 37 : 56;
    g.N = odd ? 50 : 40;
    g.K = odd ? 72 : 64;
    g.pad = odd ? 1 : 8;
    g.alpha = 0.5f;
    g.beta = 1.f;
    g.calls = 3;
    check_gemm(ctx, g, st, seed++);
  }
}

// The same key runs the same algorithm: repeated calls give bit-identical results, also with the
// autotune switched off (the heuristic's first choice).
TEST_F(CudaGemm, DeterministicWithAndWithoutAutotune) {
  GemmCase g;
  g.tb = true;
  g.M = 256;
  g.N = 384;
  g.K = 512;
  g.c = GemmType::F32;
  ASSERT_EQ(setenv("ZAYA_GEMM_AUTOTUNE", "1", 1), 0);  // timing is opt-in
  GemmContext tuned;
  ASSERT_EQ(unsetenv("ZAYA_GEMM_AUTOTUNE"), 0);
  const auto r1 = check_gemm(tuned, g, st, 7);
  const auto r2 = check_gemm(tuned, g, st, 7);
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)), 0);

  GemmContext heuristic;  // the default: the heuristic's first choice
  const auto h1 = check_gemm(heuristic, g, st, 7);
  const auto h2 = check_gemm(heuristic, g, st, 7);
  EXPECT_EQ(std::memcmp(h1.data(), h2.data(), h1.size() * sizeof(float)), 0);
}

// Expert forward/dgrad: groups of rows (some empty) against per-group reference GEMMs, twice with
// different row counts (the second reuses the first's tuned algorithms for new shapes).
TEST_F(CudaGemm, GroupedGemmWithEmptyGroups) {
  GemmContext ctx;
  const int64_t G = 5, N = 32, K = 40, lda = K + 8, ldc = N + 8;
  uint64_t seed = 400;
  for (const std::vector<int32_t>& rows :
       {std::vector<int32_t>{16, 0, 24, 0, 8}, std::vector<int32_t>{8, 40, 0, 16, 0}})
    for (bool tb : {false, true})
      for (GemmType c : {GemmType::BF16, GemmType::F32}) {
        SCOPED_TRACE("trans_b=" + std::to_string(tb) +
                     " c=" + (c == GemmType::BF16 ? "bf16" : "fp32") +
                     " rows[1]=" + std::to_string(rows[1]));
        std::mt19937_64 rng(seed++);
        int64_t total = 0;
        for (int32_t r : rows) total += r;
        const int64_t ldb = tb ? K : N, b_stride = (tb ? N : K) * ldb + 64;
        const int64_t extra = 4;  // rows of C past the routed ones: must stay untouched
        const auto A = random_values(size_t(total * lda), rng, GemmType::BF16);
        const auto B = random_values(size_t(G * b_stride), rng, GemmType::BF16);
        const float sentinel = -3.25f;
        const std::vector<float> C0(size_t((total + extra) * ldc), sentinel);
        DeviceMem dA(A.size() * 2), dB(B.size() * 2), dC(C0.size() * elem_bytes(c));
        upload(dA, A, GemmType::BF16, st);
        upload(dB, B, GemmType::BF16, st);
        upload(dC, C0, c, st);
        const float alpha = 1.25f;
        ctx.grouped_gemm(tb, rows.data(), G, N, K, alpha, dA.p, lda, dB.p, ldb, b_stride, 0.f, dC.p,
                         ldc, c, st);
        ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
        const auto got = download(dC, C0.size(), c, st);

        std::vector<double> ref(C0.begin(), C0.end());
        int64_t off = 0;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = rows[size_t(g)];
          if (r == 0) continue;
          const std::vector<float> Ag(A.begin() + off * lda, A.begin() + (off + r) * lda);
          const std::vector<float> Bg(B.begin() + g * b_stride, B.begin() + (g + 1) * b_stride);
          std::vector<double> Cg(ref.begin() + off * ldc, ref.begin() + (off + r) * ldc);
          reference_gemm(false, tb, r, N, K, alpha, Ag, lda, Bg, ldb, 0.0, Cg, ldc, nullptr);
          std::copy(Cg.begin(), Cg.end(), ref.begin() + off * ldc);
          off += r;
        }
        const Deviation d = compare(got, ref, total, N, ldc);
        EXPECT_LE(d.max_err, tolerance(GemmType::BF16, c) * d.max_ref)
            << "max |err| " << d.max_err << " max |ref| " << d.max_ref;
        int64_t touched = 0;
        for (int64_t m = 0; m < total + extra; ++m)
          for (int64_t n = (m < total ? N : 0); n < ldc; ++n)
            touched += got[size_t(m * ldc + n)] != sentinel;
        EXPECT_EQ(touched, 0) << "C written outside the routed rows' N columns";
      }
}

// Expert weight gradients: dW_g = alpha · dY_g^T X_g (+ beta dW_g); empty groups stay untouched
// (beta = 1) or become zero (beta = 0).
TEST_F(CudaGemm, GroupedWgrad) {
  GemmContext ctx;
  const std::vector<int32_t> rows{16, 0, 24, 8};
  const int64_t G = 4, M_out = 32, K = 40, ld_dy = M_out + 8, ld_x = K, w_stride = M_out * K;
  int64_t total = 0;
  for (int32_t r : rows) total += r;
  uint64_t seed = 500;
  for (auto [c, beta] : {std::pair{GemmType::F32, 1.f},
                         {GemmType::F32, 0.f},
                         {GemmType::BF16, 0.f},
                         {GemmType::BF16, 1.f}}) {
    SCOPED_TRACE(std::string("c=") + (c == GemmType::BF16 ? "bf16" : "fp32") +
                 " beta=" + std::to_string(beta));
    std::mt19937_64 rng(seed++);
    const auto dY = random_values(size_t(total * ld_dy), rng, GemmType::BF16);
    const auto X = random_values(size_t(total * ld_x), rng, GemmType::BF16);
    std::vector<float> W0 = beta != 0 ? random_values(size_t(G * w_stride), rng, c)
                                      : std::vector<float>(size_t(G * w_stride), 7.f);
    DeviceMem ddY(dY.size() * 2), dX(X.size() * 2), dW(W0.size() * elem_bytes(c));
    upload(ddY, dY, GemmType::BF16, st);
    upload(dX, X, GemmType::BF16, st);
    upload(dW, W0, c, st);
    const float alpha = 0.5f;
    ctx.grouped_wgrad(rows.data(), G, M_out, K, alpha, ddY.p, ld_dy, dX.p, ld_x, beta, dW.p,
                      w_stride, c, st);
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
    const auto got = download(dW, W0.size(), c, st);

    int64_t off = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = rows[size_t(g)];
      std::vector<double> ref(W0.begin() + g * w_stride, W0.begin() + (g + 1) * w_stride);
      const std::vector<float> got_g(got.begin() + g * w_stride, got.begin() + (g + 1) * w_stride);
      if (r == 0) {
        for (size_t i = 0; i < ref.size(); ++i)
          EXPECT_EQ(got_g[i], beta == 0 ? 0.f : W0[size_t(g * w_stride) + i]) << "group " << g;
        continue;
      }
      const std::vector<float> dYg(dY.begin() + off * ld_dy, dY.begin() + (off + r) * ld_dy);
      const std::vector<float> Xg(X.begin() + off * ld_x, X.begin() + (off + r) * ld_x);
      reference_gemm(true, false, M_out, K, r, alpha, dYg, ld_dy, Xg, ld_x, beta, ref, K, nullptr);
      const Deviation d = compare(got_g, ref, M_out, K, K);
      EXPECT_LE(d.max_err, tolerance(GemmType::BF16, c) * d.max_ref)
          << "group " << g << " max |err| " << d.max_err << " max |ref| " << d.max_ref;
      off += r;
    }
  }
}

// Sets ZAYA_GEMM_AUTOTUNE for the contexts built in its scope (the variable is read by the
// constructor) and restores the caller's value afterwards.
class AutotuneEnv {
 public:
  explicit AutotuneEnv(bool on) {
    if (const char* v = std::getenv("ZAYA_GEMM_AUTOTUNE")) saved_ = v, had_ = true;
    if (on)
      EXPECT_EQ(setenv("ZAYA_GEMM_AUTOTUNE", "1", 1), 0);
    else
      EXPECT_EQ(unsetenv("ZAYA_GEMM_AUTOTUNE"), 0);
  }
  ~AutotuneEnv() {
    if (had_)
      setenv("ZAYA_GEMM_AUTOTUNE", saved_.c_str(), 1);
    else
      unsetenv("ZAYA_GEMM_AUTOTUNE");
  }
  AutotuneEnv(const AutotuneEnv&) = delete;
  AutotuneEnv& operator=(const AutotuneEnv&) = delete;

 private:
  std::string saved_;
  bool had_ = false;
};

// A context with the autotune on or off, whatever the caller's environment says.
std::unique_ptr<GemmContext> make_context(bool autotune) {
  AutotuneEnv env(autotune);
  return std::make_unique<GemmContext>();
}

// ZAYA_GEMM_SEARCH_ALGOS (with the autotune): the wider candidate set still gives the reference's
// result, and a context keeps one algorithm per key (bit-identical repeats); a malformed count is
// refused, naming the variable.
TEST_F(CudaGemm, WiderAutotuneSearchStaysCorrect) {
  AutotuneEnv env(true);
  ASSERT_EQ(setenv("ZAYA_GEMM_SEARCH_ALGOS", "4", 1), 0);
  GemmContext wide;
  GemmCase g;
  g.tb = true;
  g.M = 512;
  g.N = 768;
  g.K = 1024;
  const auto r1 = check_gemm(wide, g, st, 11);
  const auto r2 = check_gemm(wide, g, st, 11);
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)), 0);
  ASSERT_EQ(setenv("ZAYA_GEMM_SEARCH_ALGOS", "4x", 1), 0);
  try {
    GemmContext bad;
    ADD_FAILURE() << "ZAYA_GEMM_SEARCH_ALGOS=4x accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZAYA_GEMM_SEARCH_ALGOS"), std::string::npos) << e.what();
  }
  ASSERT_EQ(unsetenv("ZAYA_GEMM_SEARCH_ALGOS"), 0);
}

// Row-count vectors for the bucketed grouped GEMMs: empty groups, 1, sizes on both sides of the
// bucket edges (128, 1024, 1152, 2048, 2304, 4096) and large groups.
const std::vector<std::vector<int32_t>>& bucket_row_vectors() {
  static const std::vector<std::vector<int32_t>> v{
      {0, 0, 0, 0, 0, 0},
      {1, 0, 2, 127, 128, 129},
      {255, 256, 257, 1, 0, 1023},
      {1024, 1025, 1152, 1153, 0, 3},
      {2047, 2048, 2049, 2304, 2305, 17},
      {4096, 4097, 5000, 0, 1, 640},
      {1, 0, 2, 127, 128, 129}};  // the second again, after its buckets saw other sizes
  return v;
}

std::string rows_text(const std::vector<int32_t>& rows) {
  std::string s = "rows={";
  for (int32_t r : rows) s += std::to_string(r) + ",";
  return s + "}";
}

// Host-only: the bucket function (no device needed).
TEST(CudaGemmBuckets, SizeBucketIsATightMonotoneCover) {
  EXPECT_EQ(GemmContext::size_bucket(1), 128);
  EXPECT_EQ(GemmContext::size_bucket(128), 128);
  EXPECT_EQ(GemmContext::size_bucket(129), 256);
  EXPECT_EQ(GemmContext::size_bucket(1024), 1024);
  EXPECT_EQ(GemmContext::size_bucket(1025), 1152);
  EXPECT_EQ(GemmContext::size_bucket(2048), 2048);
  EXPECT_EQ(GemmContext::size_bucket(2049), 2304);
  EXPECT_EQ(GemmContext::size_bucket(4096), 4096);
  EXPECT_EQ(GemmContext::size_bucket(4097), 4608);
  EXPECT_EQ(GemmContext::size_bucket(5000), 5120);
  int64_t prev = 0, distinct = 0;
  for (int64_t v = 1; v <= (int64_t(1) << 20); ++v) {
    const int64_t b = GemmContext::size_bucket(v);
    ASSERT_GE(b, v);
    ASSERT_GE(b, prev) << "v=" << v;
    // At most one 128-row tile past v up to 2048, at most 1/8 of v above.
    if (v <= 2048)
      ASSERT_LT(b - v, 128) << "v=" << v;
    else
      ASSERT_LT(8 * (b - v), v) << "v=" << v;
    ASSERT_EQ(GemmContext::size_bucket(b), b) << "v=" << v;
    distinct += b != prev;
    prev = b;
  }
  EXPECT_EQ(distinct, 8 + 8 * 10);  // 128..1024 by 128, then 8 per power of two up to 2^20
}

// Expert forward/dgrad with bucketed plans, over row counts in many buckets (with and without the
// autotune): each result against the double reference (the existing tolerance rule), a repeated
// call bit-identical, and — without the autotune — a fresh context that never saw the other row
// counts bit-identical too (the algorithm is a function of the bucket, not of the cache's history:
// what bit-exact resume needs). lda/ldc are not multiples of 128 elements, so groups' pointers
// have mixed alignments.
TEST_F(CudaGemm, GroupedGemmRowCountsAcrossBuckets) {
  const int64_t G = 6, N = 64, K = 96, lda = K + 8, ldc = N + 8;
  uint64_t seed = 600;
  for (bool tune : {false, true}) {
    const std::unique_ptr<GemmContext> ctx = make_context(tune);
    for (bool tb : {false, true})
      for (GemmType c : {GemmType::BF16, GemmType::F32})
        for (const std::vector<int32_t>& rows : bucket_row_vectors()) {
          SCOPED_TRACE(std::string("autotune=") + std::to_string(tune) +
                       " trans_b=" + std::to_string(tb) +
                       " c=" + (c == GemmType::BF16 ? "bf16" : "fp32") + " " + rows_text(rows));
          std::mt19937_64 rng(seed++);
          int64_t total = 0;
          for (int32_t r : rows) total += r;
          const int64_t ldb = tb ? K : N, b_stride = (tb ? N : K) * ldb + 64;
          const int64_t extra = 3;  // rows of C past the routed ones: must stay untouched
          const auto A =
              random_values(size_t(std::max<int64_t>(total, 1) * lda), rng, GemmType::BF16);
          const auto B = random_values(size_t(G * b_stride), rng, GemmType::BF16);
          const float sentinel = -3.25f;
          const std::vector<float> C0(size_t((total + extra) * ldc), sentinel);
          DeviceMem dA(A.size() * 2), dB(B.size() * 2), dC(C0.size() * elem_bytes(c));
          upload(dA, A, GemmType::BF16, st);
          upload(dB, B, GemmType::BF16, st);
          upload(dC, C0, c, st);
          const float alpha = 0.75f;
          auto run = [&](GemmContext& x) {
            x.grouped_gemm(tb, rows.data(), G, N, K, alpha, dA.p, lda, dB.p, ldb, b_stride, 0.f,
                           dC.p, ldc, c, st);
            ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
            return download(dC, C0.size(), c, st);
          };
          const auto got = run(*ctx);
          const auto again = run(*ctx);
          EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0)
              << "a repeated call with the same rows changed bits";
          if (!tune) {
            const auto other = run(*make_context(false));
            EXPECT_EQ(std::memcmp(got.data(), other.data(), got.size() * sizeof(float)), 0)
                << "a fresh context gave different bits for the same rows";
          }

          std::vector<double> ref(C0.begin(), C0.end());
          int64_t off = 0;
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r = rows[size_t(g)];
            if (r == 0) continue;
            const std::vector<float> Ag(A.begin() + off * lda, A.begin() + (off + r) * lda);
            const std::vector<float> Bg(B.begin() + g * b_stride, B.begin() + (g + 1) * b_stride);
            std::vector<double> Cg(ref.begin() + off * ldc, ref.begin() + (off + r) * ldc);
            reference_gemm(false, tb, r, N, K, alpha, Ag, lda, Bg, ldb, 0.0, Cg, ldc, nullptr);
            std::copy(Cg.begin(), Cg.end(), ref.begin() + off * ldc);
            off += r;
          }
          if (total > 0) {
            const Deviation d = compare(got, ref, total, N, ldc);
            EXPECT_LE(d.max_err, tolerance(GemmType::BF16, c) * d.max_ref)
                << "max |err| " << d.max_err << " max |ref| " << d.max_ref;
          }
          int64_t touched = 0;
          for (int64_t m = 0; m < total + extra; ++m)
            for (int64_t n = (m < total ? N : 0); n < ldc; ++n)
              touched += got[size_t(m * ldc + n)] != sentinel;
          EXPECT_EQ(touched, 0) << "C written outside the routed rows' N columns";
        }
  }
}

// Expert weight gradients with the token count (GEMM K) bucketed: against the reference, repeated
// and fresh-context calls bit-identical (without the autotune), empty groups zeroed (beta = 0) or
// untouched (beta = 1).
TEST_F(CudaGemm, GroupedWgradRowCountsAcrossBuckets) {
  const int64_t G = 6, M_out = 48, K = 64, ld_dy = M_out + 8, ld_x = K, w_stride = M_out * K;
  uint64_t seed = 700;
  for (bool tune : {false, true}) {
    const std::unique_ptr<GemmContext> ctx = make_context(tune);
    for (auto [c, beta] : {std::pair{GemmType::F32, 1.f}, {GemmType::BF16, 0.f}})
      for (const std::vector<int32_t>& rows : bucket_row_vectors()) {
        SCOPED_TRACE(std::string("autotune=") + std::to_string(tune) +
                     " c=" + (c == GemmType::BF16 ? "bf16" : "fp32") +
                     " beta=" + std::to_string(beta) + " " + rows_text(rows));
        std::mt19937_64 rng(seed++);
        int64_t total = 0;
        for (int32_t r : rows) total += r;
        const auto dY =
            random_values(size_t(std::max<int64_t>(total, 1) * ld_dy), rng, GemmType::BF16);
        const auto X =
            random_values(size_t(std::max<int64_t>(total, 1) * ld_x), rng, GemmType::BF16);
        const std::vector<float> W0 = beta != 0 ? random_values(size_t(G * w_stride), rng, c)
                                                : std::vector<float>(size_t(G * w_stride), 7.f);
        DeviceMem ddY(dY.size() * 2), dX(X.size() * 2), dW(W0.size() * elem_bytes(c));
        upload(ddY, dY, GemmType::BF16, st);
        upload(dX, X, GemmType::BF16, st);
        const float alpha = 0.5f;
        auto run = [&](GemmContext& x) {
          upload(dW, W0, c, st);  // beta = 1 accumulates: every run starts from W0
          x.grouped_wgrad(rows.data(), G, M_out, K, alpha, ddY.p, ld_dy, dX.p, ld_x, beta, dW.p,
                          w_stride, c, st);
          ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
          return download(dW, W0.size(), c, st);
        };
        const auto got = run(*ctx);
        const auto again = run(*ctx);
        EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0)
            << "a repeated call with the same rows changed bits";
        if (!tune) {
          const auto other = run(*make_context(false));
          EXPECT_EQ(std::memcmp(got.data(), other.data(), got.size() * sizeof(float)), 0)
              << "a fresh context gave different bits for the same rows";
        }

        int64_t off = 0;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = rows[size_t(g)];
          std::vector<double> ref(W0.begin() + g * w_stride, W0.begin() + (g + 1) * w_stride);
          const std::vector<float> got_g(got.begin() + g * w_stride,
                                         got.begin() + (g + 1) * w_stride);
          if (r == 0) {
            int64_t wrong = 0;
            for (size_t i = 0; i < ref.size(); ++i)
              wrong += got_g[i] != (beta == 0 ? 0.f : W0[size_t(g * w_stride) + i]);
            EXPECT_EQ(wrong, 0) << "empty group " << g;
            continue;
          }
          const std::vector<float> dYg(dY.begin() + off * ld_dy, dY.begin() + (off + r) * ld_dy);
          const std::vector<float> Xg(X.begin() + off * ld_x, X.begin() + (off + r) * ld_x);
          reference_gemm(true, false, M_out, K, r, alpha, dYg, ld_dy, Xg, ld_x, beta, ref, K,
                         nullptr);
          const Deviation d = compare(got_g, ref, M_out, K, K);
          EXPECT_LE(d.max_err, tolerance(GemmType::BF16, c) * d.max_ref)
              << "group " << g << " max |err| " << d.max_err << " max |ref| " << d.max_ref;
          off += r;
        }
      }
  }
}

// 50 steps of an MoE layer's six expert GEMMs (forward gate_up and down, dgrad of both, wgrad of
// both) with random row counts per expert: the plan cache holds at most one plan per (GEMM, bucket)
// that occurred — with the old exact-size keys it held one per distinct (GEMM, row count), about
// 6·16·50 here. Leading dimensions are multiples of 128 elements, so every group's pointers are
// 256-byte aligned and the alignments add no keys. A count above the bound means some exact sizes
// fell back to exact-shape plans (correct, but the bucket's algorithm was refused: slow path).
// Replaying the first step's rows afterwards adds no plan and reproduces its output bit for bit.
TEST_F(CudaGemm, GroupedPlanCacheStaysBounded) {
  AutotuneEnv env(false);
  GemmContext ctx;
  const int64_t E = 16, D = 256, I = 128, max_rows = 3000, steps = 50;
  const size_t cap = size_t(E * max_rows);
  std::mt19937_64 rng(800);
  const auto xs_h = random_values(cap * size_t(D), rng, GemmType::BF16);
  const auto act_h = random_values(cap * size_t(I), rng, GemmType::BF16);
  const auto wgu_h = random_values(size_t(E * 2 * I * D), rng, GemmType::BF16, -0.1f, 0.1f);
  const auto wdn_h = random_values(size_t(E * D * I), rng, GemmType::BF16, -0.1f, 0.1f);
  DeviceMem xs(cap * size_t(D) * 2), act(cap * size_t(I) * 2), gu(cap * size_t(2 * I) * 2),
      y(cap * size_t(D) * 2), dact(cap * size_t(I) * 2), dx(cap * size_t(D) * 2),
      wgu(wgu_h.size() * 2), wdn(wdn_h.size() * 2), dwgu(wgu_h.size() * 4), dwdn(wdn_h.size() * 4);
  upload(xs, xs_h, GemmType::BF16, st);
  upload(act, act_h, GemmType::BF16, st);
  upload(wgu, wgu_h, GemmType::BF16, st);
  upload(wdn, wdn_h, GemmType::BF16, st);
  ZAYA_CUDA_CHECK(cudaMemsetAsync(dwgu.p, 0, dwgu.bytes(), st));
  ZAYA_CUDA_CHECK(cudaMemsetAsync(dwdn.p, 0, dwdn.bytes(), st));
  const auto BF = GemmType::BF16, F32 = GemmType::F32;
  auto step = [&](const std::vector<int32_t>& rows) {
    const int32_t* r = rows.data();
    ctx.grouped_gemm(true, r, E, 2 * I, D, 1.f, xs.p, D, wgu.p, D, 2 * I * D, 0.f, gu.p, 2 * I, BF,
                     st);
    ctx.grouped_gemm(true, r, E, D, I, 1.f, act.p, I, wdn.p, I, D * I, 0.f, y.p, D, BF, st);
    ctx.grouped_wgrad(r, E, D, I, 1.f, y.p, D, act.p, I, 1.f, dwdn.p, D * I, F32, st);
    ctx.grouped_gemm(false, r, E, I, D, 1.f, y.p, D, wdn.p, I, D * I, 0.f, dact.p, I, BF, st);
    ctx.grouped_wgrad(r, E, 2 * I, D, 1.f, gu.p, 2 * I, xs.p, D, 1.f, dwgu.p, 2 * I * D, F32, st);
    ctx.grouped_gemm(false, r, E, D, 2 * I, 1.f, gu.p, 2 * I, wgu.p, D, 2 * I * D, 0.f, dx.p, D, BF,
                     st);
  };
  constexpr int kShapes = 6;
  std::vector<std::pair<int, int64_t>> hit;  // (GEMM, bucket) pairs that occurred
  std::vector<int32_t> first_rows;
  std::vector<float> first_y;
  int64_t total_first = 0;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int32_t> rows(static_cast<size_t>(E));
    for (int32_t& r : rows) r = rng() % 6 == 0 ? 0 : int32_t(1 + rng() % uint64_t(max_rows));
    step(rows);
    for (int32_t r : rows)
      if (r > 0)
        for (int g = 0; g < kShapes; ++g) hit.emplace_back(g, GemmContext::size_bucket(r));
    if (s == 0) {
      first_rows = rows;
      for (int32_t r : rows) total_first += r;
      ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
      first_y = download(y, size_t(total_first * D), BF, st);
    }
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  std::sort(hit.begin(), hit.end());
  hit.erase(std::unique(hit.begin(), hit.end()), hit.end());
  const size_t bound = hit.size();
  // 20 buckets cover 1..3072 (3000 rows at most): at most 6 · 20 plans however the rows fall.
  EXPECT_LE(bound, size_t(kShapes * 20));
  EXPECT_LE(ctx.plan_count(), bound) << "exact-size fallbacks or per-size plans: the cache grows";
  EXPECT_GE(ctx.plan_count(), size_t(kShapes));

  const size_t before = ctx.plan_count();
  step(first_rows);
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  EXPECT_EQ(ctx.plan_count(), before) << "replaying seen row counts created plans";
  const auto y_again = download(y, size_t(total_first * D), BF, st);
  EXPECT_EQ(std::memcmp(first_y.data(), y_again.data(), first_y.size() * sizeof(float)), 0)
      << "the first step's expert output changed bits when replayed after 50 steps";
}

// Bad arguments are zaya::Errors that name the argument and its value.
TEST_F(CudaGemm, RejectsBadArguments) {
  GemmContext ctx;
  DeviceMem buf(1 << 16);
  auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  const void* p = buf.p;
  void* q = buf.p;
  const auto bf = GemmType::BF16;
  EXPECT_NE(message_of([&] {
              ctx.gemm(false, false, 0, 8, 8, 1.f, p, 8, p, 8, 0.f, q, 8, bf, bf, nullptr, st);
            }).find("M = 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ctx.gemm(false, false, 8, -2, 8, 1.f, p, 8, p, 8, 0.f, q, 8, bf, bf, nullptr, st);
            }).find("N = -2"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ctx.gemm(false, true, 8, 8, 16, 1.f, p, 12, p, 16, 0.f, q, 8, bf, bf, nullptr, st);
            }).find("lda = 12"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ctx.gemm(false, true, 8, 8, 16, 1.f, p, 16, p, 8, 0.f, q, 8, bf, bf, nullptr, st);
            }).find("ldb = 8"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ctx.gemm(false, false, 8, 16, 8, 1.f, p, 8, p, 16, 0.f, q, 8, bf, bf, nullptr, st);
            }).find("ldc = 8"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ctx.gemm(false, false, 8, 8, 8, 1.f, p, 8, p, 8, 1.f, q, 8, bf, bf,
                       static_cast<const float*>(p), st);
            }).find("beta"),
            std::string::npos);
  const int32_t rows[2] = {4, -1};
  EXPECT_NE(message_of([&] {
              ctx.grouped_gemm(true, rows, 2, 8, 8, 1.f, p, 8, p, 8, 64, 0.f, q, 8, bf, st);
            }).find("rows_host[1] = -1"),
            std::string::npos);
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
}

// Workspace::take is host pointer arithmetic: no device needed.
TEST(CudaWorkspace, TakeAlignsTo256AndReportsOverflow) {
  std::vector<char> arena(4096 + 512);
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(arena.data());
  Workspace ws;
  ws.base = arena.data() + ((256 - a0 % 256) % 256) + 8;  // 8 bytes past a 256-byte boundary
  ws.capacity = 4096;
  void* a = ws.take(10);
  void* b = ws.take(1);
  float* c = ws.take_n<float>(100);
  for (void* p : {a, b, static_cast<void*>(c)}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    EXPECT_GE(static_cast<char*>(p), ws.base);
  }
  EXPECT_GE(static_cast<char*>(b), static_cast<char*>(a) + 10);
  EXPECT_GE(reinterpret_cast<char*>(c), static_cast<char*>(b) + 1);
  EXPECT_LE(ws.used, ws.capacity);
  const size_t used = ws.used;
  try {
    ws.take(4000);
    ADD_FAILURE() << "an over-large request did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("4000"), std::string::npos) << m;
    EXPECT_NE(m.find("4096"), std::string::npos) << m;
  }
  EXPECT_EQ(ws.used, used) << "a failed take must not consume space";
  EXPECT_THROW(ws.take(std::numeric_limits<size_t>::max()), Error);
  ws.reset();
  EXPECT_EQ(ws.used, 0u);
  EXPECT_NO_THROW(ws.take(4096 - 248));  // the first aligned address is 248 bytes in
  EXPECT_THROW(ws.take(1), Error);
}

class CudaConvert : public CudaGemm {};

// Conversions are bit-exact against the host's round-to-nearest-even (NaN only checked to stay
// NaN); sizes cover the vector body, the scalar tail, and misaligned pointers (scalar path).
//
// Every copy goes through cudaMemcpyAsync on the test's stream (test_util::to_device/to_host). st
// is a non-blocking stream, and a plain cudaMemcpy from pageable memory may return before its DMA
// has landed; nothing then orders it before a kernel on st, which at n ≈ 1M read stale y or had its
// result overwritten by the late copy (errors of ~2 and NaN from the b = 0 case's NaN-filled y).
TEST_F(CudaConvert, ConversionsAndArithmetic) {
  auto upload = [&](void* dst, const void* src, size_t bytes) {
    ZAYA_CUDA_CHECK(test_util::to_device(dst, src, bytes, st));
  };
  auto download = [&](void* dst, const void* src, size_t bytes) {
    ZAYA_CUDA_CHECK(test_util::to_host(dst, src, bytes, st));
  };
  for (const int64_t n : {int64_t(1), int64_t(3), int64_t(1003), int64_t(1 << 20) + 5})
    for (const int64_t shift : {int64_t(0), int64_t(1)}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " shift=" + std::to_string(shift));
      std::mt19937_64 rng(uint64_t(n * 2 + shift));
      std::vector<float> x = random_values(size_t(n), rng, GemmType::F32, -3.f, 3.f);
      std::vector<float> y = random_values(size_t(n), rng, GemmType::F32, -3.f, 3.f);
      // Special values: ties, a denormal, infinities, signed zero, NaN.
      const float specials[] = {1.00390625f,  // 1 + 2^-8: a tie, rounds to even (1.0)
                                1.01171875f,  // 1 + 3·2^-8: a tie, rounds up
                                1e-40f,
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                -0.f,
                                std::numeric_limits<float>::quiet_NaN()};
      for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i] = specials[i];

      DeviceMem dx(size_t(n + shift) * 4), dy(size_t(n + shift) * 4), db(size_t(n + shift) * 2);
      float* px = dx.as<float>() + shift;
      float* py = dy.as<float>() + shift;
      bf16* pb = db.as<bf16>() + shift;
      upload(px, x.data(), size_t(n) * 4);

      f32_to_bf16(pb, px, n, st);
      std::vector<uint16_t> hb(static_cast<size_t>(n));
      download(hb.data(), pb, size_t(n) * 2);
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = zaya::f32_to_bf16(x[size_t(i)]);
        if (std::isnan(x[size_t(i)]))
          wrong += !std::isnan(zaya::bf16_to_f32(hb[size_t(i)]));
        else
          wrong += hb[size_t(i)] != want;
      }
      EXPECT_EQ(wrong, 0) << "f32_to_bf16";

      bf16_to_f32(py, pb, n, st);
      std::vector<float> back(static_cast<size_t>(n));
      download(back.data(), py, size_t(n) * 4);
      wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float want = zaya::bf16_to_f32(hb[size_t(i)]);
        wrong += std::isnan(want) ? !std::isnan(back[size_t(i)])
                                  : std::memcmp(&want, &back[size_t(i)], 4) != 0;
      }
      EXPECT_EQ(wrong, 0) << "bf16_to_f32";

      // Arithmetic on finite inputs (drop the specials).
      x = random_values(size_t(n), rng, GemmType::F32, -3.f, 3.f);
      upload(px, x.data(), size_t(n) * 4);
      auto check = [&](const char* what, auto&& want_of) {
        std::vector<float> got(static_cast<size_t>(n));
        download(got.data(), py, size_t(n) * 4);
        double max_err = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double want = want_of(size_t(i));
          max_err = std::max(
              max_err, std::abs(double(got[size_t(i)]) - want) / std::max(1.0, std::abs(want)));
          if (!std::isfinite(got[size_t(i)])) max_err = std::numeric_limits<double>::infinity();
        }
        EXPECT_LE(max_err, 1e-6) << what;
      };
      upload(py, y.data(), size_t(n) * 4);
      add_f32(py, px, n, st);
      check("add_f32", [&](size_t i) { return double(y[i]) + double(x[i]); });

      upload(py, y.data(), size_t(n) * 4);
      scale_f32(py, -0.375f, n, st);
      check("scale_f32", [&](size_t i) { return -0.375 * double(y[i]); });

      upload(py, y.data(), size_t(n) * 4);
      axpby_f32(py, 0.25f, px, -1.5f, n, st);
      check("axpby_f32", [&](size_t i) { return 0.25 * double(x[i]) - 1.5 * double(y[i]); });

      // b = 0 does not read y: NaN in y must not leak into y = a·x.
      const std::vector<float> nans(size_t(n), std::numeric_limits<float>::quiet_NaN());
      upload(py, nans.data(), size_t(n) * 4);
      axpby_f32(py, 2.f, px, 0.f, n, st);
      check("axpby_f32 b=0", [&](size_t i) { return 2.0 * double(x[i]); });

      // x may alias y: every element is read and written by the same thread.
      upload(py, y.data(), size_t(n) * 4);
      axpby_f32(py, 0.5f, py, 2.f, n, st);
      check("axpby_f32 x=y", [&](size_t i) { return 2.5 * double(y[i]); });
    }
  // n = 0 is a no-op.
  EXPECT_NO_THROW(add_f32(nullptr, nullptr, 0, st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
}

}  // namespace
}  // namespace zaya::cuda
