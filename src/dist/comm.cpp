// Backend-independent parts of the communicator: reduction names and the world factory, which
// dispatches to the implementations compiled into this build.
#include "dist/comm.h"

#include <cstring>

#include "core/error.h"
#include "dist/comm_backends.h"

namespace zaya {

void Communicator::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

const char* redop_name(RedOp op) {
  switch (op) {
    case RedOp::Sum: return "sum";
    case RedOp::Prod: return "prod";
    case RedOp::Max: return "max";
    case RedOp::Min: return "min";
  }
  return "?";
}

RedOp redop_from_name(const std::string& s, const std::string& what) {
  for (RedOp op : {RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min})
    if (s == redop_name(op)) return op;
  fail("{}: unknown reduction '{}' (expected sum, prod, max or min)", what, s);
}

bool communicator_available(const std::string& backend) {
#ifdef ZAYA_HAVE_MPI
  if (backend == "mpi") return true;
#endif
#ifdef ZAYA_HAVE_NCCL
  if (backend == "nccl") return true;
#endif
  return false;
}

std::unique_ptr<Communicator> make_world_communicator(const std::string& backend) {
  ZAYA_CHECK(backend == "mpi" || backend == "nccl",
             "unknown communication backend '{}' (expected mpi or nccl)", backend);
#ifdef ZAYA_HAVE_NCCL
  if (backend == "nccl") return detail::make_nccl_world();
#endif
#ifdef ZAYA_HAVE_MPI
  if (backend == "mpi") return detail::make_mpi_world();
#endif
  fail("backend '{}' is not compiled into this build of zaya (rebuild with {})", backend,
       backend == "nccl" ? "CUDA and NCCL" : "MPI");
}

}  // namespace zaya
