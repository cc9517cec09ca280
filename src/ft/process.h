// One launched job as the supervisor runs it: fork/exec in a session of its own (so its process
// group can be signalled as a whole: the launcher and whatever it started locally), stdin from
// /dev/null, the environment with the given variables set and removed, and a teardown that sends
// SIGTERM to the group, waits a grace period and then sends SIGKILL. Not here: remote processes
// (srun or mpirun end those when their launcher goes) or reading the ranks' messages.
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace zaya::ft {

class Job {
 public:
  using Env = std::vector<std::pair<std::string, std::string>>;
  // Starts argv (looked up in PATH); throws zaya::Error naming the command when it cannot be run
  // (not found, not executable).
  Job(const std::vector<std::string>& argv, const Env& set, const std::vector<std::string>& unset);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pid_t pid() const { return pid_; }
  // Non-blocking: true once the process has exited (it is reaped here).
  bool poll();
  bool exited() const { return exited_; }
  int exit_code() const { return code_; }  // its exit status, or 128 + the signal
  int signal() const { return signal_; }   // the signal that ended it, 0 if it exited
  std::string describe() const;            // "exit code 3", "killed by signal 9 (Killed)"
  // SIGTERM to the process group, up to `grace` seconds for the leader to exit, then SIGKILL to
  // the group; returns after the leader is reaped. Safe to call when it has exited.
  void terminate(double grace);

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = 0, signal_ = 0;
};

// Whether a process (not necessarily a child) still exists.
bool process_alive(pid_t pid);

}  // namespace zaya::ft
