#include "ft/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace zaya::ft {

Job::Job(const std::vector<std::string>& argv, const Env& set,
         const std::vector<std::string>& unset) {
  ZAYA_CHECK(!argv.empty(), "supervise: an empty command");
  // Everything the child needs is built before fork: it only calls async-signal-safe functions.
  std::vector<std::string> env;
  for (char** e = environ; *e; e++) {
    const std::string kv = *e;
    const std::string k = kv.substr(0, kv.find('='));
    bool drop = false;
    for (const auto& u : unset) drop = drop || k == u;
    for (const auto& [n, v] : set) drop = drop || k == n;
    if (!drop) env.push_back(kv);
  }
  for (const auto& [n, v] : set) env.push_back(n + "=" + v);
  std::vector<char*> envp, args;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  int pipefd[2];
  ZAYA_CHECK(pipe2(pipefd, O_CLOEXEC) == 0, "supervise: pipe: {}", std::strerror(errno));
  pid_ = fork();
  if (pid_ < 0) {
    const int err = errno;
    close(pipefd[0]);
    close(pipefd[1]);
    fail("supervise: fork: {}", std::strerror(err));
  }
  if (pid_ == 0) {
    setsid();
    const int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    execvpe(args[0], args.data(), envp.data());
    const int err = errno;
    (void)!write(pipefd[1], &err, sizeof(err));
    _exit(127);
  }
  close(pipefd[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(pipefd[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(pipefd[0]);
  if (n == sizeof(err)) {
    int st = 0;
    waitpid(pid_, &st, 0);
    exited_ = true;
    fail("supervise: cannot run '{}': {}", argv[0], std::strerror(err));
  }
}

Job::~Job() {
  if (!exited_) terminate(0);
}

bool Job::poll() {
  if (exited_) return true;
  int st = 0;
  const pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r != pid_) return false;
  exited_ = true;
  if (WIFSIGNALED(st)) {
    signal_ = WTERMSIG(st);
    code_ = 128 + signal_;
  } else {
    code_ = WEXITSTATUS(st);
  }
  return true;
}

std::string Job::describe() const {
  if (signal_) return fmt::format("killed by signal {} ({})", signal_, strsignal(signal_));
  return fmt::format("exit code {}", code_);
}

void Job::terminate(double grace) {
  if (pid_ <= 0) return;
  if (!poll()) {
    kill(-pid_, SIGTERM);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace);
    while (!poll() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The rest of the group (ranks the launcher started) goes too, whether or not the leader left.
  kill(-pid_, SIGKILL);
  while (!exited_) {
    int st = 0;
    const pid_t r = waitpid(pid_, &st, 0);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      exited_ = true;
      if (r == pid_) {
        signal_ = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        code_ = signal_ ? 128 + signal_ : WEXITSTATUS(st);
      }
    }
  }
}

bool process_alive(pid_t pid) {
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

}  // namespace zaya::ft
