// The Decoder interface (engine/decoder.h) on the CPU: the reference decoder is the model's own
// cached forward, so its greedy and sampled generations, its losses and windowed evaluation are
// the model's to the bit; the factory refuses unknown devices. The CUDA decoder is checked on the
// GPU (tests/gpu/test_cuda_infer.cpp) and by tests/cli/device_cuda_without_gpu.sh.
#include <gtest/gtest.h>

#include <vector>

#include "../model/parity_fixture.h"
#include "ckpt/model_io.h"
#include "core/error.h"
#include "engine/decoder.h"
#include "model/zaya.h"

using namespace zaya;

namespace {

using test_util::parity_fixture;
using test_util::parity_prompt;

// The generation loop as it was written against the model before the Decoder existed: one
// prefill, then one cached forward per token, every token through sample_token.
std::vector<int32_t> model_loop(const ZayaModel& m, const std::vector<int32_t>& prompt,
                                int64_t max_new, const SamplingOptions& opt, int32_t stop) {
  InferenceCache cache = m.new_cache(1, int64_t(prompt.size()) + max_new);
  Rng rng(opt.seed);
  std::vector<int32_t> out;
  Tensor logits = m.forward(prompt, 1, int64_t(prompt.size()), false, &cache);
  for (int64_t i = 0; i < max_new; i++) {
    const int32_t tok = sample_token(logits.f32(), m.cfg.vocab_size, opt, rng);
    out.push_back(tok);
    if (tok == stop || i + 1 == max_new) break;
    logits = m.forward({tok}, 1, 1, false, &cache);
  }
  return out;
}

TEST(Decoder, CpuGenerationIsTheModelsCachedForward) {
  ZayaModel m = load_model(parity_fixture("cfg_a"));
  const auto prompt = parity_prompt(parity_fixture("cfg_a"));
  const int64_t n = 12;
  auto dec = make_decoder(m, {.device = "cpu", .max_context = int64_t(prompt.size()) + n});
  EXPECT_EQ(dec->device(), "cpu");
  SamplingOptions greedy;
  greedy.greedy = true;
  SamplingOptions sampled;
  sampled.temperature = 0.9f;
  sampled.top_k = 20;
  sampled.top_p = 0.95f;
  sampled.seed = 7;
  for (const SamplingOptions& opt : {greedy, sampled}) {
    const auto want = model_loop(m, prompt, n, opt, -1);
    std::vector<int32_t> streamed;
    EXPECT_EQ(generate(*dec, prompt, n, opt, -1, [&](int32_t t) { streamed.push_back(t); }), want);
    EXPECT_EQ(streamed, want);
    EXPECT_EQ(generate(m, prompt, n, opt), want);
    EXPECT_EQ(dec->length(), int64_t(prompt.size()) + n - 1);
    // A stop token ends generation and is included.
    const int32_t stop = want[4];
    EXPECT_EQ(generate(*dec, prompt, n, opt, stop), model_loop(m, prompt, n, opt, stop));
  }
  EXPECT_TRUE(generate(*dec, prompt, 0, greedy).empty());
  EXPECT_THROW(generate(*dec, {}, 3, greedy), Error);
}

TEST(Decoder, CpuGreedyStepIsTheArgmaxOfDecode) {
  ZayaModel m = load_model(parity_fixture("cfg_b"));
  const auto prompt = parity_prompt(parity_fixture("cfg_b"));
  auto dec = make_decoder(m, {.max_context = int64_t(prompt.size()) + 4});
  dec->prefill(prompt);
  const auto step = dec->decode_greedy(prompt[0], 8);
  ASSERT_EQ(step.size(), 1u);  // the CPU takes one step at a time
  dec->reset();
  EXPECT_EQ(dec->length(), 0);
  dec->prefill(prompt);
  const Tensor lg = dec->decode(prompt[0]);
  int64_t best = 0;
  for (int64_t v = 1; v < m.cfg.vocab_size; v++)
    if (lg.f32()[v] > lg.f32()[best]) best = v;
  EXPECT_EQ(step[0], int32_t(best));
  EXPECT_EQ(dec->length(), int64_t(prompt.size()) + 1);
}

TEST(Decoder, CpuLossAndWindowedEvaluationAreTheModels) {
  ZayaModel m = load_model(parity_fixture("cfg_a"));
  const auto e = test_util::load_parity_expected(parity_fixture("cfg_a"));
  const std::vector<int32_t> ids(e.ids.begin(), e.ids.begin() + e.S);
  const int64_t n = int64_t(ids.size());
  auto dec = make_decoder(m, {.max_context = n});
  EXPECT_EQ(dec->loss(ids), m.loss(ids, 1, n));
  const EvalResult whole = evaluate(*dec, ids, 0);
  EXPECT_EQ(whole.loss, m.loss(ids, 1, n));
  EXPECT_EQ(whole.scored, n - 1);
  // Windows of 5 tokens: each scored alone; a last window of one token is dropped.
  const int64_t w = 5;
  double total = 0;
  int64_t count = 0;
  for (int64_t s = 0; s + 1 < n; s += w) {
    const int64_t len = std::min(w, n - s);
    if (len < 2) break;
    total += m.loss(std::vector<int32_t>(ids.begin() + s, ids.begin() + s + len), 1, len) *
             double(len - 1);
    count += len - 1;
  }
  const EvalResult windows = evaluate(*dec, ids, w);
  EXPECT_EQ(windows.loss, total / double(count));
  EXPECT_EQ(windows.scored, count);
  EXPECT_THROW(dec->loss({ids[0]}), Error);
}

TEST(Decoder, FactoryRefusesUnknownDevicesAndEmptyCaches) {
  ZayaModel m = load_model(parity_fixture("cfg_a"));
  EXPECT_THROW(make_decoder(m, {.device = "tpu"}), Error);
  EXPECT_THROW(make_decoder(m, {.device = "cpu", .max_context = 0}), Error);
}

}  // namespace
