// `zaya supervise` end to end against real child processes: tests/ft/fake_rank.py plays mpirun
// and the ranks of `zaya train` / `zaya health`, speaking the protocol of dist/ft_protocol.h over
// TCP and obeying ZAYA_FAULTS. Each test runs a short campaign in a temporary directory and checks
// the exit code, the events log and the report.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dist/ft_protocol.h"
#include "ft/supervisor.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zaya::ft;

namespace {

class Supervise : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("python3 -c pass 2>/dev/null") != 0) GTEST_SKIP() << "no python3";
    dir_ = fs::temp_directory_path() /
           ("zaya_supervise_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const fs::path fake = fs::path(ZAYA_SOURCE_DIR) / "tests/ft/fake_rank.py";
    fs::create_symlink(fake, dir_ / "mpirun");
    fs::create_symlink(fake, dir_ / "zaya");
    setenv("FAKE_LOG", (dir_ / "launches.log").c_str(), 1);
    unsetenv("FAKE_UNHEALTHY");
    unsetenv("FAKE_BADCONFIG");
    unsetenv("FAKE_NO_BYE");
    unsetenv("ZAYA_FAULTS");
  }
  void TearDown() override {
    unsetenv("FAKE_LOG");
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }
  SupervisorOptions options(int np, int steps) {
    SupervisorOptions o;
    o.command = {(dir_ / "mpirun").string(), "-np",     std::to_string(np),
                 (dir_ / "zaya").string(),   "train",   "--out",
                 (dir_ / "run").string(),    "--steps", std::to_string(steps)};
    o.listen = "127.0.0.1:0";
    o.monitor.hang_min = 1.5;
    o.monitor.ckpt_timeout = 3;
    o.monitor.startup_timeout = 30;
    o.grace = 1;
    o.health = false;
    o.progress_every = 0;
    return o;
  }
  json report() {
    std::ifstream in(dir_ / "run/supervisor/report.json");
    return json::parse(in);
  }
  std::vector<json> events(const std::string& kind = "") {
    std::ifstream in(dir_ / "run/supervisor/events.jsonl");
    std::vector<json> out;
    std::string line;
    while (std::getline(in, line)) {
      json e = json::parse(line);
      if (kind.empty() || e["event"] == kind) out.push_back(e);
    }
    return out;
  }
  std::vector<std::string> launches() {  // "attempt rank argv..." per train process
    std::ifstream in(dir_ / "launches.log");
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) out.push_back(line);
    return out;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(Supervise, CompletesWithHealthChecks) {
  auto o = options(2, 4);
  o.health = true;
  EXPECT_EQ(supervise(o), kExitCompleted);
  const json r = report();
  EXPECT_EQ(r["result"], "completed");
  EXPECT_EQ(r["attempts"], 1);
  EXPECT_EQ(r["failures"], 0);
  EXPECT_EQ(r["final_step"], 4);
  EXPECT_GT(r["goodput"].get<double>(), 0);
  ASSERT_EQ(events("health").size(), 1u);
  EXPECT_EQ(events("health")[0]["ok"], true);
  EXPECT_NE(events("health")[0]["command"].get<std::string>().find("/zaya health --dir "),
            std::string::npos);
  EXPECT_EQ(launches().size(), 2u);
  for (const auto& e : events()) {
    EXPECT_TRUE(e.contains("t") && e.contains("elapsed") && e.contains("attempt")) << e.dump();
  }
}

TEST_F(Supervise, RelaunchesAfterAKillAndANonZeroExitWithResumeAuto) {
  auto o = options(2, 6);
  o.faults = "0:kill@rank=0,step=3 1:exit@rank=1,step=5,arg=1";
  EXPECT_EQ(supervise(o), kExitCompleted);
  const json r = report();
  EXPECT_EQ(r["attempts"], 3);
  EXPECT_EQ(r["by_cause"]["died"], 1);
  EXPECT_EQ(r["by_cause"]["exit"], 1);
  EXPECT_EQ(r["injected_faults"], 2);
  const auto f = r["failure_list"];
  EXPECT_EQ(f[0]["rank"], 0);
  EXPECT_EQ(f[0]["step"], 3);
  EXPECT_EQ(f[1]["rank"], 1);
  EXPECT_EQ(f[1]["step"], 5);
  EXPECT_EQ(f[1]["code"], 1);
  for (const auto& x : f) EXPECT_GE(x["recover_s"].get<double>(), 0) << x.dump();
  // Attempts 0, 1, 2 with --resume auto from the second on; the second resumed after step 2 (the
  // fake ranks do not wait for each other: on a loaded machine one may be torn down before it
  // starts).
  int per_attempt[3] = {0, 0, 0};
  for (const auto& l : launches()) {
    const int a = l[0] - '0';
    ASSERT_LT(a, 3);
    per_attempt[a]++;
    EXPECT_EQ(l.find("--resume auto") != std::string::npos, a > 0) << l;
  }
  EXPECT_GE(per_attempt[0], 1);
  EXPECT_GE(per_attempt[1], 1);
  EXPECT_EQ(r["attempt_list"][1]["start_step"], 2);
  EXPECT_EQ(r["final_step"], 6);
}

TEST_F(Supervise, DetectsAHangAndNamesTheRank) {
  auto o = options(2, 6);
  o.faults = "0:hang@rank=1,step=3,section=backward";
  EXPECT_EQ(supervise(o), kExitCompleted);
  const auto fails = events("failure");
  ASSERT_EQ(fails.size(), 1u);
  EXPECT_EQ(fails[0]["cause"], "hang");
  EXPECT_EQ(fails[0]["rank"], 1);
  EXPECT_EQ(fails[0]["section"], "backward");
  EXPECT_EQ(fails[0]["step"], 3);
  const double d = fails[0]["detect_s"];
  EXPECT_GE(d, 1.5);
  EXPECT_LT(d, 2.5);  // the timeout (hang_min 1.5 s) plus the poll interval and some load
}

TEST_F(Supervise, CheckpointSectionHasTheLongerTimeout) {
  auto o = options(1, 4);
  o.monitor.hang_min = 0.5;
  o.faults = "0:hang@rank=0,step=2,section=checkpoint";
  EXPECT_EQ(supervise(o), kExitCompleted);
  const auto fails = events("failure");
  ASSERT_EQ(fails.size(), 1u);
  EXPECT_EQ(fails[0]["section"], "checkpoint");
  EXPECT_GE(fails[0]["detect_s"].get<double>(), 3.0);
  EXPECT_LT(fails[0]["detect_s"].get<double>(), 4.0);
}

TEST_F(Supervise, NumericsTwiceAtTheSameStepStops) {
  auto o = options(2, 6);
  o.faults = "0:nan@rank=0,step=4 1:nan@rank=0,step=4";  // rank 0 writes the fake checkpoint
  EXPECT_EQ(supervise(o), kExitNumerics);
  EXPECT_EQ(report()["result"], "numerics");
  EXPECT_EQ(report()["attempts"], 2);
  // Once is relaunched and completes.
  fs::remove_all(dir_ / "run");
  o.faults = "0:nan@rank=0,step=4";
  EXPECT_EQ(supervise(o), kExitCompleted);
  EXPECT_EQ(report()["by_cause"]["numerics"], 1);
}

TEST_F(Supervise, GivesUpWithoutProgress) {
  auto o = options(1, 6);
  o.no_progress = 2;
  const fs::path plan = dir_ / "plan.txt";
  std::ofstream out(plan);
  for (int i = 0; i < 5; i++) out << "exit@rank=0,step=3,arg=1\n";
  out.close();
  o.faults = plan.string();
  EXPECT_EQ(supervise(o), kExitGaveUp);
  const json r = report();
  EXPECT_EQ(r["result"], "gave_up");
  EXPECT_EQ(r["attempts"], 3);  // the first made progress, then 2 relaunches without
  EXPECT_EQ(r["final_step"], 2);
  // And the relaunch limit.
  fs::remove_all(dir_ / "run");
  o.no_progress = 10;
  o.max_restarts = 1;
  EXPECT_EQ(supervise(o), kExitGaveUp);
  EXPECT_EQ(report()["attempts"], 2);
}

TEST_F(Supervise, ARankWithoutByeAtTheLastStepIsJudgedByTheExitStatus) {
  auto o = options(2, 4);
  setenv("FAKE_NO_BYE", "1", 1);
  EXPECT_EQ(supervise(o), kExitCompleted);
  EXPECT_EQ(report()["attempts"], 1);
  EXPECT_FALSE(events("warning").empty());
  unsetenv("FAKE_NO_BYE");
}

TEST_F(Supervise, BadConfiguration) {
  auto o = options(2, 4);
  setenv("FAKE_BADCONFIG", "1", 1);
  EXPECT_EQ(supervise(o), kExitBadConfig);
  EXPECT_EQ(report()["attempts"], 1);
  EXPECT_EQ(report()["by_cause"]["bad_config"], 1);
  unsetenv("FAKE_BADCONFIG");
  // A launcher that cannot be run.
  o.command[0] = (dir_ / "no-such-mpirun").string();
  EXPECT_EQ(supervise(o), kExitBadConfig);
}

TEST_F(Supervise, FlagsAndExcludesAStraggler) {
  auto o = options(2, 12);
  o.monitor.straggler_window = 3;
  o.monitor.straggler_windows = 2;
  o.exclude_stragglers = true;
  // The fake ranks do not wait for each other: the slow one is killed after two windows.
  o.faults = "0:slow@rank=1,step=1,arg=2;kill@rank=1,step=8";
  EXPECT_EQ(supervise(o), kExitCompleted);
  const json r = report();
  ASSERT_EQ(r["stragglers"].size(), 1u);
  EXPECT_EQ(r["stragglers"][0]["rank"], 1);
  ASSERT_EQ(r["excluded"].size(), 1u);
  EXPECT_EQ(r["excluded"][0]["reason"], "straggler");
  const auto l = events("launch");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_NE(l[1]["command"].get<std::string>().find("-np 1 "), std::string::npos);
}

TEST_F(Supervise, HealthFailureRelaunchesWithoutTheRank) {
  auto o = options(2, 3);
  o.health = true;
  setenv("FAKE_UNHEALTHY", "1", 1);
  EXPECT_EQ(supervise(o), kExitCompleted);
  const auto h = events("health");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0]["ok"], false);
  EXPECT_EQ(h[0]["failed"][0]["rank"], 1);
  EXPECT_EQ(h[1]["ok"], true);
  EXPECT_NE(events("launch")[0]["command"].get<std::string>().find("-np 1 "), std::string::npos);
  // Not enough ranks left.
  fs::remove_all(dir_ / "run");
  o.min_ranks = 2;
  EXPECT_EQ(supervise(o), kExitHealth);
  unsetenv("FAKE_UNHEALTHY");
}

TEST_F(Supervise, InjectsSigkillFromOutsideAndRandomPlans) {
  auto o = options(2, 6);
  o.faults = "0:sigkill@rank=1,step=3";
  EXPECT_EQ(supervise(o), kExitCompleted);
  EXPECT_EQ(report()["by_cause"]["died"], 1);
  EXPECT_EQ(events("fault_injected").at(0)["by"], "supervisor");
  fs::remove_all(dir_ / "run");
  o.faults.clear();
  o.random_faults = "seed=3,count=3,kinds=kill,exit,steps=1-6";
  EXPECT_EQ(supervise(o), kExitCompleted);
  // A fault drawn for a step the relaunch does not run again (its checkpoint landed just before the
  // teardown, unseen) does not fire: up to 3 failures.
  EXPECT_GE(report()["failures"].get<int>(), 1);
  EXPECT_LE(report()["failures"].get<int>(), 3);
  EXPECT_EQ(report()["attempts"].get<int>(), report()["failures"].get<int>() + 1);
}
