// Fault injection (dist/fault_inject.h): the ZAYA_FAULTS grammar, good and bad lists (each error
// names the item and what was expected), and the faults acting where they should: exit and kill
// at their step (and section), hang inside a collective (ended by the watchdog), nan once at its
// step, disk_full armed from its step, slow sleeping per step. Faults that end the process run in
// death tests; the others reset the process's faults afterwards.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "dist/fault_inject.h"
#include "dist/watchdog.h"

namespace zaya::ft {
namespace {

std::string error_of(const std::string& spec) {
  try {
    parse_faults(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FaultInject, ParsesTheGrammar) {
  const auto fs = parse_faults(
      " kill@rank=1,step=5 ; hang@rank=0,step=3,section=collective;exit@rank=2,step=7,arg=42;"
      "slow@rank=1,step=2,arg=0.25;nan@rank=0,step=4;corrupt_ckpt@rank=1,step=6;"
      "disk_full@rank=0,step=8;error@rank=3,step=1;exit@rank=0,step=9;;");
  ASSERT_EQ(fs.size(), 9u);
  EXPECT_EQ(fs[0].kind, FaultKind::Kill);
  EXPECT_EQ(fs[0].rank, 1);
  EXPECT_EQ(fs[0].step, 5);
  EXPECT_FALSE(fs[0].section);
  EXPECT_EQ(fs[0].text, "kill@rank=1,step=5");
  EXPECT_EQ(fs[1].kind, FaultKind::Hang);
  EXPECT_EQ(*fs[1].section, kCollective);
  EXPECT_EQ(fs[2].kind, FaultKind::Exit);
  EXPECT_EQ(fs[2].arg, 42);
  EXPECT_EQ(fs[3].kind, FaultKind::Slow);
  EXPECT_EQ(fs[3].arg, 0.25);
  EXPECT_EQ(fs[4].kind, FaultKind::NaN);
  EXPECT_EQ(fs[5].kind, FaultKind::CorruptCkpt);
  EXPECT_EQ(fs[6].kind, FaultKind::DiskFull);
  EXPECT_EQ(fs[7].kind, FaultKind::Error);
  EXPECT_EQ(fs[8].arg, 1);  // exit's default code
  EXPECT_TRUE(parse_faults("").empty());
}

TEST(FaultInject, BadListsNameTheItem) {
  const std::pair<const char*, const char*> cases[] = {
      {"kill@rank=0,step=1;boom@rank=0,step=2",
       "fault 2 'boom@rank=0,step=2': unknown kind 'boom'"},
      {"kill rank=0", "no '@'"},
      {"kill@step=3", "missing rank="},
      {"kill@rank=1", "missing step="},
      {"kill@rank=-1,step=3", "rank=-1 is not an integer >= 0"},
      {"kill@rank=0,step=0", "step=0 is not an integer >= 1"},
      {"kill@rank=0,step=x", "step=x is not an integer"},
      {"hang@rank=0,step=1,section=lunch", "unknown section 'lunch'"},
      {"nan@rank=0,step=1,section=data", "nan takes no section"},
      {"exit@rank=0,step=1,arg=300", "exit code in [0, 255]"},
      {"slow@rank=0,step=1", "slow needs arg"},
      {"kill@rank=0,step=1,arg=3", "kill takes no arg"},
      {"kill@rank=0,step=1,when=now", "unknown field 'when'"},
      {"kill@rank=0,,step=1", "an empty field"},
      {"kill@rank=0,step", "field 'step' has no '='"},
  };
  for (const auto& [spec, want] : cases) {
    const std::string e = error_of(spec);
    EXPECT_NE(e.find(want), std::string::npos) << spec << " -> " << e;
    EXPECT_NE(e.find("ZAYA_FAULTS"), std::string::npos) << e;
    EXPECT_NE(e.find("KIND@rank=R,step=S"), std::string::npos) << e;
  }
}

TEST(FaultInject, OnlyThisRanksFaults) {
  install_faults(parse_faults("nan@rank=1,step=3;nan@rank=0,step=4"), 0);
  EXPECT_FALSE(poison_gradients(3));  // rank 1's
  EXPECT_TRUE(poison_gradients(4));
  EXPECT_FALSE(poison_gradients(4)) << "a fault acts once";
  install_faults({}, 0);
}

TEST(FaultInject, DiskFullFromItsStep) {
  install_faults(parse_faults("disk_full@rank=0,step=3"), 0);
  set_step(2);
  EXPECT_FALSE(take_disk_full());
  set_step(3);
  EXPECT_TRUE(take_disk_full());
  EXPECT_FALSE(take_disk_full()) << "one write fails, not every one";
  install_faults({}, 0);
}

TEST(FaultInject, SlowSleepsEveryStepFromItsStep) {
  install_faults(parse_faults("slow@rank=0,step=2,arg=0.1"), 0);
  const auto timed = [](int64_t step) {
    set_step(step);
    const auto t0 = std::chrono::steady_clock::now();
    for (int m = 0; m < 3; m++) {  // three micro-batches
      const auto f = section(kForward);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  EXPECT_LT(timed(1), 0.05);
  const double s2 = timed(2), s3 = timed(3);
  EXPECT_GE(s2, 0.1);
  EXPECT_LT(s2, 0.25) << "slept more than once in a step";
  EXPECT_GE(s3, 0.1);
  install_faults({}, 0);
}

TEST(FaultInject, ErrorRaisesAtItsStep) {
  install_faults(parse_faults("error@rank=0,step=4"), 0);
  set_step(3);
  try {
    set_step(4);
    ADD_FAILURE() << "no error at step 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure (error@rank=0,step=4) at step 4"),
              std::string::npos)
        << e.what();
  }
  install_faults({}, 0);
  set_step(0);
}

TEST(FaultInject, ExitAndKillAtTheirPoint) {
  EXPECT_EXIT(
      {
        install_faults(parse_faults("exit@rank=0,step=2,section=backward,arg=42"), 0);
        set_step(2);
        { const auto f = section(kForward); }
        { const auto b = section(kBackward); }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(42), "injected fault exit@rank=0,step=2,section=backward,arg=42");
  EXPECT_EXIT(
      {
        install_faults(parse_faults("kill@rank=0,step=3"), 0);
        set_step(2);
        set_step(3);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "");
}

TEST(FaultInject, HangInACollectiveEndsThroughTheWatchdog) {
  EXPECT_EXIT(
      {
        install_faults(parse_faults("hang@rank=0,step=2,section=collective"), 0);
        start_watchdog(0.3, 0, "nodeB");
        set_step(1);
        { const auto c = section(kCollective, "all_reduce"); }  // step 1: passes
        set_step(2);
        const auto c = section(kCollective, "all_reduce");  // hangs here
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kExitWatchdog),
      "hanging in collective at step 2(.|\n)*rank 0 on nodeB: watchdog: all_reduce of step 2");
}

}  // namespace
}  // namespace zaya::ft
