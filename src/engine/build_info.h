// What this build of libzaya contains: its version and the optional backends compiled in, for
// `zaya version` and for callers that choose a path at run time instead of with #if.
#pragma once
#include <string>

namespace zaya {

struct BuildInfo {
  std::string version;
  bool cuda = false;          // the CUDA backend (kernels, CUDA training step, CUDA decoder)
  bool mpi = false;           // MPI communicators
  bool nccl = false;          // NCCL communicators
  bool decode_trace = false;  // the CUDA decode kernels' trace (-DZAYA_DECODE_TRACE=ON)
};

BuildInfo build_info();

}  // namespace zaya
