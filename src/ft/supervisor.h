// `zaya supervise`: runs a training job under its launcher, watches its ranks over the network
// (ft/listener.h, ft/monitor.h), and on a failure tears the job down, runs the health checks and
// relaunches it with `--resume auto`, until it completes or a limit is hit (docs/FAULT_TOLERANCE.md
// is the user's guide). Every finding goes to an events log (JSONL) and one console line; the
// report at the end counts failures by cause, detection and recovery times, lost work and goodput.
// Not here: the ranks' side of the protocol (dist/heartbeat.*), the checks themselves (`zaya
// health`), or restoring state (the trainer's `--resume auto`).
#pragma once
#include <string>
#include <vector>

#include "ft/monitor.h"

namespace zaya::ft {

struct SupervisorOptions {
  std::vector<std::string> command;  // the launch command, e.g. mpirun -np 2 zaya train ...
  std::string listen = "0.0.0.0:0";  // where the listener binds
  std::string advertise;             // HOST[:PORT] ranks connect to; "": this host's address
  std::string events, report;        // "": <run dir>/supervisor/{events.jsonl,report.json}
  MonitorSettings monitor;
  double grace = 10;               // s between SIGTERM and SIGKILL at teardown
  int max_restarts = 100;          // relaunches after the first launch
  int no_progress = 3;             // consecutive relaunches without a new step or checkpoint
  int min_ranks = 1;               // fewest ranks to relaunch with after exclusions
  bool health = true;              // `zaya health` under the launcher before every (re)start
  bool health_first_only = false;  // ... or before the first launch only
  std::vector<std::string> health_args;
  double health_timeout = 300;
  bool exclude_stragglers = false;
  std::string faults;             // --faults PLAN (ft/fault_plan.h)
  std::string random_faults;      // --random-faults seed=S,count=N,kinds=...
  double progress_every = 30;     // s between progress lines on the console (0: none)
  double collective_timeout = 0;  // exported as ZAYA_COLLECTIVE_TIMEOUT when > 0
  bool forward_env = true;        // mpirun: -x for the supervisor's variables
  std::string zaya_exe;           // the zaya executable's path, also recognised in the command
};

// Runs the campaign; returns the exit code of dist/ft_protocol.h (kExitCompleted, kExitGaveUp,
// kExitNumerics, kExitBadConfig, kExitHealth; 128 + N after signal N). Throws zaya::Error for
// options that are wrong (the CLI exits kExitBadConfig).
int supervise(const SupervisorOptions& options);

}  // namespace zaya::ft
