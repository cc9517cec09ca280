// AdamW and Muon; formulas in optimizer.h.
#include "optim/optimizer.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "core/parallel.h"
#include "optim/newton_schulz.h"

namespace zaya {

void check_param(const ParamRef& p, const char* who) {
  ZAYA_CHECK(p.value.defined(), "{}: parameter '{}' has no value tensor", who, p.name);
  ZAYA_CHECK(p.grad.defined(), "{}: parameter '{}' has no gradient tensor", who, p.name);
  for (const Tensor* t : {&p.value, &p.grad}) {
    const char* what = t == &p.value ? "value" : "gradient";
    ZAYA_CHECK(t->dtype() == DType::F32, "{}: {} of '{}' must be F32, found {}", who, what, p.name,
               dtype_name(t->dtype()));
    ZAYA_CHECK(t->device() == Device::CPU, "{}: {} of '{}' must be in host memory", who, what,
               p.name);
    ZAYA_CHECK(t->is_contiguous(), "{}: {} of '{}' must be contiguous", who, what, p.name);
  }
  ZAYA_CHECK(!p.value.read_only(), "{}: value of '{}' is read-only (a memory map?)", who, p.name);
  ZAYA_CHECK(p.value.shape() == p.grad.shape(), "{}: '{}' has value shape {} but gradient shape {}",
             who, p.name, shape_str(p.value.shape()), shape_str(p.grad.shape()));
}

void OptimizerSettings::validate(const std::string& where) const {
  auto in01 = [&](const char* f, double v) {
    ZAYA_CHECK(v >= 0 && v < 1, "{}.{} must be in [0, 1), found {}", where, f, v);
  };
  ZAYA_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
             "{}.weight_decay must be a finite number >= 0, found {}", where, weight_decay);
  in01("betas[0]", adamw.beta1);
  in01("betas[1]", adamw.beta2);
  ZAYA_CHECK(adamw.eps > 0 && std::isfinite(adamw.eps), "{}.eps must be > 0, found {}", where,
             adamw.eps);
  in01("muon_momentum", muon.momentum);
  ZAYA_CHECK(muon.ns_steps >= 1 && muon.ns_steps <= 100,
             "{}.muon_ns_steps must be in [1, 100], found {}", where, muon.ns_steps);
  ZAYA_CHECK(muon.rms_scale > 0 && std::isfinite(muon.rms_scale),
             "{}.muon_rms_scale must be > 0, found {}", where, muon.rms_scale);
  for (size_t i = 0; i < rules.size(); i++)
    validate_param_rule(rules[i], fmt::format("{}.rules.{}", where, i));
}

std::vector<ParamRule> OptimizerSettings::effective_rules() const {
  std::vector<ParamRule> r = rules;
  if (default_rules) {
    auto d = default_param_rules();
    r.insert(r.end(), d.begin(), d.end());
  }
  return r;
}

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr, double wd,
                  const AdamWSettings& s, int64_t t) {
  ZAYA_ASSERT(t >= 1);
  // Scalars are formed in double and rounded once; the per-element work is fp32 like the GPU's.
  const float b1 = float(s.beta1), b2 = float(s.beta2);
  const float c1 = float(1.0 - s.beta1), c2 = float(1.0 - s.beta2);
  const float decay = float(1.0 - lr * wd);
  const float step_size = float(lr / (1.0 - std::pow(s.beta1, double(t))));
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(1.0 - std::pow(s.beta2, double(t))));
  const float eps = float(s.eps);
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) {
          const float gi = g[i];
          const float mi = b1 * m[i] + c1 * gi;
          const float vi = b2 * v[i] + c2 * gi * gi;
          m[i] = mi;
          v[i] = vi;
          w[i] = w[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
        }
      },
      1 << 14);
}

void muon_update(float* w, const float* g, float* buf, int64_t rows, int64_t cols, double lr,
                 double wd, const MuonSettings& s, float* scratch) {
  const int64_t n = rows * cols;
  const float mu = float(s.momentum);
  for (int64_t i = 0; i < n; i++) {
    buf[i] = mu * buf[i] + g[i];
    scratch[i] = s.nesterov ? g[i] + mu * buf[i] : buf[i];
  }
  newton_schulz_orthogonalize(scratch, rows, cols, s.ns_steps);
  const float decay = float(1.0 - lr * wd);
  const float step = float(lr * s.rms_scale * std::sqrt(double(std::max(rows, cols))));
  for (int64_t i = 0; i < n; i++) w[i] = w[i] * decay - step * scratch[i];
}

Optimizer::Optimizer(const std::vector<ParamRef>& params, OptimizerSettings settings)
    : settings_(std::move(settings)) {
  settings_.validate();
  const auto rules = settings_.effective_rules();
  std::set<std::string> seen;
  n_params_ = params.size();
  for (size_t pi = 0; pi < params.size(); pi++) {
    const ParamRef& p = params[pi];
    ZAYA_CHECK(seen.insert(p.name).second, "optimizer: parameter '{}' appears twice", p.name);
    if (is_balancing_bias(p.name)) continue;
    check_param(p, "optimizer");
    Entry e{p, assign_param(p.name, p.value.shape(), rules, settings_.weight_decay), {}, {}, {},
            pi};
    if (e.assignment.optimizer == OptimizerKind::Muon) {
      ZAYA_CHECK(p.value.dim() == 2 || p.value.dim() == 3,
                 "optimizer: rule '{}' sends '{}' (shape {}) to Muon, which needs a 2-D matrix or "
                 "a 3-D stack of matrices",
                 e.assignment.rule >= 0 ? rules[size_t(e.assignment.rule)].pattern : "(by rank)",
                 p.name, shape_str(p.value.shape()));
      e.momentum = Tensor::zeros(p.value.shape());
    } else if (e.assignment.optimizer == OptimizerKind::AdamW) {
      e.exp_avg = Tensor::zeros(p.value.shape());
      e.exp_avg_sq = Tensor::zeros(p.value.shape());
    }
    entries_.push_back(std::move(e));
  }
}

void Optimizer::step(double lr) {
  step(lr, std::vector<bool>());
}

void Optimizer::step(double lr, const std::vector<bool>& owned) {
  ZAYA_CHECK(std::isfinite(lr) && lr >= 0,
             "optimizer: learning rate must be finite and >= 0, got {}", lr);
  ZAYA_CHECK(owned.empty() || owned.size() == n_params_,
             "optimizer: the ownership mask has {} entries for {} parameters", owned.size(),
             n_params_);
  const int64_t t = steps_ + 1;
  std::vector<float> scratch;
  int64_t orthogonalised = 0;
  for (auto& e : entries_) {
    if (!owned.empty() && !owned[e.param_index]) continue;
    const double plr = lr * e.assignment.lr_mult, wd = e.assignment.weight_decay;
    float* w = e.param.value.f32();
    const float* g = e.param.grad.f32();
    if (e.assignment.optimizer == OptimizerKind::AdamW) {
      adamw_update(w, g, e.exp_avg.f32(), e.exp_avg_sq.f32(), e.param.value.numel(), plr, wd,
                   settings_.adamw, t);
    } else if (e.assignment.optimizer == OptimizerKind::Muon) {
      const auto& s = e.param.value.shape();
      const int64_t mats = s.size() == 3 ? s[0] : 1;
      const int64_t rows = s[s.size() - 2], cols = s[s.size() - 1], sz = rows * cols;
      scratch.resize(size_t(sz));
      float* buf = e.momentum.f32();
      for (int64_t k = 0; k < mats; k++)
        muon_update(w + k * sz, g + k * sz, buf + k * sz, rows, cols, plr, wd, settings_.muon,
                    scratch.data());
      orthogonalised += mats;
    }
  }
  steps_ = t;
  muon_matrices_last_ = orthogonalised;
}

std::string Optimizer::describe() const {
  std::string out = fmt::format("{:<64} {:>16} {:>6} {:>7} {:>7}  rule\n", "parameter", "shape",
                                "optim", "lr_mult", "wd");
  const auto rules = settings_.effective_rules();
  for (const auto& e : entries_) {
    const auto& a = e.assignment;
    std::string rule = a.rule >= 0 ? rules[size_t(a.rule)].pattern : "(by rank)";
    out += fmt::format("{:<64} {:>16} {:>6} {:>7g} {:>7g}  {}\n", e.param.name,
                       shape_str(e.param.value.shape()), optimizer_kind_name(a.optimizer),
                       a.lr_mult, a.weight_decay, rule);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& e : entries_) {
    if (e.exp_avg.defined()) {
      out.emplace_back("optim.adamw.exp_avg." + e.param.name, e.exp_avg);
      out.emplace_back("optim.adamw.exp_avg_sq." + e.param.name, e.exp_avg_sq);
    }
    if (e.momentum.defined()) out.emplace_back("optim.muon.momentum." + e.param.name, e.momentum);
  }
  return out;
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                           int64_t steps) {
  ZAYA_CHECK(steps >= 0, "optimizer state: step count must be >= 0, found {}", steps);
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    ZAYA_CHECK(given.emplace(name, &t).second, "optimizer state: '{}' appears twice", name);
  }
  // Validate everything before copying anything, so a bad state leaves the optimizer untouched.
  auto mine = state_tensors();
  for (const auto& [name, dst] : mine) {
    auto it = given.find(name);
    ZAYA_CHECK(it != given.end(),
               "optimizer state: '{}' is missing (was the checkpoint written with other "
               "optimizer rules?)",
               name);
    const Tensor& src = *it->second;
    ZAYA_CHECK(src.shape() == dst.shape(), "optimizer state: '{}' has shape {}, expected {}", name,
               shape_str(src.shape()), shape_str(dst.shape()));
    ZAYA_CHECK(src.dtype() == DType::F32 && src.device() == Device::CPU,
               "optimizer state: '{}' must be an F32 host tensor, found {}", name,
               dtype_name(src.dtype()));
  }
  if (given.size() != mine.size()) {
    std::set<std::string> expected;
    for (const auto& kv : mine) expected.insert(kv.first);
    for (const auto& kv : given)
      ZAYA_CHECK(expected.count(kv.first), "optimizer state: unexpected tensor '{}'", kv.first);
  }
  for (auto& [name, dst] : mine) {
    Tensor d = dst;
    d.copy_from(*given.at(name));
  }
  steps_ = steps;
}

}  // namespace zaya
