// Parameter → optimizer rules; see param_rules.h.
#include "optim/param_rules.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>
#include <vector>

#include "core/error.h"

namespace zaya {

std::string_view optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamW: return "adamw";
    case OptimizerKind::Muon: return "muon";
    case OptimizerKind::None: return "none";
  }
  return "?";
}

OptimizerKind optimizer_kind_from_name(std::string_view s, const std::string& where) {
  if (s == "adamw") return OptimizerKind::AdamW;
  if (s == "muon") return OptimizerKind::Muon;
  if (s == "none") return OptimizerKind::None;
  fail("{}: unknown optimizer '{}' (expected adamw, muon or none)", where, s);
}

std::vector<ParamRule> default_param_rules() {
  const std::optional<double> no_decay = 0.0, inherit;
  auto r = [](const char* p, OptimizerKind k, std::optional<double> wd) {
    return ParamRule{p, k, 1.0, wd};
  };
  const auto A = OptimizerKind::AdamW, M = OptimizerKind::Muon;
  return {
      // Embedding (and the LM head, tied to it by default): AdamW, as in ZAYA1.md §4.
      r("model.embed_tokens.*", A, inherit),
      r("lm_head.*", A, inherit),
      // Convolutions are small 3-D filters, not matrices to orthogonalise.
      r("*.conv_qk_*", A, no_decay),
      // Attention projections.
      r("*.q_proj.weight", M, inherit),
      r("*.k_proj.weight", M, inherit),
      r("*.v_proj_current.weight", M, inherit),
      r("*.v_proj_delayed.weight", M, inherit),
      r("*.o_proj.weight", M, inherit),
      // Router matrices.
      r("*.mlp.gate.down_proj.weight", M, inherit),
      r("*.router_mlp.fc1.weight", M, inherit),
      r("*.router_mlp.fc2.weight", M, inherit),
      r("*.router_mlp.out_proj.weight", M, inherit),
      // Experts [E, out, in]: each expert's matrix is orthogonalised on its own.
      r("*.mlp.experts.gate_up_proj", M, inherit),
      r("*.mlp.experts.down_proj", M, inherit),
      // Vectors: norms, biases, residual scales/biases, router state scales, QK temperatures.
      // Decaying
      // them towards 0 would fight their role (a scale of 0 switches a path off), so no decay.
      r("*norm.weight", A, no_decay),
      r("*.bias", A, no_decay),
      r("*_bias", A, no_decay),
      r("*_scale", A, no_decay),
      r("*.temp", A, no_decay),
  };
}

bool is_balancing_bias(const std::string& name) {
  static const std::string suffix = "balancing_biases";
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative wildcard match with one backtrack point (the last '*'): linear in practice.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      pi++, si++;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') pi++;
  return pi == p.size();
}

static bool is_regex(const std::string& pattern) {
  return pattern.rfind("re:", 0) == 0;
}

namespace {

// std::regex compiles and matches recursively and expands counted repetitions ({n,m}) into copies,
// so a pattern of deeply nested groups overflows the stack and one of nested counts asks for
// billions of states. Parameter patterns need neither; bound both before std::regex sees them.
constexpr size_t kMaxRegexLength = 1000;
constexpr size_t kMaxRegexNesting = 16;
constexpr int64_t kMaxRegexRepeat = 1000;
constexpr int64_t kMaxRegexStates = 10000;

void check_regex_size(const std::string& re, const std::string& where) {
  const auto bad = [&](const std::string& why) {
    fail("{}: pattern 're:{}' is too complex for a parameter rule: {}", where,
         re.size() > 60 ? re.substr(0, 57) + "..." : re, why);
  };
  if (re.size() > kMaxRegexLength)
    bad(fmt::format("{} characters (at most {})", re.size(), kMaxRegexLength));
  // Per open group: states so far, and the states of the last atom (what a quantifier repeats).
  struct Group {
    int64_t total = 0, last = 0;
  };
  std::vector<Group> stack(1);
  const auto atom = [&](int64_t n) {
    stack.back().total += n;
    stack.back().last = n;
    if (stack.back().total > kMaxRegexStates)
      bad(fmt::format("it expands to more than {} states", kMaxRegexStates));
  };
  for (size_t i = 0; i < re.size(); i++) {
    const char c = re[i];
    if (c == '\\') {
      // A backreference \N: std::regex reads every digit after it into an int (a long run
      // overflows inside the library), so bound the run; parameter patterns need none.
      size_t j = i + 1;
      if (j < re.size() && re[j] >= '1' && re[j] <= '9') {
        while (j < re.size() && std::isdigit(uint8_t(re[j]))) j++;
        if (j - (i + 1) > 3) bad(fmt::format("a backreference of {} digits", j - (i + 1)));
        i = j - 1;
      } else {
        i++;
      }
      atom(1);
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < re.size() && re[j] == '^') j++;
      if (j < re.size() && re[j] == ']') j++;
      while (j < re.size() && re[j] != ']') j += re[j] == '\\' ? 2 : 1;
      i = j;
      atom(1);
    } else if (c == '(') {
      if (stack.size() > kMaxRegexNesting)
        bad(fmt::format("groups nest deeper than {} levels", kMaxRegexNesting));
      stack.emplace_back();
    } else if (c == ')' && stack.size() > 1) {
      const int64_t n = stack.back().total + 1;
      stack.pop_back();
      atom(n);
    } else if (c == '|') {
      stack.back().last = 0;
    } else if (c == '{') {
      // {n}, {n,} or {n,m}: the last atom is copied max(n, m) (or n + 1) times.
      size_t j = i + 1;
      int64_t n = 0, m = -1, *cur = &n;
      bool digits = false;
      for (; j < re.size() && (std::isdigit(uint8_t(re[j])) || (re[j] == ',' && cur == &n)); j++) {
        if (re[j] == ',') {
          cur = &m;
          m = 0;
          continue;
        }
        digits = true;
        *cur = *cur * 10 + (re[j] - '0');
        if (*cur > kMaxRegexRepeat)
          bad(fmt::format("a repetition count above {}", kMaxRegexRepeat));
      }
      if (!digits || j >= re.size() || re[j] != '}') {
        atom(1);  // not a quantifier: std::regex decides whether it is an error
        continue;
      }
      const int64_t copies = std::max(n, m) + 1;
      const int64_t last = stack.back().last;
      stack.back().last = 0;
      atom(last * copies);
      i = j;
    } else {
      atom(1);
    }
  }
}

}  // namespace

bool rule_matches(const ParamRule& rule, const std::string& name) {
  if (is_regex(rule.pattern)) {
    // Compiled per call: rules are matched once per parameter when the optimizer is built.
    check_regex_size(rule.pattern.substr(3), "parameter rule");
    return std::regex_match(name, std::regex(rule.pattern.substr(3), std::regex::ECMAScript));
  }
  return glob_match(rule.pattern, name);
}

void validate_param_rule(const ParamRule& rule, const std::string& where) {
  ZAYA_CHECK(!rule.pattern.empty() && rule.pattern != "re:", "{}: pattern must not be empty",
             where);
  if (is_regex(rule.pattern)) {
    check_regex_size(rule.pattern.substr(3), where);
    try {
      std::regex re(rule.pattern.substr(3), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail("{}: pattern '{}' is not a valid regular expression ({})", where, rule.pattern,
           e.what());
    }
  }
  ZAYA_CHECK(std::isfinite(rule.lr_mult) && rule.lr_mult >= 0,
             "{}: lr_mult must be a finite number >= 0, found {}", where, rule.lr_mult);
  if (rule.weight_decay)
    ZAYA_CHECK(std::isfinite(*rule.weight_decay) && *rule.weight_decay >= 0,
               "{}: weight_decay must be a finite number >= 0, found {}", where,
               *rule.weight_decay);
}

ParamAssignment assign_param(const std::string& name, const Shape& shape,
                             const std::vector<ParamRule>& rules, double default_weight_decay) {
  ParamAssignment a;
  if (is_balancing_bias(name)) {
    a.optimizer = OptimizerKind::None;
    a.rule = ParamAssignment::kBalancingBias;
    return a;
  }
  for (size_t i = 0; i < rules.size(); i++) {
    if (!rule_matches(rules[i], name)) continue;
    a.optimizer = rules[i].optimizer;
    a.lr_mult = rules[i].lr_mult;
    a.weight_decay = rules[i].weight_decay.value_or(default_weight_decay);
    a.rule = int(i);
    return a;
  }
  a.optimizer = shape.size() == 2 && name.find("embed") == std::string::npos ? OptimizerKind::Muon
                                                                             : OptimizerKind::AdamW;
  a.weight_decay = default_weight_decay;
  a.rule = ParamAssignment::kByRank;
  return a;
}

}  // namespace zaya
