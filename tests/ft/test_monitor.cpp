// The supervisor's view of the ranks (ft/monitor.h), driven by messages with made-up arrival
// times: hangs and who lags, deaths, numerics, stragglers.
#include <gtest/gtest.h>

#include "ft/monitor.h"

using namespace zaya::ft;
using nlohmann::json;

namespace {
json msg(const char* type, int rank, int world, json extra = json::object()) {
  json m = {
      {"type", type},      {"rank", rank}, {"world", world}, {"host", "h" + std::to_string(rank)},
      {"pid", 100 + rank}, {"attempt", 0}, {"t", 0.0}};
  m.update(extra);
  return m;
}
json beat(int rank, int world, int step, const char* section, double step_s = -1) {
  json e = {{"step", step}, {"section", section}};
  e["step_s"] = step_s > 0 ? json(step_s) : json();
  return msg("beat", rank, world, e);
}
// A monitor over `world` ranks that said hello from step 0 at t = 0 (`settings` sets its fields).
struct Watch {
  StepTimes times;
  AttemptMonitor m;
  template <typename F>
  Watch(int world, F settings) : m(make(settings), 0, &times) {
    for (int r = 0; r < world; r++) m.on_message(r, msg("hello", r, world, {{"step", 0}}), 0);
  }
  template <typename F>
  static MonitorSettings make(F settings) {
    MonitorSettings s;
    settings(s);
    return s;
  }
};
}  // namespace

TEST(Monitor, NamesTheRankThatStoppedFirst) {
  Watch w(3, [](MonitorSettings& s) {
    s.hang_min = 2;
    s.hang_factor = 4;
  });
  AttemptMonitor& m = w.m;
  for (int step = 1; step <= 4; step++)
    for (int r = 0; r < 3; r++) m.on_message(r, beat(r, 3, step, "forward", 1.0), step);
  EXPECT_DOUBLE_EQ(m.step_timeout(), 4.0);  // 4 x the median step time of 1 s
  // Rank 1 stays in backward at step 5; ranks 0 and 2 go on to the collective and wait there.
  for (int r = 0; r < 3; r++) m.on_message(r, beat(r, 3, 5, "backward", 1.0), 5);
  m.on_message(0, beat(0, 3, 5, "collective"), 5.5);
  m.on_message(2, beat(2, 3, 5, "collective"), 5.6);
  for (double t = 6; t < 9.4; t += 1)
    for (int r = 0; r < 3; r++)
      m.on_message(r, beat(r, 3, 5, r == 1 ? "backward" : "collective"), t);
  EXPECT_FALSE(m.check_hang(8.9));
  auto f = m.check_hang(9.1);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->cause, kCauseHang);
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->host, "h1");
  EXPECT_EQ(f->section, "backward");
  EXPECT_NEAR(f->detect_s, 4.1, 1e-9);
  EXPECT_NE(f->message.find("rank 0: step 5 collective"), std::string::npos);
}

TEST(Monitor, SectionSecondsShowChangesThatBeatsMissed) {
  // Rank 0 hangs in the optimizer; rank 1 passed through its optimizer between two beats and now
  // waits in the next collective: its section_s says it entered it after rank 0 stopped.
  Watch w(2, [](MonitorSettings& s) { s.hang_min = 2; });
  AttemptMonitor& m = w.m;
  m.on_message(1, beat(1, 2, 3, "collective"), 1.0);
  m.on_message(0, beat(0, 2, 3, "optimizer"), 1.2);
  json b = beat(1, 2, 3, "collective");
  b["section_s"] = 0.5;
  m.on_message(1, b, 2.0);  // entered its collective again at 1.5
  auto f = m.check_hang(3.3);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 0);
  EXPECT_EQ(f->section, "optimizer");
}

TEST(Monitor, BlamesTheRankOutsideTheCollectiveOrBehindInSteps) {
  Watch w(2, [](MonitorSettings& s) { s.hang_min = 1; });
  AttemptMonitor& m = w.m;
  m.on_message(0, beat(0, 2, 4, "collective"), 1.0);  // waits for rank 1 since t = 1
  m.on_message(1, beat(1, 2, 4, "optimizer"), 1.1);
  auto f = m.check_hang(2.5);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 1);
  m.on_message(0, beat(0, 2, 5, "data"), 3.0);  // a step ahead
  m.on_message(1, beat(1, 2, 4, "optimizer"), 3.0);
  EXPECT_EQ(m.check_hang(4.5)->rank, 1);
}

TEST(Monitor, CheckpointAndStartupHaveTheirOwnTimeouts) {
  MonitorSettings s;
  s.hang_min = 1;
  s.ckpt_timeout = 10;
  s.startup_timeout = 20;
  StepTimes times;
  AttemptMonitor m(s, 0, &times);
  m.on_message(0, msg("hello", 0, 2, {{"step", 0}}), 0);
  EXPECT_FALSE(m.check_hang(19));  // rank 0 in startup, rank 1 not connected yet
  auto never = m.check_hang(21);
  ASSERT_TRUE(never);
  EXPECT_EQ(never->rank, 0);  // its startup section timed out first
  m.on_message(1, msg("hello", 1, 2, {{"step", 0}}), 1);
  m.on_message(0, beat(0, 2, 3, "checkpoint"), 2);
  m.on_message(1, beat(1, 2, 3, "checkpoint"), 2);
  EXPECT_FALSE(m.check_hang(11.5));
  auto f = m.check_hang(12.5);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->section, "checkpoint");
}

TEST(Monitor, DeathsErrorsAndNumerics) {
  StepTimes times;
  AttemptMonitor m(MonitorSettings{}, 0, &times);
  m.on_message(7, msg("hello", 0, 2, {{"step", 4}}), 0);
  m.on_message(8, msg("hello", 1, 2, {{"step", 4}}), 0);
  EXPECT_EQ(m.start_step(), 4);
  m.on_message(7, msg("event", 0, 2, {{"event", "fault_injected"}, {"step", 5}}), 1.0);
  auto died = m.on_close(7, 1.25);
  ASSERT_TRUE(died);
  EXPECT_EQ(died->cause, kCauseDied);
  EXPECT_EQ(died->rank, 0);
  EXPECT_DOUBLE_EQ(died->detect_s, 0.25);
  auto n = m.on_message(8, msg("event", 1, 2, {{"event", "nonfinite"}, {"step", 6}}), 2);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].cause, kCauseNumerics);
  EXPECT_EQ(n[0].step, 6);
  auto b = m.on_message(8, msg("bye", 1, 2, {{"status", "error"}, {"code", 2}, {"step", 6}}), 2);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].cause, kCauseBadConfig);
  EXPECT_FALSE(m.on_close(8, 3));  // it said bye
  // Malformed messages are ignored.
  EXPECT_TRUE(m.on_message(9, json::array(), 3).empty());
  EXPECT_TRUE(m.on_message(9, json{{"type", "beat"}, {"rank", "x"}}, 3).empty());
}

TEST(Monitor, FlagsAPersistentStraggler) {
  Watch w(3, [](MonitorSettings& s) {
    s.straggler_window = 4;
    s.straggler_windows = 2;
  });
  AttemptMonitor& m = w.m;
  std::vector<Finding> found;
  for (int step = 1; step <= 13; step++)
    for (int r = 0; r < 3; r++) {
      json b = beat(r, 3, step, "data", 1.0);
      // Rank 2 is 30% slower from step 1 on; rank 0 is 5% slower (under the threshold).
      b["busy_s"] = r == 2 ? 0.65 : r == 0 ? 0.525 : 0.5;
      for (auto& f : m.on_message(r, b, step)) found.push_back(f);
    }
  ASSERT_EQ(found.size(), 1u);  // reported once
  EXPECT_EQ(found[0].cause, "straggler");
  EXPECT_EQ(found[0].rank, 2);
  EXPECT_EQ(found[0].step, 8);  // the end of the second slow window
}

TEST(Monitor, StragglerFromObservedComputeTime) {
  // Without busy_s: the time from a step's first beat to its first collective beat.
  Watch w(2, [](MonitorSettings& s) {
    s.straggler_window = 2;
    s.straggler_windows = 1;
  });
  AttemptMonitor& m = w.m;
  std::vector<Finding> found;
  for (int step = 1; step <= 3; step++)
    for (int r = 0; r < 2; r++) {
      const double t0 = step * 10.0;
      for (auto& f : m.on_message(r, beat(r, 2, step, "data"), t0)) found.push_back(f);
      m.on_message(r, beat(r, 2, step, "collective"), t0 + (r == 1 ? 2.0 : 1.0));
    }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 1);
}

TEST(Monitor, StragglerAgainstRanksThatMeasureNothing) {
  // The other rank's first beat of each step is already in the collective: 0 s of compute.
  Watch w(2, [](MonitorSettings& s) {
    s.straggler_window = 2;
    s.straggler_windows = 2;
  });
  std::vector<Finding> found;
  for (int step = 1; step <= 5; step++) {
    const double t0 = 2.0 * step;
    for (auto& f : w.m.on_message(0, beat(0, 2, step, "collective"), t0)) found.push_back(f);
    for (auto& f : w.m.on_message(1, beat(1, 2, step, "forward"), t0)) found.push_back(f);
    w.m.on_message(1, beat(1, 2, step, "collective"), t0 + 0.5);
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 1);
}

TEST(Monitor, CheckpointTimeIsNotComputeTime) {
  // Rank 0 spends 1 s of every step in a checkpoint section, rank 1 none: not a straggler.
  Watch w(2, [](MonitorSettings& s) {
    s.straggler_window = 2;
    s.straggler_windows = 1;
  });
  std::vector<Finding> found;
  for (int step = 1; step <= 5; step++) {
    const double t0 = 2.0 * step;
    for (int r = 0; r < 2; r++) {
      for (auto& f : w.m.on_message(r, beat(r, 2, step, "data"), t0)) found.push_back(f);
      if (r == 0) w.m.on_message(r, beat(r, 2, step, "checkpoint"), t0 + 0.1);
      w.m.on_message(r, beat(r, 2, step, "forward"), t0 + (r == 0 ? 1.1 : 0.1));
      w.m.on_message(r, beat(r, 2, step, "collective"), t0 + (r == 0 ? 1.4 : 0.4));
    }
  }
  EXPECT_TRUE(found.empty());
  EXPECT_NEAR(w.m.ranks().at(0).busy.at(3), 0.4, 1e-9);
}

TEST(Monitor, StragglerWhoseCollectivesBeatsMissed) {
  // Data parallelism: both ranks' steps take 2 s. Rank 0 waits 1.5 s in each collective; rank 1
  // arrives last and its collectives are too short to be seen: its compute time is the step.
  Watch w(2, [](MonitorSettings& s) {
    s.straggler_window = 2;
    s.straggler_windows = 1;
  });
  AttemptMonitor& m = w.m;
  std::vector<Finding> found;
  for (int step = 1; step <= 3; step++) {
    const double t0 = 2.0 * step;
    for (int r = 0; r < 2; r++)
      for (auto& f : m.on_message(r, beat(r, 2, step, "data", step > 1 ? 2.0 : -1), t0))
        found.push_back(f);
    json c = beat(0, 2, step, "collective");
    c["section_s"] = 1.0;
    m.on_message(0, c, t0 + 1.5);  // in it since t0 + 0.5
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 1);
}
