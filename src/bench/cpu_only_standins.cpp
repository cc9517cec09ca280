// The GPU benchmarks' entry points in a build without the CUDA backend (the CUDA build defines
// them in the *_cuda.cpp files beside this one): each says that this build cannot run it, so
// that the command line is the same in every build and chooses at run time.
#include "bench/gemm_bench.h"
#include "bench/infer_bench.h"
#include "bench/kernel_bench.h"
#include "bench/mem_bench.h"
#include "bench/train_bench.h"
#include "core/error.h"

namespace zaya::bench {

#if !defined(ZAYA_HAVE_CUDA)
namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(
      "{}: this zaya was built without CUDA (configure with -DZAYA_CUDA=ON on a machine with nvcc)",
      what);
}
}  // namespace

DeviceInfo query_device(int) {
  no_cuda("the GPU benchmarks");
}
std::vector<GemmResult> run_gemm_bench(const GemmBenchOptions&) {
  no_cuda("zaya bench gemm");
}
std::vector<MemResult> run_mem_bench(const MemBenchOptions&, double) {
  no_cuda("zaya bench mem");
}
std::vector<KernelTiming> run_kernel_bench(const KernelBenchOptions&, const DeviceInfo&) {
  no_cuda("zaya bench kernels");
}
int run_infer_bench(const InferBenchOptions&) {
  no_cuda("zaya bench infer");
}
int run_train_bench(const TrainBenchOptions&) {
  no_cuda("zaya bench train");
}
#endif

}  // namespace zaya::bench
