// GPU inference (backend/cuda/infer_cuda.h) against the CPU reference model: prefill logits of
// every position, every decode step's logits with the cache, greedy generation, batching, chunked
// prefill, graph replay, and bad input. Tolerances follow DESIGN.md §Numerics: the GPU path keeps
// weights and activations in bf16, so logits agree with the fp32 reference to a few bf16 ulps of
// the logit scale; greedy tokens agree wherever the reference's top-2 margin is clear of that.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../model/parity_fixture.h"
#include "backend/cuda/infer_cuda.h"
#include "gpu_test_util.h"
#include "io/safetensors.h"
#include "model/generate.h"
#include "model/zaya.h"

namespace zaya::cuda {
namespace {

using test_util::have_gpu;
using test_util::max_abs;
using test_util::parity_fixture;
using test_util::parity_prompt;

// max |a - b| relative to the reference's largest magnitude.
double rel_err(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.numel(), ref.numel());
  double worst = 0;
  for (int64_t i = 0; i < std::min(got.numel(), ref.numel()); i++)
    worst = std::max(worst, double(std::fabs(got.f32()[i] - ref.f32()[i])));
  return worst / std::max(1e-30, max_abs(ref.f32(), ref.numel()));
}

// Per row of V logits: max |a - b| over the row's largest reference magnitude. A token whose
// router margin is below bf16 resolution may pick another expert on the GPU (the fixtures have
// margins down to 5e-4), which changes that row and, slightly, the rows after it; so the checks
// below bound the fraction of rows off and the median row, not only the worst one.
struct RowErrors {
  std::vector<double> e;
  double fraction_over(double tol) const {
    return double(std::count_if(e.begin(), e.end(), [&](double x) { return x > tol; })) /
           double(e.size());
  }
  double median() const {
    std::vector<double> v = e;
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    return v[v.size() / 2];
  }
};

RowErrors row_errors(const Tensor& got, const Tensor& ref, int64_t V) {
  RowErrors r;
  EXPECT_EQ(got.numel(), ref.numel());
  for (int64_t row = 0; row * V < std::min(got.numel(), ref.numel()); row++) {
    double worst = 0;
    for (int64_t v = 0; v < V; v++)
      worst = std::max(worst, double(std::fabs(got.f32()[row * V + v] - ref.f32()[row * V + v])));
    r.e.push_back(worst / std::max(1e-30, max_abs(ref.f32() + row * V, V)));
  }
  return r;
}

// Margin between the best and second-best logit of a row.
double top2_margin(const float* row, int64_t V) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t v = 0; v < V; v++) {
    if (row[v] > a) {
      b = a;
      a = row[v];
    } else if (row[v] > b) {
      b = row[v];
    }
  }
  return double(a - b);
}

constexpr double kTol = 3e-2;  // of the logit scale: bf16 weights and activations through the stack

class CudaInfer : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaInfer, PrefillAndDecodeStepsMatchTheCpuCache) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = parity_fixture(GetParam());
  ZayaModel m = ZayaModel::load(dir);
  const auto prompt = parity_prompt(dir);
  const int64_t S = int64_t(prompt.size()), steps = 12, V = m.cfg.vocab_size;
  CudaInferOptions o;
  o.max_context = S + steps + 4;
  CudaInference inf(m, o);
  inf.reset(1);
  InferenceCache cache = m.new_cache(1, S + steps + 4);
  Tensor ref = m.forward(prompt, 1, S, true, &cache);
  Tensor got = inf.prefill(prompt, S, true);
  RowErrors pre = row_errors(got, ref, V);
  // cfg_a's router margins reach 4.6e-4: a near-tie token may take another expert under bf16 and
  // perturb the positions after it (H200, 2026-12-03: 4 of 24 prompt rows over 3e-2).
  EXPECT_LE(pre.median(), kTol / 2) << "prefill: median row error";
  EXPECT_LE(pre.fraction_over(kTol), 0.25) << "prefill: rows off by more than " << kTol;
  RecordProperty("prefill_worst_row", std::to_string(rel_err(got, ref)));
  Tensor refs = Tensor::empty({steps, V}, DType::F32), gots = Tensor::empty({steps, V}, DType::F32);
  for (int64_t i = 0; i < steps; i++) {
    // Feed both the same token (the CPU's greedy choice) so the caches stay comparable.
    const float* last = ref.f32() + (ref.numel() / V - 1) * V;
    const int32_t tok = int32_t(std::max_element(last, last + V) - last);
    ref = m.forward({tok}, 1, 1, false, &cache);
    got = inf.decode({tok});
    std::copy_n(ref.f32(), V, refs.f32() + i * V);
    std::copy_n(got.f32(), V, gots.f32() + i * V);
  }
  RowErrors dec = row_errors(gots, refs, V);
  EXPECT_LE(dec.median(), kTol) << "decode: median step error";
  EXPECT_LE(dec.fraction_over(kTol), 0.25) << "decode: steps off by more than " << kTol;
  EXPECT_EQ(inf.length(), S + steps);
}

// The GPU's two paths against each other: one batched prefill vs the same prompt fed one token at
// a time through the decode path (GEMVs, split-context attention, device-side positions).
TEST_P(CudaInfer, PrefillEqualsTokenByTokenDecode) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = parity_fixture(GetParam());
  ZayaModel m = ZayaModel::load(dir);
  const auto prompt = parity_prompt(dir);
  const int64_t S = int64_t(prompt.size()), V = m.cfg.vocab_size;
  CudaInferOptions o;
  o.max_context = S + 1;
  CudaInference inf(m, o);
  inf.reset(1);
  Tensor all = inf.prefill(prompt, S, true);
  inf.reset(1);
  Tensor steps = Tensor::empty({S, V}, DType::F32);
  std::copy_n(inf.prefill({prompt[0]}, 1).f32(), V, steps.f32());
  for (int64_t t = 1; t < S; t++)
    std::copy_n(inf.decode({prompt[size_t(t)]}).f32(), V, steps.f32() + t * V);
  RowErrors r = row_errors(steps, all, V);
  EXPECT_LE(r.median(), 1e-2) << "median position";
  EXPECT_LE(r.fraction_over(kTol), 0.1) << "positions off by more than " << kTol;
}

TEST_P(CudaInfer, GreedyGenerationAgreesWhereTheReferenceIsDecided) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = parity_fixture(GetParam());
  ZayaModel m = ZayaModel::load(dir);
  const auto prompt = parity_prompt(dir);
  const int64_t n = 16, V = m.cfg.vocab_size;
  SamplingOptions opt;
  opt.greedy = true;
  const auto want = generate(m, prompt, n, opt);
  CudaInferOptions o;
  o.max_context = int64_t(prompt.size()) + n + 1;
  CudaInference inf(m, o);
  const auto got = generate_cuda(inf, prompt, n, opt);
  ASSERT_EQ(got.size(), want.size());
  // At the first disagreement (if any) the reference must have been undecided.
  for (size_t i = 0; i < want.size(); i++) {
    if (got[i] == want[i]) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.insert(ctx.end(), want.begin(), want.begin() + long(i));
    Tensor lg = m.forward(ctx, 1, int64_t(ctx.size()), false);
    const double scale = max_abs(lg.f32(), V);
    EXPECT_LE(top2_margin(lg.f32(), V), 2 * kTol * scale)
        << "token " << i << ": GPU chose " << got[i] << ", CPU " << want[i]
        << " with a clear margin";
    break;
  }
}

TEST_P(CudaInfer, BatchedChunkedAndGraphRunsAgree) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = parity_fixture(GetParam());
  ZayaModel m = ZayaModel::load(dir);
  auto p0 = parity_prompt(dir);
  std::vector<int32_t> p1(p0.rbegin(), p0.rend());  // a second, different sequence
  const int64_t S = int64_t(p0.size()), V = m.cfg.vocab_size;
  // Reference: each sequence alone, one prefill pass, eager decode.
  CudaInferOptions single;
  single.max_context = S + 8;
  single.graphs = false;
  CudaInference one(m, single);
  std::vector<Tensor> alone;
  for (const auto& p : {p0, p1}) {
    one.reset(1);
    one.prefill(p, S);
    alone.push_back(one.decode({p[0]}));
    alone.push_back(one.decode({p[1]}));
    alone.push_back(one.decode({p[2]}));
  }
  // Both together, prefill in chunks of 3 tokens per sequence, decode replayed from a graph.
  CudaInferOptions batched;
  batched.max_batch = 2;
  batched.max_context = S + 8;
  batched.max_prefill_tokens = 6;
  CudaInference two(m, batched);
  two.reset(2);
  std::vector<int32_t> ids(p0);
  ids.insert(ids.end(), p1.begin(), p1.end());
  two.prefill(ids, S);
  for (int i = 0; i < 3; i++) {
    Tensor lg = two.decode({p0[size_t(i)], p1[size_t(i)]});
    for (int b = 0; b < 2; b++) {
      Tensor row = Tensor::empty({V}, DType::F32);
      std::copy_n(lg.f32() + b * V, V, row.f32());
      EXPECT_LE(rel_err(row, alone[size_t(b * 3 + i)]), 1e-2) << "sequence " << b << " step " << i;
    }
  }
}

TEST_P(CudaInfer, BadInputIsRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ZayaModel m = ZayaModel::load(parity_fixture(GetParam()));
  CudaInferOptions o;
  o.max_context = 8;
  CudaInference inf(m, o);
  inf.reset(1);
  EXPECT_THROW(inf.prefill({1, 2, int32_t(m.cfg.vocab_size)}, 3), Error);
  EXPECT_THROW(inf.decode({1}), Error);                             // nothing prefilled yet
  EXPECT_THROW(inf.prefill(std::vector<int32_t>(9, 1), 9), Error);  // past the capacity
  EXPECT_THROW(inf.reset(2), Error);                                // above max_batch
}

// cfg_b has head dim 16, below what the GPU attention and CCA kernels take (32, 64, 128).
INSTANTIATE_TEST_SUITE_P(Fixtures, CudaInfer, ::testing::Values("cfg_a"));

TEST(CudaInferShapes, UnsupportedHeadDimIsRefusedWithTheReason) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ZayaModel m = ZayaModel::load(parity_fixture("cfg_b"));
  ASSERT_EQ(m.cfg.head_dim, 16);
  try {
    CudaInference inf(m, CudaInferOptions{});
    FAIL() << "a head dim of 16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zaya::cuda
