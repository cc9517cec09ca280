// The stand-in of run_infer_bench for a build without the CUDA backend (the CUDA build defines it
// in infer_bench_cuda.cpp), so that the command line chooses at run time.
#include "bench/infer_bench.h"

#include "core/error.h"

namespace zaya::bench {

#if !defined(ZAYA_HAVE_CUDA)
int run_infer_bench(const InferBenchOptions&) {
  fail("zaya bench infer: this build has no CUDA backend (configure with -DZAYA_CUDA=ON on a "
       "machine with nvcc)");
}
#endif

}  // namespace zaya::bench
