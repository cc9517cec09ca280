// Sampling the next token from a row of logits: greedy, or temperature with optional top-k and
// top-p (nucleus) truncation, from a seeded counter-based RNG. The generation loop that uses it,
// over any device, is engine/decoder.h's generate().
#pragma once
#include <cstdint>

#include "core/rng.h"

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

}  // namespace zaya
