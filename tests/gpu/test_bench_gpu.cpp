// GPU tests of `zaya bench gemm|mem` (label gpu; skipped without a CUDA device): the PTX kernels
// load and run (the spin kernel holds a stream for the time asked), copies verify, and small GEMMs
// of every method (autotuned cuBLASLt, cuBLAS default, loop, grouped) match the CPU reference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "bench/bench_kernels.h"
#include "bench/gemm_bench.h"
#include "bench/mem_bench.h"
#include "gpu_test_util.h"

namespace zaya::bench {
namespace {

using test_util::have_gpu;

// A timing policy short enough for tests (a few launches per row).
TimingPolicy quick_timing() {
  TimingPolicy t;
  t.min_iters = 3;
  t.max_iters = 10;
  t.warmup = 1;
  t.warm_ms = 1;
  t.min_time_ms = 1;
  return t;
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

TEST(BenchGpu, SpinHoldsTheStream) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t a, b;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(a, st), cudaSuccess);
  kernels::spin(2'000'000, st);  // 2 ms
  ASSERT_EQ(cudaEventRecord(b, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 1.9f);
  EXPECT_LT(ms, 50.0f);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(st);
}

TEST(BenchGpu, GemmMethodsMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceInfo dev = query_device(0);
  GemmBenchOptions o;
  o.dtypes = {"bf16"};
  if (dev.cc_major * 10 + dev.cc_minor >= 89) o.dtypes.push_back("fp8");
  o.shapes = {{"a", 256, 512, 384}, {"b", 1000, 1040, 2048}, {"experts", 64, 256, 128, 4}};
  o.timing = quick_timing();
  o.cublas_rows = true;
  const auto rs = run_gemm_bench(o);
  ASSERT_GE(rs.size(), 4u);
  int cublas = 0;
  for (const auto& r : rs) {
    EXPECT_GT(r.tflops, 0) << r.shape.name << " " << r.method;
    EXPECT_GT(r.checked, 0);
    EXPECT_EQ(r.wrong, 0) << r.shape.name << " " << r.dtype << " " << r.method << " max_rel_err "
                          << r.max_rel_err;
    EXPECT_GE(r.iters, 3);
    EXPECT_LE(r.iters, 10);
    EXPECT_GE(r.sets, 1);
    if (r.method == "lt" || r.method == "lt-batched") {
      EXPECT_GE(r.candidates, 1);
      EXPECT_GE(r.algo, 0);
      EXPECT_LT(r.algo, r.candidates);
    }
    if (r.method == "cublas") {
      ++cublas;
      EXPECT_EQ(r.dtype, "bf16");
    }
  }
  EXPECT_EQ(cublas, 3);  // one per bf16 shape, the grouped one as a strided batch
}

// The wider search (--search-algos) adds candidates beyond the heuristic's list, and the one it
// keeps still computes the right product.
TEST(BenchGpu, WideAlgorithmSearchAddsVerifiedCandidates) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  GemmBenchOptions o;
  o.dtypes = {"bf16"};
  o.shapes = {{"w", 1280, 1280, 4096}};
  o.timing = quick_timing();
  o.autotune = 4;
  o.search_per_algo = 0;
  const auto narrow = run_gemm_bench(o);
  o.search_per_algo = 4;
  const auto wide = run_gemm_bench(o);
  ASSERT_EQ(narrow.size(), 1u);
  ASSERT_EQ(wide.size(), 1u);
  EXPECT_LE(narrow[0].candidates, 4);
  EXPECT_GT(wide[0].candidates, narrow[0].candidates);
  EXPECT_LT(wide[0].algo, wide[0].candidates);
  EXPECT_GT(wide[0].checked, 0);
  EXPECT_EQ(wide[0].wrong, 0) << "max_rel_err " << wide[0].max_rel_err;

  // The kept algorithm, given back (as --algos-from does), is timed without autotuning: the same
  // algorithm, one candidate, still correct. A stored entry that is not an algorithm (wrong size)
  // is autotuned instead.
  ASSERT_FALSE(wide[0].algo_config.empty());
  EXPECT_FALSE(wide[0].algo_reused);
  o.fixed_algos[gemm_algo_key("bf16", o.shapes[0])] = wide[0].algo_config;
  const auto again = run_gemm_bench(o);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(again[0].algo_reused);
  EXPECT_EQ(again[0].candidates, 1);
  EXPECT_EQ(again[0].algo_config, wide[0].algo_config);
  EXPECT_EQ(again[0].algo_fields, wide[0].algo_fields);  // the same algorithm, described alike
  ASSERT_FALSE(wide[0].algo_fields.empty());
  EXPECT_EQ(wide[0].algo_fields[0].first, "id");
  EXPECT_EQ(again[0].wrong, 0);
  o.fixed_algos[gemm_algo_key("bf16", o.shapes[0])] = "00ff";
  const auto rejected = run_gemm_bench(o);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_FALSE(rejected[0].algo_reused);
  EXPECT_GT(rejected[0].candidates, 1);
  EXPECT_EQ(rejected[0].wrong, 0);
}

// --cuda-graph: the cuBLASLt row is timed from graph replays and says so; its sampled check
// zeroes the output and replays set 0's graph, so a graph that computed nothing fails it.
TEST(BenchGpu, CudaGraphRowsAreReplayedAndCorrect) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  GemmBenchOptions o;
  o.dtypes = {"bf16", "fp8"};
  o.shapes = {{"g", 512, 768, 1024}};
  o.timing = quick_timing();
  o.autotune = 2;
  o.search_per_algo = 0;
  o.graph_dtypes = {"fp8"};
  const auto rs = run_gemm_bench(o);
  ASSERT_GE(rs.size(), 1u);
  for (const auto& r : rs) {
    EXPECT_EQ(r.launch, r.dtype == "fp8" ? "cuda-graph" : "direct") << r.dtype;
    EXPECT_GT(r.time_us, 0);
    EXPECT_GT(r.checked, 0);
    EXPECT_EQ(r.wrong, 0) << r.dtype << " max_rel_err " << r.max_rel_err;
  }
}

}  // namespace
}  // namespace zaya::bench
