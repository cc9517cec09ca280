// Design-space searches for ZAYA-style MoE models under a total and an active parameter budget:
//  - moe_sweep: attention, router, depth and width fixed from a base config; number of experts,
//    expert width and top-k swept; each candidate gets predicted training throughput and decode
//    latency, and the Pareto front of the two is marked (ZAYA1 §5: large per-expert GEMMs for
//    training, few active experts for decode).
//  - propose: hidden size and depth swept too (head dim 128, CCA's Hq·d = D/2, 2 KV heads), expert
//    width solved from the active budget and kept within [D/4, 2D]; candidates that fail a rule
//    are dropped.
// Deliberately not here: choosing among the candidates (the tables rank, people decide), or
// training-quality predictions (scaling laws are outside sizing).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "sizing/cost_model.h"
#include "sizing/hardware.h"
#include "sizing/rules.h"

namespace zaya::sizing {

// "8.3B", "760M", "1.5T", "4K", "12345": a positive count; `flag` names the option in errors.
double parse_count(const std::string& flag, const std::string& text);

struct Budget {
  double total = 0;         // parameters without the embedding
  double active = 0;        // active per token without the embedding
  double tolerance = 0.10;  // relative
  void validate() const;
  bool fits(double t, double a) const;
};

struct Candidate {
  ZayaConfig config;
  int64_t total = 0, active = 0;  // without the embedding
  bool within_budget = false;
  bool reference = false;  // the base config itself (ZAYA1: 16 × 2048, top-1)
  bool pareto = false;
  TrainEstimate train;
  InferenceEstimate infer;
  int warns = 0, fails = 0;
  std::vector<std::string> warned;  // ids of rules that warned or failed
  std::string label() const;        // "E16 I2048 k1" (+ "D2048 L40" for propose)
};

struct SearchOptions {
  Budget budget;
  CheckOptions check;  // training setup, decode batch
  int64_t decode_context = 4096;
  int64_t prompt = 4096;
  std::vector<int64_t> experts = {4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256};
  std::vector<int64_t> top_k = {1, 2, 4, 8};
  int64_t width_step = 128;  // expert widths are multiples of this
  int64_t width_max = 16384;
  std::vector<int64_t> hidden = {1024, 1536, 2048, 2560, 3072, 4096};      // propose only
  std::vector<int64_t> layers = {16, 20, 24, 28, 32, 36, 40, 48, 56, 64};  // propose only
  // propose only: expert width as a multiple of the hidden size. The cost model alone would shrink
  // D and grow I without bound (the LM head and attention scale with D); published MoEs keep
  // I between fine-grained D/4 and coarse 2D.
  double width_ratio_min = 0.25, width_ratio_max = 2.0;
};

// Evaluates one config: cost model, inference, rules.
Candidate evaluate_candidate(const ZayaConfig& c, const HardwareProfile& hw,
                             const SearchOptions& o);

// Candidates within the budget, sorted by training tokens/s (best first), Pareto front of
// (tokens/s up, decode latency down) marked; the base config is always included and marked
// `reference`.
std::vector<Candidate> moe_sweep(const ZayaConfig& base, const HardwareProfile& hw,
                                 const SearchOptions& o);
// Candidates within the budget and without failing rules, best training tokens/s first.
std::vector<Candidate> propose(const ZayaConfig& base, const HardwareProfile& hw,
                               const SearchOptions& o, size_t top);

void mark_pareto(std::vector<Candidate>& cs);
nlohmann::json candidates_to_json(const std::vector<Candidate>& cs);
// The training-throughput vs decode-latency plot of a sweep: one scatter series per top-k, the
// Pareto front as a line, the reference config as its own point.
void write_moe_plot(const std::vector<Candidate>& cs, const std::string& hardware,
                    const std::string& path);

}  // namespace zaya::sizing
