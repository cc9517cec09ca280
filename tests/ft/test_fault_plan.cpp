// PlannedFault plans (ft/fault_plan.h): written out per attempt, or drawn from a seed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "ft/fault_plan.h"

using namespace zaya::ft;

TEST(FaultPlan, ParsesAttemptItemsAndFiles) {
  auto p = FaultPlan::parse(
      "0:kill@rank=1,step=3 2:hang@rank=0,step=5,section=collective;"
      "sigkill@rank=1,step=7");
  EXPECT_EQ(p.for_attempt(0, 2, 0, 0).size(), 1u);
  EXPECT_TRUE(p.for_attempt(1, 2, 0, 0).empty());
  auto a2 = p.for_attempt(2, 2, 0, 0);
  ASSERT_EQ(a2.size(), 2u);
  EXPECT_EQ(a2[0].spec(), "hang@rank=0,step=5,section=collective");
  EXPECT_TRUE(a2[1].by_supervisor());
  EXPECT_EQ(join_specs(a2), "hang@rank=0,step=5,section=collective");

  const auto path = std::filesystem::temp_directory_path() / "zaya_fault_plan_test.txt";
  std::ofstream(path) << "# a drill\nexit@rank=0,step=2,arg=7\n-\n\n4: nan@rank=1,step=9\n"
                         "kill@rank=0,step=1\n";
  auto f = FaultPlan::parse(path.string());
  EXPECT_EQ(join_specs(f.for_attempt(0, 1, 0, 0)), "exit@rank=0,step=2,arg=7");
  EXPECT_TRUE(f.for_attempt(1, 1, 0, 0).empty());
  EXPECT_EQ(join_specs(f.for_attempt(4, 1, 0, 0)), "nan@rank=1,step=9");
  EXPECT_EQ(join_specs(f.for_attempt(5, 1, 0, 0)), "kill@rank=0,step=1");
  std::filesystem::remove(path);

  // Relative steps count from the newest checkpoint; written attempts replace random ones.
  auto rel = FaultPlan::parse("1:hang@rank=0,step=+2,section=data");
  EXPECT_EQ(join_specs(rel.for_attempt(1, 2, 7, 20)), "hang@rank=0,step=9,section=data");
  rel.add_random(parse_random_faults("seed=1,count=3,kinds=exit"));
  EXPECT_EQ(rel.for_attempt(0, 2, 7, 20).at(0).kind, "exit");
  EXPECT_EQ(rel.for_attempt(1, 2, 7, 20).at(0).kind, "hang");

  EXPECT_THROW(FaultPlan::parse("kill@rank=1,step=3"), zaya::Error);  // no attempt
  EXPECT_THROW(FaultPlan::parse("0:kill@rank=1"), zaya::Error);       // no step
  EXPECT_THROW(FaultPlan::parse("0:kill@rank=x,step=1"), zaya::Error);
}

TEST(FaultPlan, RandomIsDeterministicAndFiresAfterTheNewestCheckpoint) {
  auto r = parse_random_faults("seed=7,count=30,kinds=kill,hang:collective,exit,ranks=2");
  EXPECT_EQ(r.kinds, (std::vector<std::string>{"kill", "hang:collective", "exit"}));
  auto p = FaultPlan::random(r), q = FaultPlan::random(r);
  std::set<std::string> kinds;
  for (int a = 0; a < 30; a++) {
    auto f = p.for_attempt(a, 2, 10 + a, 50);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].spec(), q.for_attempt(a, 2, 10 + a, 50)[0].spec());
    EXPECT_GT(f[0].step, 10 + a);
    EXPECT_LE(f[0].step, 50);
    EXPECT_LT(f[0].rank, 2);
    kinds.insert(f[0].kind + f[0].rest);
  }
  EXPECT_EQ(kinds.size(), 3u);
  EXPECT_TRUE(p.for_attempt(30, 2, 0, 50).empty());  // count reached
  EXPECT_TRUE(p.for_attempt(0, 2, 50, 50).empty());  // nothing left to fail
  EXPECT_NE(FaultPlan::random(parse_random_faults("seed=8,count=30,kinds=kill,exit"))
                .for_attempt(3, 4, 0, 1000)[0]
                .spec(),
            FaultPlan::random(parse_random_faults("seed=9,count=30,kinds=kill,exit"))
                .for_attempt(3, 4, 0, 1000)[0]
                .spec());
  EXPECT_THROW(parse_random_faults("seed=1,kinds=kill"), zaya::Error);
  EXPECT_THROW(parse_random_faults("seed=1,count=2,kinds=kill,bogus=3"), zaya::Error);
  EXPECT_EQ(parse_random_faults("seed=1,count=2,kinds=kill,steps=3-9").last_step, 9);
}
