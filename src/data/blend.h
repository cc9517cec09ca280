// Weighted blends of datasets, chosen sample by sample with Megatron-LM's deterministic rule
// (megatron/core/datasets/helpers.cpp, build_blending_indices): sample g goes to the dataset whose
// realised count lags its target weight·max(g, 1) the most, ties to the lowest index. No random
// numbers are involved, so the choice depends only on the weights and the counts so far, and after
// g samples every |count_i - w_i·g| stays within about one sample.
//
// Deliberately not here: Megatron's "exhaustive" variant (sample each dataset to exhaustion) and
// per-split weights; the loader applies one blend to one split.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zaya {

// Weights divided by their sum. Every weight must be finite and >= 0 and the sum > 0 (an Error
// names the offending index and value).
std::vector<double> normalize_weights(const std::vector<double>& weights);

class Blender {
 public:
  explicit Blender(const std::vector<double>& weights);
  // The dataset for the next sample; advances the state.
  int next();
  // The state: samples chosen so far in total and per dataset. restore() takes counts that must
  // sum to the total (it does not replay; any counts are a valid state of the rule).
  int64_t total() const { return total_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  void restore(const std::vector<int64_t>& counts);
  const std::vector<double>& weights() const { return w_; }

 private:
  std::vector<double> w_;
  std::vector<int64_t> counts_;
  int64_t total_ = 0;
};

// A blend written as Megatron's --data-path: "w1 prefix1 w2 prefix2 ..." or bare prefixes
// (equal weights). Entries are split on whitespace or commas.
struct WeightedPrefix {
  double weight = 1.0;
  std::string prefix;
};
std::vector<WeightedPrefix> parse_blend(const std::string& spec);

}  // namespace zaya
