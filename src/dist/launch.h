// Process identity of a launched job: rank, world size and local rank (the rank's position among
// the ranks of its node, which picks its GPU), read from the launcher's environment (OpenMPI's
// mpirun, MPICH/Hydra's PMI, PMIx, Slurm's srun), so a process knows whether it is one of several
// before it initialises MPI. Without a launcher it is rank 0 of 1 and MPI is never touched.
// Also the job-wide stop: an error on one rank ends every rank (MPI_Abort after the message is
// printed), so no rank is left waiting in a collective.
// Deliberately not here: the communicators themselves (comm.h), device selection beyond
// "GPU = local rank".
#pragma once
#include <string>
#include <vector>

#include "core/error.h"

namespace zaya {

struct LaunchInfo {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string launcher = "none";  // "none", "openmpi", "pmi", "pmix", "slurm"
  bool launched() const { return launcher != "none"; }
};

// An error that every rank of the job raised at the same point (start-up checks whose outcome the
// ranks agreed on by an all-reduce): each rank reports it and exits normally, nobody is waiting.
// `code` is the exit status each rank returns (1 unless a stop with its own meaning, such as
// dist/ft_protocol.h's kExitNumerics).
class JobWideError : public Error {
 public:
  using Error::Error;
  JobWideError(const std::string& msg, int code) : Error(msg), code_(code) {}
  int code() const { return code_; }

 private:
  int code_ = 1;
};

// From the environment: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, PMI_RANK/PMI_SIZE
// (MPI_LOCALRANKID), PMIX_RANK, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NTASKS_PER_NODE.
// Throws zaya::Error for values that are not integers or out of range.
LaunchInfo detect_launch();

// This machine's host name (gethostname).
std::string local_host_name();

// The GPU counts that the ranks see, gathered in rank order with their host names: ranks on one
// host must agree (GPU = local rank only means something when they do; a disagreement is a
// CUDA_VISIBLE_DEVICES set per rank or a broken node). Throws zaya::Error naming the host, the
// counts and the ranks that see each; every rank reaches the same verdict from the same lists.
void check_gpus_per_node(const std::vector<std::string>& hosts, const std::vector<int>& gpus);

// Whether this build can run several ranks (it has MPI).
bool multi_process_available();

// Ends the whole job with `code`: MPI_Abort on MPI_COMM_WORLD when MPI is initialised (every rank
// is killed by the launcher), else std::exit. The caller prints its message first.
[[noreturn]] void abort_all_ranks(int code);

}  // namespace zaya
