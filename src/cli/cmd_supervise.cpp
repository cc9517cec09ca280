// `zaya supervise [options] -- LAUNCH COMMAND...`: runs a training job under its launcher
// (`mpirun -np 2 zaya train ...`, `srun ... zaya train ...`), detects crashes, hangs, non-finite
// losses and stragglers from the ranks' heartbeats, and relaunches it with `--resume auto` after
// health checks until it completes or a limit is hit (src/ft/supervisor.h,
// docs/FAULT_TOLERANCE.md). Exit codes: dist/ft_protocol.h.
#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>

#include "cli/command.h"
#include "core/error.h"
#include "dist/ft_protocol.h"
#include "ft/supervisor.h"

namespace zaya::cli {

static int run_supervise(int argc, char** argv) {
  // Everything after the first "--" is the launch command, untouched by the option parser.
  std::vector<char*> own;
  std::vector<std::string> command;
  bool after = false;
  for (int i = 0; i < argc; i++) {
    if (!after && i > 0 && !std::strcmp(argv[i], "--")) {
      after = true;
      continue;
    }
    if (after)
      command.push_back(argv[i]);
    else
      own.push_back(argv[i]);
  }
  ft::SupervisorOptions o;
  CLI::App app{
      "Run a training job, detect crashes, hangs, NaNs and stragglers, and relaunch it with "
      "--resume auto until it completes (exit codes: 0 completed, 2 bad configuration, 3 "
      "numerics, 4 gave up, 6 too few healthy ranks)",
      "zaya supervise [options] -- LAUNCH COMMAND..."};
  std::string health = "on";
  app.add_option("--listen", o.listen, "HOST:PORT the supervisor listens on (port 0: any)")
      ->capture_default_str();
  app.add_option("--advertise", o.advertise,
                 "HOST[:PORT] the ranks connect to (default: this host's address)");
  app.add_option("--events", o.events, "events log, JSONL (default <out>/supervisor/events.jsonl)");
  app.add_option("--report", o.report, "final report (default <out>/supervisor/report.json)");
  app.add_option("--hang-min", o.monitor.hang_min, "smallest step timeout, seconds")
      ->capture_default_str();
  app.add_option("--hang-factor", o.monitor.hang_factor,
                 "step timeout = max(--hang-min, this x the median step time)")
      ->capture_default_str();
  app.add_option("--ckpt-timeout", o.monitor.ckpt_timeout,
                 "timeout in the checkpoint, eval and shutdown sections, seconds")
      ->capture_default_str();
  app.add_option("--startup-timeout", o.monitor.startup_timeout,
                 "from launch until every rank is past start-up, seconds")
      ->capture_default_str();
  app.add_option("--grace", o.grace, "seconds between SIGTERM and SIGKILL at teardown")
      ->capture_default_str();
  app.add_option("--max-restarts", o.max_restarts, "relaunches before giving up")
      ->capture_default_str();
  app.add_option("--no-progress", o.no_progress,
                 "give up after this many consecutive relaunches without a new step or checkpoint")
      ->capture_default_str();
  app.add_option("--min-ranks", o.min_ranks, "fewest ranks to relaunch with after exclusions")
      ->capture_default_str();
  app.add_option("--health", health,
                 "on (`zaya health` before every (re)start), first (before the first launch "
                 "only) or off")
      ->capture_default_str();
  app.add_option("--health-args", o.health_args, "extra arguments of `zaya health`")
      ->allow_extra_args(false);
  app.add_option("--health-timeout", o.health_timeout, "seconds the health checks may take")
      ->capture_default_str();
  app.add_option("--straggler-window", o.monitor.straggler_window, "steps per straggler comparison")
      ->capture_default_str();
  app.add_option("--straggler-threshold", o.monitor.straggler_threshold,
                 "slower than the others' median by this fraction")
      ->capture_default_str();
  app.add_option("--straggler-windows", o.monitor.straggler_windows,
                 "consecutive slow windows before a straggler is reported")
      ->capture_default_str();
  app.add_flag("--exclude-stragglers", o.exclude_stragglers,
               "relaunch without reported stragglers");
  app.add_option("--faults", o.faults,
                 "fault plan: a file (one ZAYA_FAULTS spec per attempt) or ATTEMPT:SPEC items");
  app.add_option("--random-faults", o.random_faults,
                 "seed=S,count=N,kinds=kill,hang:collective,...[,steps=LO-HI][,ranks=R]");
  app.add_option("--progress-every", o.progress_every, "seconds between progress lines (0: none)")
      ->capture_default_str();
  app.add_option("--collective-timeout", o.collective_timeout,
                 "exported as ZAYA_COLLECTIVE_TIMEOUT (the ranks' collective watchdog; 0: unset)")
      ->capture_default_str();
  bool no_forward = false;
  app.add_flag("--no-forward-env", no_forward,
               "do not add mpirun -x options for the supervisor's variables (non-OpenMPI)");
  if (!parse_or_help(app, int(own.size()), own.data())) return 0;
  if (health != "on" && health != "first" && health != "off") {
    fmt::print(stderr, "zaya supervise: --health {}: expected on, first or off\n", health);
    return ft::kExitBadConfig;
  }
  if (command.empty()) {
    fmt::print(stderr,
               "zaya supervise: no launch command: expected `zaya supervise [options] -- "
               "mpirun -np N zaya train ...`\n");
    return ft::kExitBadConfig;
  }
  o.health = health != "off";
  o.health_first_only = health == "first";
  o.forward_env = !no_forward;
  o.command = command;
  std::error_code ec;
  o.zaya_exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  try {
    return ft::supervise(o);
  } catch (const Error& e) {
    fmt::print(stderr, "zaya supervise: error: {}\n", e.what());
    return ft::kExitBadConfig;
  }
}

ZAYA_COMMAND("supervise", "run a training job, detect failures and resume it by itself",
             run_supervise);

}  // namespace zaya::cli
