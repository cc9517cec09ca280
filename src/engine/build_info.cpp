// build_info(): the one place that turns the build's feature macros into values. ZAYA_VERSION
// (the CMake project's version) is defined for this file alone.
#include "engine/build_info.h"

#if defined(ZAYA_HAVE_CUDA)
#include "backend/cuda/decode/decode_kernels.h"
#endif

namespace zaya {

BuildInfo build_info() {
  BuildInfo b;
  b.version = ZAYA_VERSION;
#if defined(ZAYA_HAVE_CUDA)
  b.cuda = true;
  b.decode_trace = cuda::decode_trace_built();
#endif
#if defined(ZAYA_HAVE_MPI)
  b.mpi = true;
#endif
#if defined(ZAYA_HAVE_NCCL)
  b.nccl = true;
#endif
  return b;
}

}  // namespace zaya
