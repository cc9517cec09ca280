// The sizing rules of ZAYA1.md §5, each judged for one model on one hardware profile: operand
// alignment (head dim, widths, vocab), GEMM work against the profile's knee, wave quantization
// over the compute units, tokens per expert, the attention/MoE FLOP split, KV-cache size, ZeRO-1
// memory per GPU, and intra-node collective limits. Every rule says what it checks, why, its
// threshold and its source, and carries the numbers behind its verdict.
//
// Deliberately not here: fixing a config (`zaya size propose` searches instead), or rules for
// tensor/pipeline/expert parallelism, which ZAYA1 does not use.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "sizing/cost_model.h"
#include "sizing/hardware.h"

namespace zaya::sizing {

enum class Status { Pass, Warn, Fail };
const char* status_name(Status s);

struct RuleResult {
  std::string id;  // "head_dim", "width.hidden", "gemm.knee", ...
  Status status = Status::Pass;
  std::string value;                                  // the measured quantity, human-readable
  std::string threshold;                              // what passes
  std::string why;                                    // why it matters
  std::string source;                                 // where the rule comes from
  nlohmann::json numbers = nlohmann::json::object();  // the figures behind the verdict
};

struct CheckOptions {
  TrainSetup train;
  int64_t decode_batch = 1;
  int64_t context = 0;           // KV rule's context; 0: max_position_embeddings
  double memory_headroom = 0.9;  // usable fraction of HBM (allocator, workspaces, runtime)
};

// Multiple-of rule for one width: Fail below 8-element (16-byte bf16) alignment, Warn below 64,
// Pass from 64 (the numbers name the largest power-of-two divisor up to 256).
RuleResult check_alignment(const std::string& id, const std::string& field, int64_t v);

// Wave quantization of one GEMM grid: tiles / (ceil(tiles / units) · units).
double wave_efficiency(int64_t tiles, int64_t units);
// Output tiles of an m×n GEMM with tm×tn tiles.
int64_t gemm_tiles(double m, double n, int tm, int tn);

std::vector<RuleResult> check_rules(const ZayaConfig& c, const HardwareProfile& hw,
                                    const CheckOptions& o);
Status worst_status(const std::vector<RuleResult>& r);
nlohmann::json rules_to_json(const std::vector<RuleResult>& r);

}  // namespace zaya::sizing
