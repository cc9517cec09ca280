// Internal: factory functions of the communicator implementations, each defined in the file that is
// only built with its library (comm_mpi.cpp, comm_nccl.cpp). Use make_world_communicator instead.
#pragma once
#include <memory>

#include "dist/comm.h"

namespace zaya::detail {
#ifdef ZAYA_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_world();
#endif
#ifdef ZAYA_HAVE_NCCL
std::unique_ptr<Communicator> make_nccl_world();
#endif
}  // namespace zaya::detail
