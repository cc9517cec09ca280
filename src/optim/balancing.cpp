// Aux-loss-free balancing-bias update; see balancing.h.
#include "optim/balancing.h"

#include <cmath>
#include <map>

#include "core/error.h"
#include "optim/param_rules.h"

namespace zaya {

void BalancingSettings::validate(const std::string& where) const {
  ZAYA_CHECK(std::isfinite(lr) && lr >= 0, "{}.lr must be a finite number >= 0, found {}", where,
             lr);
  ZAYA_CHECK(beta1 >= 0 && beta1 < 1, "{}.betas[0] must be in [0, 1), found {}", where, beta1);
  ZAYA_CHECK(beta2 >= 0 && beta2 < 1, "{}.betas[1] must be in [0, 1), found {}", where, beta2);
  ZAYA_CHECK(eps > 0 && std::isfinite(eps), "{}.eps must be > 0, found {}", where, eps);
}

static void check_bias(const std::string& name, const Tensor& t) {
  ZAYA_CHECK(t.defined() && t.dtype() == DType::F32 && t.device() == Device::CPU &&
                 t.is_contiguous() && !t.read_only(),
             "balancing biases '{}' must be a writable contiguous F32 host tensor", name);
  ZAYA_CHECK(t.dim() == 1 && t.size(0) >= 2,
             "balancing biases '{}' must have shape [E+1] with E >= 1, found {}", name,
             shape_str(t.shape()));
}

void init_balancing_biases(const Tensor& biases) {
  check_bias("(init)", biases);
  float* b = biases.f32();
  const int64_t n = biases.numel();
  for (int64_t i = 0; i + 1 < n; i++) b[i] = 0.0f;
  b[n - 1] = kSkipBiasInit;
}

BalancingBiasUpdater::BalancingBiasUpdater(std::vector<std::pair<std::string, Tensor>> biases,
                                           BalancingSettings settings)
    : settings_(settings), biases_(std::move(biases)) {
  settings_.validate();
  for (const auto& [name, t] : biases_) {
    check_bias(name, t);
    exp_avg_.push_back(Tensor::zeros({t.size(0) - 1}));
    exp_avg_sq_.push_back(Tensor::zeros({t.size(0) - 1}));
  }
}

BalancingBiasUpdater BalancingBiasUpdater::from_params(const std::vector<ParamRef>& params,
                                                       BalancingSettings settings) {
  std::vector<std::pair<std::string, Tensor>> b;
  for (const auto& p : params)
    if (is_balancing_bias(p.name)) b.emplace_back(p.name, p.value);
  return BalancingBiasUpdater(std::move(b), settings);
}

void BalancingBiasUpdater::update(const std::vector<std::vector<int64_t>>& counts) {
  ZAYA_CHECK(counts.size() == biases_.size(),
             "balancing update: got token counts for {} layers, expected {}", counts.size(),
             biases_.size());
  // Validate every layer before touching any state.
  for (size_t l = 0; l < counts.size(); l++) {
    const int64_t classes = biases_[l].second.size(0);
    ZAYA_CHECK(int64_t(counts[l].size()) == classes,
               "balancing update: layer {} ('{}') has {} counts, expected {} (E routed + skip)", l,
               biases_[l].first, counts[l].size(), classes);
    int64_t total = 0;
    for (int64_t c : counts[l]) {
      ZAYA_CHECK(c >= 0, "balancing update: layer {} has a negative count {}", l, c);
      total += c;
    }
    ZAYA_CHECK(total > 0, "balancing update: layer {} ('{}') saw no tokens", l, biases_[l].first);
  }
  const int64_t t = steps_ + 1;
  steps_ = t;
  if (!settings_.enabled) return;
  const double bc1 = 1.0 - std::pow(settings_.beta1, double(t));
  const double bc2 = 1.0 - std::pow(settings_.beta2, double(t));
  for (size_t l = 0; l < counts.size(); l++) {
    const int64_t E = biases_[l].second.size(0) - 1;
    int64_t total = 0;
    for (int64_t c : counts[l]) total += c;
    float* b = biases_[l].second.f32();
    float* m = exp_avg_[l].f32();
    float* v = exp_avg_sq_[l].f32();
    for (int64_t e = 0; e < E; e++) {
      // Tiny vectors: the state update is done in double and stored as fp32.
      const double err = double(counts[l][size_t(e)]) / double(total) - 1.0 / double(E);
      const double mi = settings_.beta1 * m[e] + (1.0 - settings_.beta1) * err;
      const double vi = settings_.beta2 * v[e] + (1.0 - settings_.beta2) * err * err;
      m[e] = float(mi);
      v[e] = float(vi);
      b[e] = float(b[e] - settings_.lr * (mi / bc1) / (std::sqrt(vi / bc2) + settings_.eps));
    }
  }
}

std::vector<std::pair<std::string, Tensor>> BalancingBiasUpdater::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t l = 0; l < biases_.size(); l++) {
    out.emplace_back("balance.exp_avg." + biases_[l].first, exp_avg_[l]);
    out.emplace_back("balance.exp_avg_sq." + biases_[l].first, exp_avg_sq_[l]);
  }
  return out;
}

void BalancingBiasUpdater::load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                                      int64_t steps) {
  ZAYA_CHECK(steps >= 0, "balancing state: step count must be >= 0, found {}", steps);
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state)
    ZAYA_CHECK(given.emplace(name, &t).second, "balancing state: '{}' appears twice", name);
  auto mine = state_tensors();
  for (const auto& [name, dst] : mine) {
    auto it = given.find(name);
    ZAYA_CHECK(it != given.end(), "balancing state: '{}' is missing", name);
    ZAYA_CHECK(it->second->shape() == dst.shape() && it->second->dtype() == DType::F32,
               "balancing state: '{}' must be F32 of shape {}, found {} {}", name,
               shape_str(dst.shape()), dtype_name(it->second->dtype()),
               shape_str(it->second->shape()));
  }
  for (const auto& kv : given) {
    bool known = false;
    for (const auto& m : mine) known = known || m.first == kv.first;
    ZAYA_CHECK(known, "balancing state: unexpected tensor '{}'", kv.first);
  }
  for (auto& [name, dst] : mine) {
    Tensor d = dst;
    d.copy_from(*given.at(name));
  }
  steps_ = steps;
}

}  // namespace zaya
