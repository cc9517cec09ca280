// `zaya bench infer` (bench/infer_bench.h): the command line of the GPU inference benchmark.
#include <CLI/CLI.hpp>

#include "bench/infer_bench.h"
#include "cli/command.h"

namespace zaya::cli {

int bench_infer_cli(int argc, char** argv);

int bench_infer_cli(int argc, char** argv) {
  CLI::App app{
      "GPU inference speed: prefill tokens/s, decode time per step vs the bandwidth roofline",
      "zaya bench infer"};
  bench::InferBenchOptions a;
  app.add_option("--preset", a.preset, "model preset (tiny, zaya1-base, zaya1-8b)");
  app.add_option("--layers", a.layers, "layers (default: the preset's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", a.batch, "sequences (1..8)")->check(CLI::Range(1, 8));
  app.add_option("--prompt", a.prompt, "prompt tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("--decode", a.decode, "timed decode steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed decode steps first")->check(CLI::PositiveNumber);
  app.add_option("--repeats", a.repeats, "timed prefill passes (median)")
      ->check(CLI::PositiveNumber);
  app.add_option("--copy-gbs", a.copy_gbs,
                 "device copy bandwidth for the roofline (GB/s, read + written bytes); 0 (the "
                 "default): measured on the device at start with zaya bench mem's copy kernel")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-graphs", a.no_graphs, "launch decode kernels one by one (no CUDA graph)");
  app.add_flag("--profile", a.profile, "also time one eager decode step by op class");
  app.add_flag("--ablate", a.ablate,
               "also time the decode step without each op class in turn (what each costs in the "
               "graph; the tokens decoded meanwhile are meaningless)");
  app.add_flag("--trace", a.trace,
               "also trace the decode graph: each kernel stamps the global timer as it passes its "
               "wait, and the gaps are summed per kernel-to-kernel transition (needs a build "
               "configured with -DZAYA_DECODE_TRACE=ON)");
  app.add_option("--json", a.json, "write the results as JSON");
  app.add_option("--seed", a.seed, "weights and prompt seed");
  app.add_option("--write-config", a.write_config,
                 "only write the benchmarked model's config.json here (for the peer) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return bench::run_infer_bench(a);
}

}  // namespace zaya::cli
