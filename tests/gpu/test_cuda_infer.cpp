// GPU inference (backend/cuda/infer_cuda.h) against the CPU reference model: prefill logits of
// every position, every decode step's logits with the cache, greedy generation, batching, chunked
// prefill, graph replay, and bad input. Tolerances follow DESIGN.md §Numerics: the GPU path keeps
// weights and activations in bf16, so logits agree with the fp32 reference to a few bf16 ulps of
// the logit scale; greedy tokens agree wherever the reference's top-2 margin is clear of that.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/infer_cuda.h"
#include "io/safetensors.h"
#include "model/generate.h"
#include "model/zaya.h"

namespace zaya::cuda {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string fixture(const std::string& name) {
  return std::string(ZAYA_SOURCE_DIR) + "/tests/fixtures/parity/" + name;
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = std::max(m, double(std::fabs(a[i])));
  return m;
}

// max |a - b| relative to the reference's largest magnitude.
double rel_err(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.numel(), ref.numel());
  double worst = 0;
  for (int64_t i = 0; i < std::min(got.numel(), ref.numel()); i++)
    worst = std::max(worst, double(std::fabs(got.f32()[i] - ref.f32()[i])));
  return worst / std::max(1e-30, max_abs(ref.f32(), ref.numel()));
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

std::vector<int32_t> fixture_prompt(const std::string& dir) {
  std::ifstream in(dir + "/expected.json");
  return nlohmann::json::parse(in)["prompt"].get<std::vector<int32_t>>();
}

constexpr double kTol = 3e-2;  // of the logit scale: bf16 weights and activations through the stack

class CudaInfer : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaInfer, PrefillAndDecodeStepsMatchTheCpuCache) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixture(GetParam());
  ZayaModel m = ZayaModel::load(dir);
  const auto prompt = fixture_prompt(dir);
  const int64_t S = int64_t(prompt.size()), steps = 12;
  CudaInferOptions o;
  o.max_context = S + steps + 4;
  CudaInference inf(m, o);
  inf.reset(1);
  InferenceCache cache = m.new_cache(1, S + steps + 4);
  Tensor ref = m.forward(prompt, 1, S, true, &cache);
  Tensor got = inf.prefill(prompt, S, true);
  EXPECT_LE(rel_err(got, ref), kTol) << "prefill logits";
  int32_t tok = prompt.back();
  for (int64_t i = 0; i < steps; i++) {
    // Feed both the same token (the CPU's greedy choice) so the caches stay comparable.
    const float* last = ref.f32() + (ref.numel() / m.cfg.vocab_size - 1) * m.cfg.vocab_size;
    tok = int32_t(std::max_element(last, last + m.cfg.vocab_size) - last);
    ref = m.forward({tok}, 1, 1, false, &cache);
    got = inf.decode({tok});
    EXPECT_LE(rel_err(got, ref), kTol) << "decode step " << i;
  }
  EXPECT_EQ(inf.length(), S + steps);
}

TEST_P(CudaInfer, GreedyGenerationAgreesWhereTheReferenceIsDecided) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixture(GetParam());
  ZayaModel m = ZayaModel::load(dir);
  const auto prompt = fixture_prompt(dir);
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
  const std::string dir = fixture(GetParam());
  ZayaModel m = ZayaModel::load(dir);
  auto p0 = fixture_prompt(dir);
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
  ZayaModel m = ZayaModel::load(fixture(GetParam()));
  CudaInferOptions o;
  o.max_context = 8;
  CudaInference inf(m, o);
  inf.reset(1);
  EXPECT_THROW(inf.prefill({1, 2, int32_t(m.cfg.vocab_size)}, 3), Error);
  EXPECT_THROW(inf.decode({1}), Error);                             // nothing prefilled yet
  EXPECT_THROW(inf.prefill(std::vector<int32_t>(9, 1), 9), Error);  // past the capacity
  EXPECT_THROW(inf.reset(2), Error);                                // above max_batch
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaInfer, ::testing::Values("cfg_a", "cfg_b"));

}  // namespace
}  // namespace zaya::cuda
