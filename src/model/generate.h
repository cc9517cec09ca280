// Text generation on a ZayaModel: prefill the prompt in one pass, then decode one token at a time
// with the inference cache (K/V, convolution history, delayed value). Sampling: greedy, or
// temperature with optional top-k and top-p (nucleus) truncation, from a seeded counter-based RNG.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "model/zaya.h"

namespace zaya {

struct SamplingOptions {
  bool greedy = false;
  float temperature = 1.0f;
  int64_t top_k = 0;   // 0: no top-k truncation
  float top_p = 1.0f;  // 1: no nucleus truncation
  uint64_t seed = 0;
};

// Picks the next token from one row of logits. Ties in greedy mode go to the lowest id.
int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& opt, Rng& rng);

// Generates up to max_new tokens after `prompt`; stops early at `stop_id` (>= 0) and includes it.
// on_token (optional) is called with each new token as it is produced (for streaming output).
std::vector<int32_t> generate(const ZayaModel& model, const std::vector<int32_t>& prompt,
                              int64_t max_new, const SamplingOptions& opt, int32_t stop_id = -1,
                              const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace zaya
