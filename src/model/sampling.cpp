#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace zaya {

int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& opt, Rng& rng) {
  if (opt.greedy || opt.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (logits[v] > logits[best]) best = v;
    return int32_t(best);
  }
  ZAYA_CHECK(opt.top_p > 0.0f && opt.top_p <= 1.0f, "top_p must be in (0, 1], got {}", opt.top_p);
  ZAYA_CHECK(opt.top_k >= 0, "top_k must be >= 0, got {}", opt.top_k);
  // Candidates sorted by logit (descending, ties by id), truncated by top-k, then by top-p.
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  auto cmp = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  idx.resize(static_cast<size_t>(k));
  std::vector<double> p(idx.size());
  const double mx = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); i++) {
    p[i] = std::exp((double(logits[idx[i]]) - mx) / double(opt.temperature));
    sum += p[i];
  }
  size_t keep = idx.size();
  if (opt.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < idx.size(); i++) {
      acc += p[i] / sum;
      if (acc >= double(opt.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (size_t i = 0; i < keep; i++) total += p[i];
  double u = rng.uniform_double() * total;
  for (size_t i = 0; i < keep; i++) {
    u -= p[i];
    if (u < 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace zaya
