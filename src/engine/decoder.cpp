// The CPU reference Decoder (ZayaModel::forward over an InferenceCache), make_decoder, the one
// generation loop and windowed evaluation. The CUDA decoder's factory is defined in
// engine/cuda/cuda_decoder_cuda.cpp; a build without the CUDA backend gets the stand-in below.
#include "engine/decoder.h"

#include <algorithm>

#include "core/error.h"
#include "engine/cuda/cuda_decoder.h"

namespace zaya {

#if !defined(ZAYA_HAVE_CUDA)
std::unique_ptr<Decoder> make_cuda_decoder(const ZayaModel&, const DecoderOptions&) {
  fail(
      "--device cuda: this zaya was built without CUDA (this build has no CUDA backend; "
      "configure with -DZAYA_CUDA=ON on a machine with nvcc)");
}
#endif

namespace {

class CpuDecoder final : public Decoder {
 public:
  CpuDecoder(const ZayaModel& m, int64_t max_context)
      : m_(m), cache_(m.new_cache(1, max_context)) {}
  const ZayaConfig& cfg() const override { return m_.cfg; }
  std::string device() const override { return "cpu"; }
  int64_t max_context() const override { return cache_.capacity; }
  int64_t length() const override { return cache_.length; }
  void reset() override { cache_ = m_.new_cache(1, cache_.capacity); }
  Tensor prefill(const std::vector<int32_t>& ids) override {
    ZAYA_CHECK(!ids.empty(), "prefill: no tokens");
    return m_.forward(ids, 1, int64_t(ids.size()), false, &cache_);
  }
  Tensor decode(int32_t token) override {
    ZAYA_CHECK(cache_.length >= 1, "decode: prefill a prompt first");
    return m_.forward({token}, 1, 1, false, &cache_);
  }
  double loss(const std::vector<int32_t>& ids) override {
    ZAYA_CHECK(ids.size() >= 2, "loss: need at least 2 tokens, got {}", ids.size());
    reset();
    return m_.loss(ids, 1, int64_t(ids.size()));
  }

 private:
  const ZayaModel& m_;
  InferenceCache cache_;
};

}  // namespace

std::vector<int32_t> Decoder::decode_greedy(int32_t first, int64_t most) {
  ZAYA_CHECK(most >= 1, "decode_greedy: {} steps", most);
  SamplingOptions greedy;
  greedy.greedy = true;
  Rng unused(0);  // greedy sampling draws nothing
  const Tensor logits = decode(first);
  return {sample_token(logits.f32(), cfg().vocab_size, greedy, unused)};
}

std::unique_ptr<Decoder> make_decoder(const ZayaModel& model, const DecoderOptions& opt) {
  ZAYA_CHECK(opt.max_context >= 1, "decoder: max_context must be positive, got {}",
             opt.max_context);
  if (opt.device == "cuda") return make_cuda_decoder(model, opt);
  ZAYA_CHECK(opt.device == "cpu", "--device {}: expected cpu or cuda", opt.device);
  return std::make_unique<CpuDecoder>(model, opt.max_context);
}

std::vector<int32_t> generate(Decoder& dec, const std::vector<int32_t>& prompt, int64_t max_new,
                              const SamplingOptions& opt, int32_t stop_id,
                              const std::function<void(int32_t)>& on_token) {
  ZAYA_CHECK(!prompt.empty(), "generate: the prompt is empty (give at least one token)");
  ZAYA_CHECK(max_new >= 0, "generate: max_new_tokens must be >= 0, got {}", max_new);
  std::vector<int32_t> out;
  if (max_new == 0) return out;
  dec.reset();
  const int64_t V = dec.cfg().vocab_size;
  const bool greedy = opt.greedy || opt.temperature <= 0.0f;
  Rng rng(opt.seed);
  int32_t tok = sample_token(dec.prefill(prompt).f32(), V, opt, rng);
  std::vector<int32_t> ahead;  // greedy tokens decoded, not yet handed out, last first
  for (int64_t i = 0;; i++) {
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (tok == stop_id || i + 1 == max_new) break;
    if (greedy) {
      if (ahead.empty()) {
        const auto got = dec.decode_greedy(tok, max_new - 1 - i);
        ahead.assign(got.rbegin(), got.rend());
      }
      tok = ahead.back();
      ahead.pop_back();
    } else {
      tok = sample_token(dec.decode(tok).f32(), V, opt, rng);
    }
  }
  return out;
}

std::vector<int32_t> generate(const ZayaModel& model, const std::vector<int32_t>& prompt,
                              int64_t max_new, const SamplingOptions& opt, int32_t stop_id,
                              const std::function<void(int32_t)>& on_token) {
  CpuDecoder dec(model, std::max<int64_t>(1, int64_t(prompt.size()) + max_new));
  return generate(dec, prompt, max_new, opt, stop_id, on_token);
}

EvalResult evaluate(Decoder& dec, const std::vector<int32_t>& ids, int64_t window) {
  ZAYA_CHECK(ids.size() >= 2, "evaluate: need at least 2 tokens to score next-token prediction");
  const int64_t n = int64_t(ids.size());
  const int64_t w = window > 1 ? window : n;
  double total = 0;
  int64_t count = 0;
  for (int64_t s = 0; s + 1 < n; s += w) {
    const int64_t len = std::min(w, n - s);
    if (len < 2) break;
    std::vector<int32_t> win(ids.begin() + s, ids.begin() + s + len);
    total += dec.loss(win) * double(len - 1);
    count += len - 1;
  }
  return {total / double(count), count};
}

}  // namespace zaya
