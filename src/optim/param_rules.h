// Which optimizer trains which parameter. Rules are tried in order against the parameter's full
// Hugging Face name; the first match decides {optimizer, lr multiplier, weight decay}. A pattern is
// a glob ('*' matches any run of characters, dots included; '?' one character) matched against the
// whole name, or "re:<ECMAScript regex>" (also a whole-name match). Names no rule matches fall back
// by rank: 2-D → Muon unless the name mentions "embed", anything else → AdamW. Balancing biases
// (`*balancing_biases`) are never trained by gradient: they are excluded before any rule is tried
// and have their own update (balancing.h). This file knows names and shapes only, not the model.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace zaya {

enum class OptimizerKind { AdamW, Muon, None };         // None: frozen (not updated)
std::string_view optimizer_kind_name(OptimizerKind k);  // "adamw", "muon", "none"
// Parses "adamw" / "muon" / "none"; throws zaya::Error naming `where` otherwise.
OptimizerKind optimizer_kind_from_name(std::string_view s, const std::string& where);

struct ParamRule {
  std::string pattern;
  OptimizerKind optimizer = OptimizerKind::AdamW;
  double lr_mult = 1.0;
  std::optional<double> weight_decay;  // unset: the optimizer's default weight decay
};

// The project's defaults (ZAYA1.md §4); see docs/TRAINING.md for the table.
std::vector<ParamRule> default_param_rules();

struct ParamAssignment {
  OptimizerKind optimizer = OptimizerKind::AdamW;
  double lr_mult = 1.0;
  double weight_decay = 0.0;
  // Index of the matching rule in the list given to assign_param; kByRank when none matched,
  // kBalancingBias for the excluded balancing biases.
  int rule = -1;
  static constexpr int kByRank = -1;
  static constexpr int kBalancingBias = -2;
};

bool is_balancing_bias(const std::string& name);
bool glob_match(std::string_view pattern, std::string_view name);
// True when the rule's pattern (glob or "re:" regex) matches the whole name.
bool rule_matches(const ParamRule& rule, const std::string& name);
// Throws zaya::Error (naming `where`) for an empty pattern, a regex that does not compile, a
// negative or non-finite lr_mult or weight decay.
void validate_param_rule(const ParamRule& rule, const std::string& where);

ParamAssignment assign_param(const std::string& name, const Shape& shape,
                             const std::vector<ParamRule>& rules, double default_weight_decay);

}  // namespace zaya
