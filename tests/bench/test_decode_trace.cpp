#include <gtest/gtest.h>

#include <random>

#include "bench/decode_trace.h"
#include "core/error.h"

namespace zaya::bench {
namespace {

// Two layers of a three-kernel chain (a, b, c) then the step end (e), with known gaps, shuffled:
// the summary must recover each transition's gap, its count per step and the step time.
TEST(DecodeTrace, GapsPerTransitionFromShuffledStamps) {
  const std::vector<std::string> names = {"a", "b", "c", "e"};
  // gap after each event of one step: a->b 3 us, b->c 5, c->a 2 (between layers), c->e 7, e->a 11
  std::vector<std::pair<unsigned, uint64_t>> st;
  uint64_t t = 1000000;
  st.push_back({3, t});  // the step end before the first step
  const int steps = 4;
  for (int s = 0; s < steps; s++) {
    t += 11000, st.push_back({0, t});
    t += 3000, st.push_back({1, t});
    t += 5000, st.push_back({2, t});
    t += 2000, st.push_back({0, t});
    t += 3000, st.push_back({1, t});
    t += 5000, st.push_back({2, t});
    t += 7000, st.push_back({3, t});
  }
  st.push_back({0, t + 11000});  // a partial step after the last end: ignored
  std::mt19937 rng(7);
  std::shuffle(st.begin(), st.end(), rng);
  const TraceSummary s = summarize_decode_trace(st, names, 3);
  EXPECT_EQ(s.steps, steps);
  EXPECT_DOUBLE_EQ(s.step_us, 11 + 3 + 5 + 2 + 3 + 5 + 7);
  auto row = [&](const std::string& f, const std::string& to) {
    for (const auto& r : s.rows)
      if (r.from == f && r.to == to) return r;
    ADD_FAILURE() << "no transition " << f << " -> " << to;
    return TraceTransition{};
  };
  EXPECT_DOUBLE_EQ(row("a", "b").mean_us, 3);
  EXPECT_DOUBLE_EQ(row("a", "b").per_step, 2);
  EXPECT_DOUBLE_EQ(row("a", "b").total_us, 6);
  EXPECT_DOUBLE_EQ(row("b", "c").total_us, 10);
  EXPECT_DOUBLE_EQ(row("c", "a").per_step, 1);
  EXPECT_DOUBLE_EQ(row("c", "a").mean_us, 2);
  EXPECT_DOUBLE_EQ(row("c", "e").mean_us, 7);
  EXPECT_DOUBLE_EQ(row("e", "a").mean_us, 11);
  double total = 0;
  for (const auto& r : s.rows) total += r.total_us;
  EXPECT_DOUBLE_EQ(total, s.step_us);   // the transitions tile the step
  EXPECT_EQ(s.rows.front().from, "e");  // largest share first: e->a 11 us
}

TEST(DecodeTrace, RefusesTooFewStepEndsAndUnknownEvents) {
  const std::vector<std::string> names = {"a", "e"};
  EXPECT_THROW(summarize_decode_trace({{0, 1}, {1, 2}, {0, 3}}, names, 1), Error);
  EXPECT_THROW(summarize_decode_trace({{1, 1}, {5, 2}, {1, 3}}, names, 1), Error);
}

}  // namespace
}  // namespace zaya::bench
