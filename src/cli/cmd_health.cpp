// `zaya health`: the node checks of bench/health.h on every rank of a job (`mpirun -np N zaya
// health ...`, or one process), the reports gathered to rank 0, which prints a table (or --json)
// and one line per failed check; every rank exits 6 (kExitHealth) when any check failed anywhere,
// 0 when all passed. Supervised (ZAYA_SUPERVISOR set), each rank also sends its checks as a
// "health" event.
#include <CLI/CLI.hpp>

#include "bench/health.h"
#include "cli/command.h"
#include "core/error.h"
#include "dist/comm.h"
#include "dist/ft_protocol.h"
#include "dist/heartbeat.h"
#include "dist/launch.h"
#include "dist/watchdog.h"

namespace zaya::cli {

static int run_health_cmd(int argc, char** argv) {
  CLI::App app{
      "Check this node before a (re)start: GEMM throughput, memory bandwidth, a small all-reduce "
      "across the job, and the checkpoint directory (writable, free space). Exits 0 when every "
      "check passes on every rank, else 6 with one line per failed check",
      "zaya health"};
  bench::HealthOptions o;
  bool as_json = false;
  app.add_option("--device", o.device, "cpu (the CPU reference gemm, host memcpy) or cuda");
  app.add_option("--dir", o.dir, "the checkpoint directory to check (created when missing)");
  app.add_option("--min-free-gb", o.min_free_gb, "free space --dir must have, GiB (default 1)");
  app.add_option("--profile", o.profile,
                 "a zaya.hardware/1 profile (zaya bench ... --profile): GPU thresholds are "
                 "--profile-fraction of its measured bf16 peak and copy bandwidth");
  app.add_option("--profile-fraction", o.profile_fraction,
                 "fraction of the profile's figures a rank must reach (default 0.5)");
  app.add_option(
      "--min-gemm-gflops", o.min_gemm_gflops,
      "GEMM threshold, GFLOP/s (default: the profile's, else 0.5 on cpu, 50000 on cuda)");
  app.add_option("--min-mem-gbs", o.min_mem_gbs,
                 "memory bandwidth threshold, GB/s (default: the profile's, else 0.5 on cpu, 300 "
                 "on cuda)");
  app.add_option("--max-allreduce-ms", o.max_allreduce_ms,
                 "slowest 1 MiB all-reduce allowed, ms (default 2000)");
  app.add_option("--probe-seconds", o.probe_seconds,
                 "time per throughput probe, seconds (default 0.2)");
  app.add_flag("--json", as_json, "print the reports as JSON (schema zaya.health/1)");
  if (!parse_or_help(app, argc, argv)) return 0;

  const LaunchInfo li = detect_launch();
  std::unique_ptr<Communicator> world;
  if (li.launched() && li.world > 1) {
    ZAYA_CHECK(multi_process_available(),
               "launched as rank {} of {} ({}), but this zaya was built without MPI", li.rank,
               li.world, li.launcher);
    world = make_world_communicator("mpi");
  }
  const int rank = world ? world->rank() : 0;
  ft::start_watchdog(ft::collective_timeout_from_env(), rank, local_host_name());
  ft::start_reporting({rank, world ? world->size() : 1, local_host_name(), "health", 0});
  o.device_index = li.local_rank;
  const bench::HealthReport mine = bench::run_health(o, world.get());
  ft::send_event("health", {{"ok", mine.ok()}, {"checks", mine.to_json()["checks"]}});
  std::vector<bench::HealthReport> all;
  if (world) {
    for (const std::string& s : world->host_all_gather(mine.to_json().dump()))
      all.push_back(bench::HealthReport::from_json(nlohmann::json::parse(s)));
  } else {
    all.push_back(mine);
  }
  const auto failures = bench::health_failures(all);
  if (rank == 0) {
    if (as_json)
      fmt::print("{}\n", bench::health_json(all).dump(1));
    else
      fmt::print("{}", bench::health_table(all));
    for (const std::string& f : failures) fmt::print(stderr, "zaya health: {}\n", f);
  }
  const int code = failures.empty() ? ft::kExitCompleted : ft::kExitHealth;
  ft::finish_reporting(failures.empty() ? "completed" : "error", code);
  return code;
}

ZAYA_COMMAND("health", "check this node (GEMM, memory, all-reduce, checkpoint dir) before a run",
             run_health_cmd);

}  // namespace zaya::cli
