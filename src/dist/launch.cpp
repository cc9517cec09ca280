// Launcher environment parsing (launch.h). MPI's part (the abort) is in launch_mpi.cpp; builds
// without MPI get the stand-ins at the end of this file.
#include "dist/launch.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <map>

#include "core/error.h"

namespace zaya {

namespace {

// The integer value of an environment variable, or `def` when unset.
int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  int out = 0;
  const char* end = v + std::char_traits<char>::length(v);
  auto [p, ec] = std::from_chars(v, end, out);
  ZAYA_CHECK(ec == std::errc() && p == end, "environment variable {}='{}' is not an integer", name,
             v);
  return out;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo li;
  if (env_set("OMPI_COMM_WORLD_SIZE")) {
    li.launcher = "openmpi";
    li.world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    li.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    li.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    li.local_world = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env_set("SLURM_PROCID") && env_set("SLURM_NTASKS") && env_set("SLURM_STEP_ID")) {
    // srun sets SLURM_STEP_ID; a batch script's own shell has SLURM_PROCID too but is one process.
    li.launcher = "slurm";
    li.world = env_int("SLURM_NTASKS", 1);
    li.rank = env_int("SLURM_PROCID", 0);
    li.local_rank = env_int("SLURM_LOCALID", 0);
    li.local_world = env_int("SLURM_NTASKS_PER_NODE", env_int("SLURM_STEP_NUM_TASKS", 1));
  } else if (env_set("PMI_SIZE")) {
    li.launcher = "pmi";
    li.world = env_int("PMI_SIZE", 1);
    li.rank = env_int("PMI_RANK", 0);
    li.local_rank = env_int("MPI_LOCALRANKID", 0);
    li.local_world = env_int("MPI_LOCALNRANKS", 1);
  } else if (env_set("PMIX_RANK")) {
    li.launcher = "pmix";
    li.rank = env_int("PMIX_RANK", 0);
    li.world = env_int("PMIX_SIZE", 1);  // the size comes from MPI once it is initialised
  }
  ZAYA_CHECK(li.world >= 1 && li.rank >= 0 && li.rank < li.world,
             "launcher ({}): rank {} is outside the world size {}", li.launcher, li.rank, li.world);
  ZAYA_CHECK(li.local_rank >= 0, "launcher ({}): local rank {} is negative", li.launcher,
             li.local_rank);
  return li;
}

std::string local_host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

void check_gpus_per_node(const std::vector<std::string>& hosts, const std::vector<int>& gpus) {
  ZAYA_CHECK(hosts.size() == gpus.size(), "GPU check: {} host names for {} GPU counts",
             hosts.size(), gpus.size());
  // host → GPU count → ranks, in rank order (std::map keeps the message deterministic)
  std::map<std::string, std::map<int, std::vector<int>>> seen;
  for (size_t r = 0; r < hosts.size(); r++) seen[hosts[r]][gpus[r]].push_back(int(r));
  for (const auto& [host, by_count] : seen) {
    if (by_count.size() < 2) continue;
    std::string parts;
    for (const auto& [count, ranks] : by_count) {
      std::string list;
      for (int r : ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
      parts += fmt::format("{}{} GPU(s) for rank(s) {}", parts.empty() ? "" : "; ", count, list);
    }
    fail(
        "mixed GPU counts on host {}: {} (ranks on one node must see the same devices: check "
        "CUDA_VISIBLE_DEVICES and the launcher's GPU binding)",
        host, parts);
  }
}

#if !defined(ZAYA_HAVE_MPI)
bool multi_process_available() {
  return false;
}

void abort_all_ranks(int code) {
  std::exit(code);
}
#endif

}  // namespace zaya
