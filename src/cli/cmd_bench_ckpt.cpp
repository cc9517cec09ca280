// `zaya bench ckpt`: the command line of the checkpoint benchmark (bench/ckpt_bench.h).
#include <CLI/CLI.hpp>
#include <iostream>

#include "bench/ckpt_bench.h"
#include "bench/profile.h"

namespace zaya::cli {

int bench_ckpt_cli(int argc, char** argv) {
  CLI::App app{
      "zaya bench ckpt: the cost of a training checkpoint (the loop's stall per save, the "
      "background writer's bandwidth) against the disk's own sequential write bandwidth",
      "zaya bench ckpt"};
  bench::CkptBenchOptions a;
  app.add_option("--preset", a.preset, "model preset (tiny, zaya1-base, zaya1-8b)")
      ->capture_default_str();
  app.add_option("--layers", a.layers, "number of layers")->capture_default_str();
  app.add_option("--device", a.device, "cpu or cuda: where the step keeps its state")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--dir", a.dir,
                 "a new directory on the disk to measure (created, and removed afterwards)")
      ->capture_default_str();
  app.add_option("--saves", a.saves, "timed saves")->capture_default_str();
  app.add_option("--staging-mb", a.staging_mb,
                 "staging budget in MiB, as [checkpoint] staging_mb (0: one save's size)")
      ->capture_default_str();
  app.add_option("--snapshot", a.snapshot,
                 "where a GPU step's snapshot goes, as [checkpoint] snapshot: device (GPU "
                 "memory), host (page-locked host memory) or auto")
      ->check(CLI::IsMember({"auto", "device", "host"}))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "weights seed")->capture_default_str();
  app.add_option("--json", a.json, "write results as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  }
  bench::check_output_path("--json", a.json);
  return bench::run_ckpt_bench(a);
}

}  // namespace zaya::cli
