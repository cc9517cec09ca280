// PlannedFault campaigns for tests and drills: which faults each attempt of a supervised job gets.
// A plan is either written out (`--faults`: a file with one line per attempt, or `ATTEMPT:SPEC`
// items) or generated from a seed (`--random-faults
// seed=S,count=N,kinds=kill,hang:collective,...`), one fault per attempt for the first N attempts,
// at a step after the newest checkpoint the supervisor has seen (so that it fires). SPEC is the
// ZAYA_FAULTS grammar of dist/ft_protocol.h
// ("KIND@rank=R,step=S[,section=SEC][,arg=V]" joined by ';'); the kind `sigkill` is the
// supervisor's own: it sends SIGKILL to the rank's process (pid from its hello) when a beat shows
// the step. A written step may be relative, "step=+N": N steps after the newest checkpoint the
// supervisor has seen when the attempt starts, which fires whatever the earlier faults cost.
// Written faults and a random plan combine: the written ones replace the drawn ones of their
// attempts. Not here: what the ranks do with a fault (dist/fault_inject.*), or timing.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace zaya::ft {

struct PlannedFault {
  std::string kind;  // "kill", "hang", "exit", "nan", ..., or "sigkill" (done by the supervisor)
  int rank = 0;
  int64_t step = 0;
  bool relative = false;  // "step=+N": step counts from the newest checkpoint
  std::string rest;       // the spec's other fields (",section=collective,arg=3"), verbatim

  std::string spec() const;  // back to "KIND@rank=R,step=S..."
  bool by_supervisor() const { return kind == "sigkill"; }
};

// Parses one attempt's SPEC; throws zaya::Error naming `where` and the item when malformed.
std::vector<PlannedFault> parse_fault_spec(const std::string& spec, const std::string& where);
std::string join_specs(const std::vector<PlannedFault>& faults);  // the rank-side ones only

struct RandomFaults {
  uint64_t seed = 0;
  int count = 0;
  std::vector<std::string> kinds;         // "KIND" or "KIND:SECTION"
  int64_t first_step = 1, last_step = 0;  // 0: the run's last step (from its config)
  int ranks = 0;                          // 0: the job's world
};
// "seed=S,count=N,kinds=A,B:SEC,...[,steps=LO-HI][,ranks=R]"; throws zaya::Error when malformed.
RandomFaults parse_random_faults(const std::string& text);

class FaultPlan {
 public:
  FaultPlan() = default;
  // `plan` is a file name when such a file exists, else whitespace-separated ATTEMPT:SPEC items.
  // In a file, each line that is not blank or a '#' comment is the next attempt's SPEC (or
  // "ATTEMPT: SPEC", which also moves the count there); "-" is an attempt without faults.
  static FaultPlan parse(const std::string& plan);
  static FaultPlan random(RandomFaults r);

  bool empty() const { return fixed_.empty() && !random_; }
  // Adds a random plan for the attempts this one does not name.
  void add_random(RandomFaults r) { random_ = std::move(r); }
  // The faults of `attempt`. A random plan draws them from (seed, attempt): a kind, a rank below
  // `world`, and a step in (newest checkpoint, last step]; `last_step` fills in RandomFaults's.
  std::vector<PlannedFault> for_attempt(int attempt, int world, int64_t newest_checkpoint,
                                        int64_t last_step) const;
  bool needs_last_step() const { return random_ && random_->last_step == 0; }

 private:
  std::map<int, std::vector<PlannedFault>> fixed_;
  std::optional<RandomFaults> random_;
};

}  // namespace zaya::ft
