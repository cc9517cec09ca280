// The model optimizer of ZAYA1.md §4: AdamW and Muon over one list of named fp32 parameters, with
// rules (param_rules.h) deciding which parameter each one trains. fp32 CPU reference: the update
// formulas here are the spec the GPU path must match. Deliberately not here: gradient clipping and
// accumulation (grad_utils.h), the learning-rate schedule (schedule.h; the loop passes the step's
// lr to step()), the balancing-bias update (balancing.h), ZeRO sharding (dist/).
//
// AdamW (decoupled decay, bias-corrected), step t = 1, 2, ...:
//   m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²
//   w ← w·(1 − lr·wd) − lr · (m/(1−β1^t)) / (√(v/(1−β2^t)) + ε)
// Muon, per matrix W [rows, cols] (a 3-D expert tensor [E, out, in] is E matrices):
//   buf ← μ buf + g;  u = g + μ buf (Nesterov) or buf;  O = NewtonSchulz5(u)
//   w ← w·(1 − lr·wd) − lr · 0.2·√max(rows, cols) · O
// lr is the schedule's lr times the parameter's lr multiplier.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "optim/param.h"
#include "optim/param_rules.h"

namespace zaya {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
};

struct MuonSettings {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double rms_scale = 0.2;  // update scaled by rms_scale·√max(rows, cols): AdamW-like update RMS
};

struct OptimizerSettings {
  double weight_decay = 0.1;  // default for rules that do not set their own
  AdamWSettings adamw;
  MuonSettings muon;
  std::vector<ParamRule> rules;  // tried first, in order
  bool default_rules = true;     // then default_param_rules()
  // Throws zaya::Error naming `where`.field for out-of-range values.
  void validate(const std::string& where = "optim") const;
  std::vector<ParamRule> effective_rules() const;
};

// One AdamW update of n contiguous elements at step t >= 1 (exposed for tests and for the GPU
// path to check against).
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr, double wd,
                  const AdamWSettings& s, int64_t t);
// One Muon update of one [rows, cols] matrix; `scratch` must hold rows*cols floats.
void muon_update(float* w, const float* g, float* buf, int64_t rows, int64_t cols, double lr,
                 double wd, const MuonSettings& s, float* scratch);

class Optimizer {
 public:
  struct Entry {
    ParamRef param;
    ParamAssignment assignment;
    Tensor exp_avg, exp_avg_sq;  // AdamW state
    Tensor momentum;             // Muon state
    size_t param_index = 0;      // position in the constructor's parameter list
  };

  // Balancing biases in `params` are skipped (no grad needed); parameters assigned "none" keep no
  // state. Throws zaya::Error for a bad parameter (dtype, shape mismatch) or a Muon assignment to a
  // tensor that is not 2-D or 3-D, or a duplicate name.
  Optimizer(const std::vector<ParamRef>& params, OptimizerSettings settings);

  // Applies one update to every trained parameter with learning rate lr·lr_mult.
  void step(double lr);
  // The same update restricted to the parameters p with owned[p] (indices into the constructor's
  // list; a data-parallel rank updates the parameters it owns). The step count advances as in
  // step(), so every rank's bias corrections agree.
  void step(double lr, const std::vector<bool>& owned);
  int64_t steps() const { return steps_; }
  // Matrices Newton–Schulz-orthogonalised by the last step (E per 3-D expert tensor).
  int64_t muon_matrices_last_step() const { return muon_matrices_last_; }

  const std::vector<Entry>& entries() const { return entries_; }
  const OptimizerSettings& settings() const { return settings_; }
  // A human-readable table: parameter, shape, optimizer, lr multiplier, weight decay, rule.
  std::string describe() const;

  // Views of the state tensors (they share storage with the optimizer; copy them when saving
  // asynchronously). Names: optim.adamw.exp_avg.<param>, optim.adamw.exp_avg_sq.<param>,
  // optim.muon.momentum.<param>.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // Copies a saved state in (every expected tensor must be present with its shape; unknown names
  // are errors) and sets the step count, so the next step() continues bit-exactly.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps);

 private:
  OptimizerSettings settings_;
  std::vector<Entry> entries_;
  size_t n_params_ = 0;
  int64_t steps_ = 0;
  int64_t muon_matrices_last_ = 0;
};

}  // namespace zaya
