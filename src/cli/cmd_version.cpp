// `zaya version`: the build's version and which optional backends were compiled in.
#include <fmt/format.h>

#include "cli/command.h"
#ifdef ZAYA_HAVE_CUDA
#include "backend/cuda/decode/decode_kernels.h"
#endif

static int run_version(int, char**) {
#ifdef ZAYA_HAVE_CUDA
  const bool cuda = true;
  const bool trace = zaya::cuda::decode_trace_built();
#else
  const bool cuda = false;
  const bool trace = false;
#endif
#ifdef ZAYA_HAVE_MPI
  const bool mpi = true;
#else
  const bool mpi = false;
#endif
  fmt::print("zaya 0.1.0 (cuda: {}, mpi: {}{})\n", cuda ? "yes" : "no", mpi ? "yes" : "no",
             trace ? ", decode trace" : "");
  return 0;
}
ZAYA_COMMAND("version", "print the version and the compiled-in backends", run_version);
