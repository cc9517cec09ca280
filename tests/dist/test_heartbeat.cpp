// The rank side of the supervisor protocol (dist/heartbeat.h, dist/watchdog.h): the messages a
// rank sends, as a small TCP listener in the test receives them (fields exactly as
// dist/ft_protocol.h says), nothing sent and nothing slow without ZAYA_SUPERVISOR, a supervisor
// that is gone or goes away neither hanging nor crashing the sender, and the watchdog ending a
// process whose collective section lasts past the timeout (but not one inside a checkpoint).
// The reporter is once per process, so each case runs it in a forked child.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/heartbeat.h"
#include "dist/watchdog.h"

namespace zaya::ft {
namespace {

using json = nlohmann::json;

// A listening socket on 127.0.0.1 at a free port.
struct Listener {
  int fd = -1, port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  // The next connection within `ms`, or -1.
  int accept_within(int ms) const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return -1;
    return ::accept(fd, nullptr, nullptr);
  }
};

// Everything a connection carries until the peer closes it, as JSON lines.
std::vector<json> read_messages(int conn) {
  std::string all;
  char buf[4096];
  for (;;) {
    pollfd p{conn, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) break;
    const ssize_t n = ::read(conn, buf, sizeof buf);
    if (n <= 0) break;
    all.append(buf, size_t(n));
  }
  ::close(conn);
  std::vector<json> out;
  size_t pos = 0;
  while (pos < all.size()) {
    const size_t nl = all.find('\n', pos);
    EXPECT_NE(nl, std::string::npos) << "a message without its newline: " << all.substr(pos);
    if (nl == std::string::npos) break;
    out.push_back(json::parse(all.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return out;
}

// Runs fn in a forked child with ZAYA_SUPERVISOR = address (unset when empty); returns the child's
// pid (wait with exit_status).
template <typename Fn>
pid_t fork_child(const std::string& address, Fn&& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (address.empty())
      ::unsetenv(kEnvAddress);
    else
      ::setenv(kEnvAddress, address.c_str(), 1);
    ::setenv(kEnvAttempt, "2", 1);
    int code = 0;
    try {
      code = fn();
    } catch (...) {
      code = 99;
    }
    std::_Exit(code);
  }
  return pid;
}

int exit_status(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void expect_common(const json& m, pid_t pid) {
  EXPECT_EQ(m.at("rank").get<int>(), 1) << m;
  EXPECT_EQ(m.at("world").get<int>(), 2) << m;
  EXPECT_EQ(m.at("host").get<std::string>(), "testhost") << m;
  EXPECT_EQ(m.at("pid").get<int64_t>(), int64_t(pid)) << m;
  EXPECT_EQ(m.at("attempt").get<int>(), 2) << m;
  const double t = m.at("t").get<double>();
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GT(t, now - 60) << m;
  EXPECT_LE(t, now + 1) << m;
}

TEST(Heartbeat, MessagesAsTheProtocolSays) {
  Listener l;
  const pid_t pid = fork_child(l.address(), [] {
    start_reporting({1, 2, "testhost", "train", 7});
    set_step(8);
    {
      const auto f = section(kForward);
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    step_finished(0.5);
    {
      const auto c = section(kCollective, "all_reduce");  // lasts past one beat interval
      std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    }
    send_event("checkpoint_saved", {{"path", "/ck/step-00000008"}});
    finish_reporting("completed", 0);
    return 0;
  });
  const int conn = l.accept_within(5000);
  ASSERT_GE(conn, 0) << "the rank never connected";
  const std::vector<json> ms = read_messages(conn);
  EXPECT_EQ(exit_status(pid), 0);
  ASSERT_GE(ms.size(), 4u);
  for (const json& m : ms) expect_common(m, pid);
  const json& hello = ms.front();
  ASSERT_EQ(hello.value("type", ""), "hello") << hello;
  EXPECT_EQ(hello.value("step", -1), 7);
  EXPECT_EQ(hello.value("kind", ""), "train");
  const json& bye = ms.back();  // nothing after it
  ASSERT_EQ(bye.value("type", ""), "bye") << bye;
  EXPECT_EQ(bye.value("status", ""), "completed");
  EXPECT_EQ(bye.value("code", -1), 0);
  EXPECT_EQ(bye.value("step", -1), 8);
  bool forward = false, collective_long = false, with_step_s = false, event = false;
  for (const json& m : ms) {
    const std::string type = m.value("type", "");
    EXPECT_TRUE(type == "hello" || type == "beat" || type == "event" || type == "bye") << m;
    if (type == "beat") {
      const std::string sec = m.at("section");
      bool known = false;
      for (const char* s : kSections) known = known || sec == s;
      EXPECT_TRUE(known) << m;
      EXPECT_TRUE(m.at("step_s").is_null() || m.at("step_s").is_number()) << m;
      EXPECT_TRUE(m.at("step").is_number_integer()) << m;
      if (sec == "forward" && m.value("step", -1) == 8) forward = true;
      // The periodic beat from within the collective: its section, operation and age.
      if (sec == "collective" && m.value("op", "") == "all_reduce" &&
          m.at("section_s").get<double>() >= 0.9)
        collective_long = true;
      if (m.at("step_s").is_number() && m.at("step_s").get<double>() == 0.5) with_step_s = true;
    }
    if (type == "event") {
      EXPECT_EQ(m.value("event", ""), "checkpoint_saved") << m;
      EXPECT_EQ(m.value("step", -1), 8) << m;
      EXPECT_EQ(m.value("path", ""), "/ck/step-00000008") << m;
      event = true;
    }
  }
  EXPECT_TRUE(forward) << "no beat on entering the forward section";
  EXPECT_TRUE(collective_long) << "no periodic beat while the collective lasted";
  EXPECT_TRUE(with_step_s) << "no beat carried the last step time";
  EXPECT_TRUE(event);
}

TEST(Heartbeat, NothingWithoutTheVariable) {
  Listener l;
  const pid_t pid = fork_child("", [] {
    if (supervised()) return 1;
    start_reporting({1, 2, "testhost", "train", 0});
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000000; i++) {
      const auto g = section(SectionId(i % kSectionCount));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    send_event("done");
    finish_reporting("completed", 0);
    return s < 1.0 ? 0 : 2;  // a million guards: well under a microsecond each
  });
  EXPECT_EQ(exit_status(pid), 0);
  EXPECT_LT(l.accept_within(300), 0) << "an unsupervised process connected";
}

TEST(Heartbeat, DeadSupervisorNeitherHangsNorCrashes) {
  int port = 0;
  {
    Listener gone;  // bound, then closed: connections are refused
    port = gone.port;
  }
  const pid_t pid = fork_child("127.0.0.1:" + std::to_string(port), [] {
    const auto t0 = std::chrono::steady_clock::now();
    start_reporting({1, 2, "testhost", "train", 0});
    for (int i = 0; i < 200; i++) {
      const auto g = section(kCollective, "all_reduce");
      send_event("checkpoint_saved", {{"path", "x"}});
    }
    finish_reporting("completed", 0, 2.0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s < 3.5 ? 0 : 2;
  });
  EXPECT_EQ(exit_status(pid), 0);
}

TEST(Heartbeat, SupervisorGoingAwayMidRun) {
  Listener l;
  const pid_t pid = fork_child(l.address(), [] {
    start_reporting({1, 2, "testhost", "train", 0});
    for (int i = 0; i < 30; i++) {  // 1.5 s of sections and events across the disconnect
      const auto g = section(i % 2 ? kForward : kCollective);
      send_event("checkpoint_saved", {{"path", std::string(2000, 'p')}});
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const auto t0 = std::chrono::steady_clock::now();
    finish_reporting("completed", 0, 2.0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s < 3.5 ? 0 : 2;
  });
  const int conn = l.accept_within(5000);
  ASSERT_GE(conn, 0);
  char buf[256];
  EXPECT_GT(::read(conn, buf, sizeof buf), 0);  // the hello
  ::close(conn);                                // the supervisor goes away
  l.close();
  EXPECT_EQ(exit_status(pid), 0) << "the rank did not carry on after the supervisor left";
}

TEST(Heartbeat, BadAddressIsAnError) {
  const pid_t pid = fork_child("no-port-here", [] {
    try {
      start_reporting({0, 1, "h", "train", 0});
    } catch (const Error& e) {
      return std::string(e.what()).find("ZAYA_SUPERVISOR='no-port-here'") != std::string::npos ? 0
                                                                                               : 3;
    }
    return 4;
  });
  EXPECT_EQ(exit_status(pid), 0);
}

TEST(Heartbeat, SectionsNestAndRestore) {
  EXPECT_EQ(section_from_name("checkpoint", "x"), kCheckpoint);
  EXPECT_THROW(section_from_name("lunch", "section"), Error);
  const SectionId outer = where_now().section;
  {
    const auto a = section(kOptimizer);
    EXPECT_EQ(where_now().section, kOptimizer);
    {
      const auto b = section(kCollective, "host_all_reduce");
      EXPECT_EQ(where_now().section, kCollective);
      EXPECT_STREQ(where_now().op, "host_all_reduce");
      EXPECT_FALSE(where_now().in_checkpoint);
    }
    EXPECT_EQ(where_now().section, kOptimizer);
    EXPECT_EQ(where_now().op, nullptr);
    {
      const auto c = section(kCheckpoint);
      const auto d = section(kCollective);
      EXPECT_TRUE(where_now().in_checkpoint);
    }
    EXPECT_FALSE(where_now().in_checkpoint);
  }
  EXPECT_EQ(where_now().section, outer);
}

TEST(Watchdog, EndsAHungCollective) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EXIT(
      {
        start_watchdog(0.3, 3, "nodeA");
        set_step(5);
        const auto g = section(kCollective, "reduce_scatter");
        std::this_thread::sleep_for(std::chrono::seconds(20));
      },
      ::testing::ExitedWithCode(kExitWatchdog),
      "rank 3 on nodeA: watchdog: reduce_scatter of step 5 made no progress for [0-9]\\.[0-9] s");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0);
}

TEST(Watchdog, LeavesProgressAndCheckpointsAlone) {
  EXPECT_EXIT(
      {
        start_watchdog(0.3, 0, "nodeA");
        for (int i = 0; i < 10; i++) {  // collectives of 0.1 s: progress
          const auto g = section(kCollective, "all_reduce");
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        {
          const auto c = section(kCheckpoint, "save");  // a commit waiting for slow writes
          const auto g = section(kCollective, "host_all_gather");
          std::this_thread::sleep_for(std::chrono::milliseconds(800));
        }
        {
          const auto f = section(kForward);  // a long forward is the supervisor's to judge
          std::this_thread::sleep_for(std::chrono::milliseconds(800));
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Watchdog, TimeoutFromTheEnvironment) {
  ::unsetenv(kEnvCollectiveTimeout);
  EXPECT_EQ(collective_timeout_from_env(), 0);
  ::setenv(kEnvCollectiveTimeout, "2.5", 1);
  EXPECT_EQ(collective_timeout_from_env(), 2.5);
  for (const char* bad : {"-1", "ten", "3s", "nan"}) {
    ::setenv(kEnvCollectiveTimeout, bad, 1);
    try {
      collective_timeout_from_env();
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZAYA_COLLECTIVE_TIMEOUT"), std::string::npos);
    }
  }
  ::unsetenv(kEnvCollectiveTimeout);
}

}  // namespace
}  // namespace zaya::ft
