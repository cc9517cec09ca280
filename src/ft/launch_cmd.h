// The job's launch command as `zaya supervise` rewrites it between attempts: pure functions over an
// argv (`mpirun -np 2 zaya train --config F --out D`, `srun -N 2 --ntasks=8 zaya train ...`, or a
// bare `zaya train ...`). They find the `zaya` executable and its subcommand, add `--resume auto`,
// change the number of ranks and exclude hosts in the launcher's own syntax (OpenMPI's mpirun and
// Slurm's srun), forward the supervisor's environment through mpirun, and derive the `zaya health`
// command that runs under the same launcher. Not here: running anything (ft/process.h) or deciding
// which ranks to drop (ft/supervisor.h).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace zaya::ft {

using Argv = std::vector<std::string>;

enum class LauncherKind { None, Mpirun, Srun, Other };

struct LaunchCommand {
  Argv argv;
  LauncherKind launcher = LauncherKind::None;  // None: argv[0] is zaya itself
  size_t zaya = 0;                             // index of the zaya executable in argv
  std::string subcommand;                      // argv[zaya + 1] ("train", ...; "" when absent)

  // Splits and checks an argv; throws zaya::Error when it names no `zaya` executable (an argument
  // whose file name is `zaya`, or `zaya_exe` when given) or no subcommand after it.
  static LaunchCommand parse(const Argv& argv, const std::string& zaya_exe = "");

  // The value of a `zaya` option (`--out D` or `--out=D`), nullopt when absent.
  std::optional<std::string> zaya_option(const std::string& name) const;
  // The `--section.key=value` overrides among the zaya arguments.
  std::vector<std::string> config_overrides() const;
  // The ranks the launcher starts (-np/-n/--ntasks), nullopt when the command does not say
  // (a bare zaya is 1).
  std::optional<int> world() const;
};

// `cmd` with `--resume auto` appended to the zaya arguments unless a --resume is already there.
LaunchCommand with_resume_auto(LaunchCommand cmd);
// `cmd` starting `n` ranks: mpirun's -np/-n/--np/-c or srun's -n/--ntasks rewritten in place
// (inserted after the launcher when missing). Throws zaya::Error for a bare zaya (one process) or
// an unknown launcher asked for n != its world.
LaunchCommand with_world(LaunchCommand cmd, int n);
// `cmd` without the given hosts: srun's --exclude/-x gains them (and -N/--nodes shrinks by their
// number when given); mpirun's -H/--host list loses them. Returns false in `*done` when the
// launcher has no way to exclude a host (a single-node mpirun: the caller lowers the world only).
LaunchCommand with_excluded_hosts(LaunchCommand cmd, const std::vector<std::string>& hosts,
                                  bool* done);
// OpenMPI's mpirun exports only the variables named with -x to ranks on other nodes: `cmd` with
// "-x NAME" for each name inserted after the launcher (other launchers: unchanged; srun exports the
// whole environment by default).
LaunchCommand with_forwarded_env(LaunchCommand cmd, const std::vector<std::string>& names);
// The same launcher prefix running `zaya health --dir DIR EXTRA...` instead of the job.
LaunchCommand health_command(const LaunchCommand& cmd, const std::string& dir,
                             const std::vector<std::string>& extra);

// One line for logs: the argv joined with spaces, arguments with spaces or quotes quoted.
std::string show_argv(const Argv& argv);

}  // namespace zaya::ft
