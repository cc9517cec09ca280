// The MPI part of launch.h: the job-wide abort.
#include <cstdio>
#include <cstdlib>

#include "core/cuda_check.h"
#include "dist/launch.h"

namespace zaya {

bool multi_process_available() {
  return true;
}

void abort_all_ranks(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace zaya
