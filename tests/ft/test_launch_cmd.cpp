// The launch-command rewriting of ft/launch_cmd.h: pure functions over argvs of mpirun, srun and
// a bare zaya.
#include <gtest/gtest.h>

#include "core/error.h"
#include "ft/launch_cmd.h"

using namespace zaya::ft;

namespace {
Argv mpi() {
  return {"mpirun",   "-np",    "4",     "--oversubscribe", "build/zaya",     "train",
          "--config", "f.toml", "--out", "runs/x",          "--optim.lr=1e-3"};
}
}  // namespace

TEST(LaunchCmd, ParsesTheZayaExecutableAndItsOptions) {
  const auto c = LaunchCommand::parse(mpi());
  EXPECT_EQ(c.launcher, LauncherKind::Mpirun);
  EXPECT_EQ(c.zaya, 4u);
  EXPECT_EQ(c.subcommand, "train");
  EXPECT_EQ(c.zaya_option("--out"), "runs/x");
  EXPECT_EQ(c.zaya_option("--resume"), std::nullopt);
  EXPECT_EQ(c.config_overrides(), std::vector<std::string>{"--optim.lr=1e-3"});
  EXPECT_EQ(c.world(), 4);
  const auto bare = LaunchCommand::parse({"/opt/zaya", "train", "--out=d"});
  EXPECT_EQ(bare.launcher, LauncherKind::None);
  EXPECT_EQ(bare.zaya_option("--out"), "d");
  EXPECT_EQ(bare.world(), 1);
  EXPECT_THROW(LaunchCommand::parse({"mpirun", "-np", "2", "python3", "x.py"}), zaya::Error);
  EXPECT_THROW(LaunchCommand::parse({"mpirun", "zaya", "--quiet"}), zaya::Error);
  EXPECT_EQ(LaunchCommand::parse({"mpirun", "-np", "2", "/b/zz", "train"}, "/b/zz").zaya, 3u);
}

TEST(LaunchCmd, AddsResumeAutoOnce) {
  auto c = with_resume_auto(LaunchCommand::parse(mpi()));
  ASSERT_GE(c.argv.size(), 2u);
  EXPECT_EQ(c.argv[c.argv.size() - 2], "--resume");
  EXPECT_EQ(c.argv.back(), "auto");
  EXPECT_EQ(with_resume_auto(c).argv, c.argv);
  auto explicit_path = LaunchCommand::parse({"zaya", "train", "--resume=ck/step-4"});
  EXPECT_EQ(with_resume_auto(explicit_path).argv, explicit_path.argv);
}

TEST(LaunchCmd, RewritesTheWorldSize) {
  auto c = with_world(LaunchCommand::parse(mpi()), 3);
  EXPECT_EQ(c.argv[2], "3");
  EXPECT_EQ(c.world(), 3);
  auto inserted = with_world(LaunchCommand::parse({"mpirun", "zaya", "train"}), 2);
  EXPECT_EQ(inserted.argv, (Argv{"mpirun", "-np", "2", "zaya", "train"}));
  EXPECT_EQ(inserted.zaya, 3u);
  auto s1 = with_world(LaunchCommand::parse({"srun", "-N", "2", "--ntasks=8", "zaya", "train"}), 6);
  EXPECT_EQ(s1.argv[3], "--ntasks=6");
  auto s2 = with_world(LaunchCommand::parse({"srun", "-n8", "zaya", "train"}), 4);
  EXPECT_EQ(s2.argv[1], "-n4");
  auto s3 = with_world(LaunchCommand::parse({"srun", "zaya", "train"}), 4);
  EXPECT_EQ(s3.argv, (Argv{"srun", "--ntasks=4", "zaya", "train"}));
  auto m2 = with_world(LaunchCommand::parse({"mpiexec", "-n", "8", "zaya", "train"}), 7);
  EXPECT_EQ(m2.argv[2], "7");
  EXPECT_THROW(with_world(LaunchCommand::parse({"zaya", "train"}), 2), zaya::Error);
  EXPECT_EQ(with_world(LaunchCommand::parse({"zaya", "train"}), 1).argv, (Argv{"zaya", "train"}));
}

TEST(LaunchCmd, ExcludesHosts) {
  bool done = false;
  auto s =
      with_excluded_hosts(LaunchCommand::parse({"srun", "--nodes=4", "-x", "n9", "zaya", "train"}),
                          {"n2", "n9"}, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(s.argv, (Argv{"srun", "--nodes=3", "-x", "n9,n2", "zaya", "train"}));
  auto s2 = with_excluded_hosts(LaunchCommand::parse({"srun", "zaya", "train"}), {"a", "b"}, &done);
  EXPECT_EQ(s2.argv, (Argv{"srun", "--exclude=a,b", "zaya", "train"}));
  EXPECT_EQ(s2.zaya, 2u);
  auto m = with_excluded_hosts(
      LaunchCommand::parse({"mpirun", "-H", "a:2,b:2,c:2", "zaya", "train"}), {"b"}, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(m.argv[2], "a:2,c:2");
  with_excluded_hosts(LaunchCommand::parse(mpi()), {"localhost"}, &done);
  EXPECT_FALSE(done);  // one node: the caller lowers -np
}

TEST(LaunchCmd, ForwardsTheEnvironmentThroughMpirunAndDerivesHealth) {
  auto c = with_forwarded_env(LaunchCommand::parse(mpi()), {"ZAYA_SUPERVISOR", "ZAYA_FAULTS"});
  EXPECT_EQ(Argv(c.argv.begin(), c.argv.begin() + 5),
            (Argv{"mpirun", "-x", "ZAYA_SUPERVISOR", "-x", "ZAYA_FAULTS"}));
  EXPECT_EQ(c.argv[c.zaya], "build/zaya");
  auto srun = LaunchCommand::parse({"srun", "zaya", "train"});
  EXPECT_EQ(with_forwarded_env(srun, {"A"}).argv, srun.argv);
  auto h = health_command(LaunchCommand::parse(mpi()), "runs/x/checkpoints", {"--quick"});
  EXPECT_EQ(h.argv, (Argv{"mpirun", "-np", "4", "--oversubscribe", "build/zaya", "health", "--dir",
                          "runs/x/checkpoints", "--quick"}));
  EXPECT_EQ(show_argv({"a b", "c"}), "'a b' c");
}
