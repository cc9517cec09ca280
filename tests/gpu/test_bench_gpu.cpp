// GPU tests of `zaya bench gemm|mem` (label gpu; skipped without a CUDA device): the PTX kernels
// load and run, copies verify, and small GEMMs of every method match the CPU reference.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "bench/gemm_bench.h"
#include "bench/mem_bench.h"

namespace zaya::bench {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(BenchGpu, MemKernelsAndCopiesVerify) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  MemBenchOptions o;
  o.tests = parse_mem_tests("all");
  o.sizes = {1 << 20, 16 << 20};
  o.iters = 3;
  o.warmup = 1;
  const auto rs = run_mem_bench(o, query_device(0).peak_hbm_gbs);
  ASSERT_EQ(rs.size(), o.tests.size() * o.sizes.size());
  for (const auto& r : rs) {
    EXPECT_GT(r.gbs, 0) << r.test;
    EXPECT_LE(r.wrong, 0) << r.test;  // -1: not checked, 0: verified
  }
}

TEST(BenchGpu, GemmMethodsMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceInfo dev = query_device(0);
  GemmBenchOptions o;
  o.dtypes = {"bf16"};
  if (dev.cc_major * 10 + dev.cc_minor >= 89) o.dtypes.push_back("fp8");
  o.shapes = {{"a", 256, 512, 384}, {"b", 1000, 1040, 2048}, {"experts", 64, 256, 128, 4}};
  o.iters = 3;
  o.warmup = 1;
  const auto rs = run_gemm_bench(o);
  ASSERT_GE(rs.size(), 4u);
  for (const auto& r : rs) {
    EXPECT_GT(r.tflops, 0) << r.shape.name << " " << r.method;
    EXPECT_GT(r.checked, 0);
    EXPECT_EQ(r.wrong, 0) << r.shape.name << " " << r.dtype << " " << r.method
                          << " max_rel_err " << r.max_rel_err;
  }
}

}  // namespace
}  // namespace zaya::bench
