// The aux-loss-free load-balancing update of ZAYA1.md §3.2. After each optimizer step, for each MoE
// layer, given how many of the step's tokens (over all data-parallel ranks) the router sent to each
// of the E routed experts and to the skip class (index E):
//   total = Σ_{e=0..E} count_e          (skipped tokens count in the total)
//   err_e = count_e/total − 1/E          for e < E
// and the layer's balancing bias b[0..E-1] takes an AdamW step with err as its gradient
// (defaults lr 1e-3, β 0.9/0.999, ε 1e-8, no weight decay, bias-corrected), so an under-used expert
// (err < 0) gets a larger bias and wins more argmax ties. b[E], the skip class, is never updated;
// it starts at −1 (init_balancing_biases). Because skipped tokens are in the total, Σ err_e = −skip
// fraction ≤ 0: the routed biases drift up together against the fixed skip bias, a pressure against
// skipping. State is kept here, apart from the model optimizer's. Not here: counting (the MoE
// forward) and the all-reduce of counts (dist/).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "optim/param.h"

namespace zaya {

struct BalancingSettings {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool enabled = true;
  void validate(const std::string& where = "optim.balancing") const;
};

constexpr float kSkipBiasInit = -1.0f;
// Sets a [E+1] balancing-bias tensor to its initial value: 0 for routed experts, −1 for skip.
void init_balancing_biases(const Tensor& biases);

class BalancingBiasUpdater {
 public:
  // One entry per MoE layer: (name, fp32 host tensor [E+1]), in layer order. Updated in place.
  BalancingBiasUpdater(std::vector<std::pair<std::string, Tensor>> biases,
                       BalancingSettings settings = {});
  // Picks every parameter whose name ends in "balancing_biases", in list order.
  static BalancingBiasUpdater from_params(const std::vector<ParamRef>& params,
                                          BalancingSettings settings = {});

  size_t layers() const { return biases_.size(); }
  const std::string& name(size_t layer) const { return biases_.at(layer).first; }
  // counts[layer] holds E+1 token counts (routed experts, then skip) summed over all ranks.
  // One call is one step for every layer. Does nothing but count the step when disabled.
  void update(const std::vector<std::vector<int64_t>>& counts);
  int64_t steps() const { return steps_; }

  // Names: balance.exp_avg.<name>, balance.exp_avg_sq.<name> (each [E], views).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps);

 private:
  BalancingSettings settings_;
  std::vector<std::pair<std::string, Tensor>> biases_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

}  // namespace zaya
