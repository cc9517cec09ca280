// What the supervisor knows about the ranks of one attempt, built only from their messages
// (dist/ft_protocol.h: hello, beat, event, bye, and a connection that closes) and the times they
// arrived on the supervisor's clock, so it works the same for ranks on other nodes. It turns them
// into findings: a failure (a rank that died, reported an error, a non-finite loss, a watchdog
// abort, or stopped making progress: a hang) or a straggler (a rank persistently slower than the
// others). Progress is a beat with a new step or section, a checkpoint saved, or a beat whose
// "section_s" (the rank's seconds in its section) shows a change that beat throttling hid. Pure
// logic with the time passed in, so tests drive it without processes or sockets.
// Not here: sockets (ft/listener.h), processes (ft/process.h) or what to do about a finding
// (ft/supervisor.h).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace zaya::ft {

// Causes of a failure (the events log's "cause"; docs/FAULT_TOLERANCE.md).
inline constexpr const char* kCauseDied = "died";  // connection closed without bye, signal
inline constexpr const char* kCauseExit = "exit";  // non-zero exit or a bye with an error
inline constexpr const char* kCauseHang = "hang";  // no progress within the timeout
inline constexpr const char* kCauseCollective = "collective_hang";  // a rank's watchdog fired
inline constexpr const char* kCauseNumerics = "numerics";     // nonfinite / loss_spike / exit 3
inline constexpr const char* kCauseBadConfig = "bad_config";  // exit 2

struct Finding {
  std::string cause;  // one of kCause*, or "straggler"
  int rank = -1;      // -1: not one rank
  std::string host;
  int64_t step = -1;  // the step in progress when it was found (-1: unknown)
  std::string section;
  double detect_s = -1;  // from the fault (or the last progress) to its detection
  int code = -1;         // the exit code a rank announced, when known
  std::string message;
  bool failure() const { return cause != "straggler"; }
};

struct MonitorSettings {
  double hang_min = 60;          // s: the smallest step timeout
  double hang_factor = 5;        // step timeout = max(hang_min, hang_factor × median step time)
  double ckpt_timeout = 600;     // s in the sections checkpoint, eval and shutdown
  double startup_timeout = 600;  // s from launch to every rank's first step (section startup)
  int straggler_window = 10;     // steps per comparison window
  double straggler_threshold = 0.10;  // slower than the others' median by this fraction
  int straggler_windows = 3;          // consecutive slow windows before it is reported
};

// Per-step durations across attempts: the median sets the hang timeout.
class StepTimes {
 public:
  void add(double s);
  double median() const;  // 0 when empty
  size_t size() const { return recent_.size(); }

 private:
  std::deque<double> recent_;
};

struct RankView {
  int rank = -1;
  int world = 0;
  std::string host;
  int64_t pid = 0;
  std::string kind = "train";
  int64_t start_step = 0;  // from hello
  int64_t step = 0;        // the step in progress
  int64_t done = 0;        // the newest completed step
  std::string section = "startup";
  double hello_at = -1, last_progress = 0;
  double fault_at = -1;  // arrival of this rank's newest fault_injected event
  bool bye = false, closed = false;
  std::string bye_status;
  int bye_code = -1;
  std::string last_error;  // message of the newest "error" event
  double restore_s = 0;    // time in the checkpoint section before the first step
  bool computing = false;  // has left startup/checkpoint once
  double section_since = 0;
  // Per step: the first beat's arrival; the compute time; seconds in checkpoint and eval.
  std::map<int64_t, double> step_begin, busy, aside;
  bool saw_collective = false;
  nlohmann::json health;  // the newest health event (kind health)
};

class AttemptMonitor {
 public:
  AttemptMonitor(MonitorSettings s, double launch_time, StepTimes* step_times);

  // One message from connection `conn`, arrived at `now`; returns what it reveals.
  std::vector<Finding> on_message(int conn, const nlohmann::json& m, double now);
  // Connection `conn` closed at `now`: a rank that died unless it said bye.
  std::optional<Finding> on_close(int conn, double now);
  // A hang: a rank without progress for longer than its section's timeout, or ranks that never
  // said hello within the startup timeout.
  std::optional<Finding> check_hang(double now) const;
  // The step timeout now (for messages).
  double step_timeout() const;
  double timeout_for(const std::string& section) const;
  // A fault the supervisor caused itself (sigkill) at `now`: detection times count from it.
  void note_fault(int rank, double now);

  const std::map<int, RankView>& ranks() const { return ranks_; }
  int world() const { return world_; }
  int64_t newest_checkpoint() const { return newest_checkpoint_; }
  int64_t max_done() const;    // newest step any rank completed
  int64_t max_step() const;    // newest step in progress on any rank
  int64_t start_step() const;  // the step the attempt resumed from (min over hellos)
  double first_step_done_at() const { return first_step_done_at_; }  // -1: none yet
  double first_compute_at() const { return first_compute_at_; }
  double restore_s() const;                                             // max over ranks
  std::map<int64_t, double> step_durations() const { return step_s_; }  // per completed step
  // The rank (and host) a connection belongs to, when it said who it is.
  std::optional<int> rank_of(int conn) const;

 private:
  void progress(RankView& r, double now);
  std::optional<Finding> check_stragglers();
  Finding base(const RankView& r, const char* cause) const;

  MonitorSettings s_;
  double launch_time_;
  StepTimes* step_times_;
  std::map<int, RankView> ranks_;
  std::map<int, int> conn_rank_;
  int world_ = 0;
  int64_t newest_checkpoint_ = 0;
  double first_step_done_at_ = -1, first_compute_at_ = -1;
  std::map<int64_t, double> step_s_;
  // Stragglers.
  int64_t window_end_ = -1;
  std::map<int, int> slow_windows_;
  std::map<int, bool> reported_;
};

}  // namespace zaya::ft
