// MoE width sweeps and config proposals for `zaya size moe` and `zaya size propose`. Candidates
// are generated on a grid, kept when their parameter counts land within the budget's tolerance, and
// scored with the same cost model and rules as `zaya size check`.
#include "sizing/search.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/plot.h"

namespace zaya::sizing {

using nlohmann::json;

double parse_count(const std::string& flag, const std::string& text) {
  std::string t;
  for (char ch : text)
    if (ch != '_' && ch != ',') t += ch;
  ZAYA_CHECK(!t.empty(), "{}: expected a count like 8.3B, 760M or 4096, found an empty value",
             flag);
  // A trailing letter is a suffix; the rest must be a plain number.
  char suffix = 0;
  if (std::isalpha(static_cast<unsigned char>(t.back()))) {
    suffix = char(std::toupper(static_cast<unsigned char>(t.back())));
    t.pop_back();
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ZAYA_CHECK(used > 0 && used == t.size(),
             "{}: '{}' is not a number (expected a count like 8.3B, 760M or 4096)", flag, text);
  double mult = 1;
  switch (suffix) {
    case 0: break;
    case 'K': mult = 1e3; break;
    case 'M': mult = 1e6; break;
    case 'B':
    case 'G': mult = 1e9; break;
    case 'T': mult = 1e12; break;
    default:
      fail("{}: '{}' has an unknown suffix '{}' (expected K, M, B/G or T, e.g. 8.3B)", flag, text,
           text.back());
  }
  v *= mult;
  ZAYA_CHECK(v > 0 && std::isfinite(v), "{}: must be positive, found '{}'", flag, text);
  return v;
}

void Budget::validate() const {
  ZAYA_CHECK(total > 0, "--total must be positive, found {}", total);
  ZAYA_CHECK(active > 0, "--active must be positive, found {}", active);
  ZAYA_CHECK(active <= total, "--active ({:.4g}) must not exceed --total ({:.4g})", active, total);
  ZAYA_CHECK(tolerance > 0 && tolerance < 1, "--tolerance must be in (0, 1), found {}", tolerance);
}

bool Budget::fits(double t, double a) const {
  return std::abs(t - total) <= tolerance * total && std::abs(a - active) <= tolerance * active;
}

std::string Candidate::label() const {
  return fmt::format("D{} L{} E{} I{} k{}", config.hidden_size, config.num_hidden_layers,
                     config.num_experts, config.moe_intermediate_size, config.num_experts_per_tok);
}

Candidate evaluate_candidate(const ZayaConfig& c, const HardwareProfile& hw,
                             const SearchOptions& o) {
  validate_shape(c, "candidate");
  Candidate k;
  k.config = c;
  const ParamCounts p = count_params(c);
  k.total = p.total;
  k.active = p.active;
  k.within_budget = o.budget.fits(double(p.total), double(p.active));
  k.train = estimate_training(c, hw, o.check.train);
  k.infer = estimate_inference(c, hw, o.prompt, o.decode_context, o.check.decode_batch);
  for (const RuleResult& r : check_rules(c, hw, o.check)) {
    if (r.status == Status::Warn) ++k.warns;
    if (r.status == Status::Fail) ++k.fails;
    if (r.status != Status::Pass) k.warned.push_back(r.id);
  }
  return k;
}

void mark_pareto(std::vector<Candidate>& cs) {
  for (auto& a : cs) {
    a.pareto = true;
    for (auto& b : cs) {
      const bool ge = b.train.tokens_per_s >= a.train.tokens_per_s &&
                      b.infer.decode_s_per_token <= a.infer.decode_s_per_token;
      const bool gt = b.train.tokens_per_s > a.train.tokens_per_s ||
                      b.infer.decode_s_per_token < a.infer.decode_s_per_token;
      if (&a != &b && ge && gt) {
        a.pareto = false;
        break;
      }
    }
  }
}

namespace {

void sort_by_throughput(std::vector<Candidate>& cs) {
  std::stable_sort(cs.begin(), cs.end(), [](const Candidate& a, const Candidate& b) {
    return a.train.tokens_per_s > b.train.tokens_per_s;
  });
}

}  // namespace

std::vector<Candidate> moe_sweep(const ZayaConfig& base, const HardwareProfile& hw,
                                 const SearchOptions& o) {
  o.budget.validate();
  validate_shape(base, "base model");
  ZAYA_CHECK(o.width_step > 0 && o.width_max >= o.width_step, "expert width grid is empty");
  std::vector<Candidate> out;
  bool have_base = false;
  for (int64_t E : o.experts) {
    for (int64_t k : o.top_k) {
      if (k > E) continue;
      for (int64_t I = o.width_step; I <= o.width_max; I += o.width_step) {
        ZayaConfig c = base;
        c.num_experts = E, c.num_experts_per_tok = k, c.moe_intermediate_size = I;
        const ParamCounts p = count_params(c);
        if (!o.budget.fits(double(p.total), double(p.active))) continue;
        Candidate cand = evaluate_candidate(c, hw, o);
        if (E == base.num_experts && k == base.num_experts_per_tok &&
            I == base.moe_intermediate_size) {
          cand.reference = true;
          have_base = true;
        }
        out.push_back(std::move(cand));
      }
    }
  }
  if (!have_base) {  // show where the base sits even when it is outside this budget
    Candidate cand = evaluate_candidate(base, hw, o);
    cand.reference = true;
    out.push_back(std::move(cand));
  }
  // The front is over in-budget designs; an out-of-budget reference is not a competitor.
  std::vector<Candidate> in;
  for (auto& c : out)
    if (c.within_budget) in.push_back(c);
  mark_pareto(in);
  size_t j = 0;
  for (auto& c : out)
    if (c.within_budget) c.pareto = in[j++].pareto;
  sort_by_throughput(out);
  return out;
}

std::vector<Candidate> propose(const ZayaConfig& base, const HardwareProfile& hw,
                               const SearchOptions& o, size_t top) {
  o.budget.validate();
  std::vector<Candidate> out;
  for (int64_t D : o.hidden) {
    for (int64_t L : o.layers) {
      for (int64_t E : o.experts) {
        for (int64_t k : o.top_k) {
          if (k > E) continue;
          ZayaConfig c = base;
          c.layer_types.clear();  // depth changes; every layer "hybrid"
          c.hidden_size = D;
          c.num_hidden_layers = L;
          c.head_dim = 128;
          // CCA compresses queries to half the residual width, ZAYA1's ratio: Hq·d = D/2.
          c.num_attention_heads = std::max<int64_t>(2, D / 2 / c.head_dim);
          c.num_key_value_heads = 2;
          if (c.num_attention_heads % c.num_key_value_heads != 0) continue;
          c.num_experts = E;
          c.num_experts_per_tok = k;
          // Active parameters are affine in I: solve for the width, then round to the grid.
          c.moe_intermediate_size = 0;
          const double a0 = double(count_params(c).active);
          const double I = (o.budget.active - a0) / (double(L) * double(k) * 3.0 * double(D));
          const int64_t Ir = int64_t(std::llround(I / double(o.width_step))) * o.width_step;
          if (Ir < o.width_step) continue;
          if (double(Ir) < o.width_ratio_min * double(D) ||
              double(Ir) > o.width_ratio_max * double(D))
            continue;
          c.moe_intermediate_size = Ir;
          const ParamCounts p = count_params(c);
          if (!o.budget.fits(double(p.total), double(p.active))) continue;
          Candidate cand = evaluate_candidate(c, hw, o);
          if (cand.fails > 0) continue;
          cand.reference = D == base.hidden_size && L == base.num_hidden_layers &&
                           E == base.num_experts && k == base.num_experts_per_tok &&
                           Ir == base.moe_intermediate_size;
          out.push_back(std::move(cand));
        }
      }
    }
  }
  mark_pareto(out);
  sort_by_throughput(out);
  if (out.size() > top) out.resize(top);
  return out;
}

json candidates_to_json(const std::vector<Candidate>& cs) {
  json a = json::array();
  for (auto& c : cs)
    a.push_back({{"label", c.label()},
                 {"hidden_size", c.config.hidden_size},
                 {"num_hidden_layers", c.config.num_hidden_layers},
                 {"num_attention_heads", c.config.num_attention_heads},
                 {"num_key_value_heads", c.config.num_key_value_heads},
                 {"head_dim", c.config.head_dim},
                 {"num_experts", c.config.num_experts},
                 {"moe_intermediate_size", c.config.moe_intermediate_size},
                 {"num_experts_per_tok", c.config.num_experts_per_tok},
                 {"params_total", c.total},
                 {"params_active", c.active},
                 {"within_budget", c.within_budget},
                 {"reference", c.reference},
                 {"pareto", c.pareto},
                 {"train_tokens_per_s_per_gpu", c.train.tokens_per_s_per_gpu},
                 {"train_step_s", c.train.step_s},
                 {"mfu", c.train.mfu},
                 {"decode_ms_per_token", c.infer.decode_s_per_token * 1e3},
                 {"prefill_tokens_per_s", c.infer.prefill_tokens_per_s},
                 {"warns", c.warns},
                 {"fails", c.fails},
                 {"rules_not_passing", c.warned}});
  return a;
}

void write_moe_plot(const std::vector<Candidate>& cs, const std::string& hardware,
                    const std::string& path) {
  PlotSpec spec;
  spec.title =
      fmt::format("MoE width sweep on {}: training throughput vs decode latency", hardware);
  spec.xlabel = "decode latency per token (ms)";
  spec.ylabel = "training tokens/s per GPU";
  std::map<int64_t, PlotSeries> by_k;
  PlotSeries front{"Pareto front", {}, {}, true}, ref{"", {}, {}, false};
  std::vector<std::pair<double, double>> fpts;
  for (auto& c : cs) {
    const double x = c.infer.decode_s_per_token * 1e3, y = c.train.tokens_per_s_per_gpu;
    if (c.reference) {
      ref.label = fmt::format("reference E{}×{} top-{}", c.config.num_experts,
                              c.config.moe_intermediate_size, c.config.num_experts_per_tok);
      ref.x.push_back(x), ref.y.push_back(y);
    }
    if (!c.within_budget) continue;
    auto& s = by_k[c.config.num_experts_per_tok];
    s.label = fmt::format("top-{}", c.config.num_experts_per_tok);
    s.line = false;
    s.x.push_back(x), s.y.push_back(y);
    if (c.pareto) fpts.push_back({x, y});
  }
  std::sort(fpts.begin(), fpts.end());
  for (auto& [x, y] : fpts) front.x.push_back(x), front.y.push_back(y);
  for (auto& [k, s] : by_k) spec.series.push_back(s);
  if (!front.x.empty()) spec.series.push_back(front);
  if (!ref.x.empty()) spec.series.push_back(ref);
  write_svg(path, spec);
}

}  // namespace zaya::sizing
