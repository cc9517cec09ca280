// Megatron's greedy blending rule and the --data-path style blend parser (see blend.h).
#include "data/blend.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace zaya {

std::vector<double> normalize_weights(const std::vector<double>& weights) {
  ZAYA_CHECK(!weights.empty(), "blend: no datasets given");
  double sum = 0;
  for (size_t i = 0; i < weights.size(); i++) {
    ZAYA_CHECK(std::isfinite(weights[i]) && weights[i] >= 0,
               "blend: weight {} of dataset {} must be finite and >= 0", weights[i], i);
    sum += weights[i];
  }
  ZAYA_CHECK(sum > 0, "blend: weights sum to {}, expected a positive sum", sum);
  std::vector<double> w(weights.size());
  for (size_t i = 0; i < w.size(); i++) w[i] = weights[i] / sum;
  return w;
}

Blender::Blender(const std::vector<double>& weights)
    : w_(normalize_weights(weights)), counts_(w_.size(), 0) {}

int Blender::next() {
  const double g = std::max(double(total_), 1.0);
  int best = 0;
  double best_err = w_[0] * g - double(counts_[0]);
  for (size_t i = 1; i < w_.size(); i++) {
    const double err = w_[i] * g - double(counts_[i]);
    if (err > best_err) best_err = err, best = int(i);
  }
  counts_[best]++;
  total_++;
  return best;
}

void Blender::restore(const std::vector<int64_t>& counts) {
  ZAYA_CHECK(counts.size() == w_.size(), "blend: cursor has {} dataset counts, the blend has {}",
             counts.size(), w_.size());
  int64_t t = 0;
  for (size_t i = 0; i < counts.size(); i++) {
    ZAYA_CHECK(counts[i] >= 0, "blend: cursor count {} of dataset {} is negative", counts[i], i);
    t += counts[i];
  }
  counts_ = counts;
  total_ = t;
}

std::vector<WeightedPrefix> parse_blend(const std::string& spec) {
  std::string s = spec;
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream in(s);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  ZAYA_CHECK(!words.empty(), "blend \"{}\": no datasets given", spec);
  auto as_number = [](const std::string& w, double* v) {
    char* end = nullptr;
    *v = std::strtod(w.c_str(), &end);
    return end && *end == '\0' && end != w.c_str();
  };
  std::vector<WeightedPrefix> out;
  double v;
  if (!as_number(words[0], &v)) {
    for (const auto& w : words) {
      ZAYA_CHECK(!as_number(w, &v),
                 "blend \"{}\": mixes bare prefixes and weights (\"{}\"); write either "
                 "\"prefix ...\" or \"weight prefix ...\"",
                 spec, w);
      out.push_back({1.0, w});
    }
    return out;
  }
  ZAYA_CHECK(words.size() % 2 == 0,
             "blend \"{}\": expected pairs \"weight prefix\", found {} words", spec, words.size());
  for (size_t i = 0; i < words.size(); i += 2) {
    ZAYA_CHECK(as_number(words[i], &v), "blend \"{}\": \"{}\" (word {}) is not a weight", spec,
               words[i], i + 1);
    out.push_back({v, words[i + 1]});
  }
  std::vector<double> w;
  for (auto& e : out) w.push_back(e.weight);
  normalize_weights(w);  // validates
  return out;
}

}  // namespace zaya
