// RunConfig's [parallel] section: defaults, validation, and resolve_parallel against a world size
// (dp dividing it, backend resolution, global batches divisible by micro_batch × dp).
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "train/run_config.h"

using namespace zaya;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a zaya::Error";
  return "";
}

TEST(RunConfigParallel, DefaultsResolveToTheWorldSize) {
  RunConfig c = RunConfig::defaults();
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(c.parallel.backend, "auto");
  auto r = c.resolve_parallel(4);
  EXPECT_EQ(r.dp, 4);
  EXPECT_EQ(r.backend, "mpi");  // train.device = cpu
  EXPECT_EQ(r.bucket_elems, int64_t(25) << 18);
  RunConfig g = RunConfig::defaults({"--train.device=cuda"});
  EXPECT_EQ(g.resolve_parallel(2).backend, "nccl");
  RunConfig m = RunConfig::defaults({"--train.device=cuda", "--parallel.backend=mpi"});
  EXPECT_EQ(m.resolve_parallel(2).backend, "mpi");
  // Round trip through TOML keeps the section.
  RunConfig back = RunConfig::from_toml(m.to_toml());
  EXPECT_EQ(back.parallel.backend, "mpi");
}

TEST(RunConfigParallel, BadValuesNameTheField) {
  EXPECT_NE(error_of([] { RunConfig::defaults({"--parallel.dp=-1"}); }).find("parallel.dp"),
            std::string::npos);
  EXPECT_NE(error_of([] { RunConfig::defaults({"--parallel.backend=gloo"}); })
                .find("parallel.backend"),
            std::string::npos);
  EXPECT_NE(error_of([] { RunConfig::defaults({"--parallel.backend=nccl"}); }).find("NCCL"),
            std::string::npos);
  EXPECT_NE(error_of([] { RunConfig::defaults({"--parallel.bucket_mb=0"}); })
                .find("parallel.bucket_mb"),
            std::string::npos);
}

TEST(RunConfigParallel, DpMustDivideAndEqualTheWorld) {
  RunConfig c = RunConfig::defaults({"--parallel.dp=2"});
  EXPECT_NE(error_of([&] { c.resolve_parallel(3); }).find("does not divide the world size 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.resolve_parallel(4); }).find("set parallel.dp = 4"),
            std::string::npos);
  EXPECT_EQ(c.resolve_parallel(2).dp, 2);
}

TEST(RunConfigParallel, GlobalBatchMustBeWholeMicroBatchesPerRank) {
  RunConfig c = RunConfig::from_toml(R"(
[train]
micro_batch = 2
[[phase]]
name = "a"
batch_size = 12
)");
  EXPECT_EQ(c.resolve_parallel(3).dp, 3);
  EXPECT_NE(error_of([&] { c.resolve_parallel(4); })
                .find("batch_size = 12 (global sequences per step) is not divisible by "
                      "train.micro_batch × parallel.dp = 2 × 4 = 8"),
            std::string::npos);
}

}  // namespace
