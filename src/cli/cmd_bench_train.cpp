// `zaya bench train`: the command line of the training-step benchmark (bench/train_bench.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "bench/bench_common.h"
#include "bench/profile.h"
#include "bench/train_bench.h"
#include "core/error.h"
#include "dist/launch.h"

namespace zaya::cli {

int bench_train_cli(int argc, char** argv) {
  CLI::App app{
      "zaya bench train: the CUDA training step (forward + backward + AdamW/Muon) on random "
      "weights and tokens: tokens/s, model TFLOP/s, memory, time by op class",
      "zaya bench train"};
  bench::TrainBenchOptions a;
  app.add_option("--preset", a.preset, "model preset (tiny, zaya1-base, zaya1-8b)")
      ->capture_default_str();
  app.add_option("--layers", a.layers, "number of layers")->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per step")->capture_default_str();
  app.add_option("--seq", a.seq, "sequence length")->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps first")->capture_default_str();
  app.add_flag("--recompute", a.recompute, "recompute activations in backward");
  app.add_option("--optimizer", a.optimizer,
                 "adamw (every parameter, as the PyTorch peer) or muon (the ZAYA1 rules: Muon on "
                 "matrices, AdamW elsewhere)")
      ->check(CLI::IsMember({"adamw", "muon"}))
      ->capture_default_str();
  app.add_option("--ns-precision", a.ns_precision, "Muon Newton–Schulz GEMMs: bf16 or fp32")
      ->capture_default_str();
  app.add_option("--peak-tflops", a.peak_tflops, "bf16 GEMM peak the throughput is compared to")
      ->capture_default_str();
  app.add_option("--lr", a.lr, "learning rate of the optimizer steps")->capture_default_str();
  app.add_option("--seed", a.seed, "weights and tokens seed")->capture_default_str();
  app.add_option("--device", a.device, "CUDA device")->capture_default_str();
  app.add_option("--dp", a.dp,
                 "run the step through the data-parallel ZeRO-1 step over this communicator "
                 "(nccl or mpi; under mpirun every rank runs, rank 0 prints)")
      ->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_option("--bucket-elems", a.bucket_elems,
                 "with --dp: fp32 elements per rank per reduce-scatter / all-gather bucket")
      ->capture_default_str();
  app.add_option("--cp", a.cp,
                 "with --dp: context-parallel ranks per sequence (groups of adjacent ranks share "
                 "each sequence, two chunks per rank; --seq divisible by 2·cp)")
      ->capture_default_str();
  app.add_flag("--no-overlap", a.no_overlap,
               "with --dp: reduce every bucket after the backward instead of starting each as "
               "soon as its layers are done, and wait for the whole weight all-gather after the "
               "update instead of layer by layer in the next forward (nccl)");
  app.add_flag("--no-profile", a.no_profile, "skip the profiled step (op-class times)");
  app.add_option("--json", a.json, "write results as JSON to this file");
  app.add_option("--hardware", a.hardware,
                 "hardware profile (built-in name or measured JSON) for the cost-model comparison "
                 "(default: the built-in profile of this GPU, if any)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  }
  ZAYA_CHECK(a.layers > 0 && a.batch > 0 && a.seq > 1 && a.steps > 0 && a.warmup >= 0,
             "zaya bench train: --layers, --batch, --steps must be positive, --seq > 1, --warmup "
             ">= 0");
  ZAYA_CHECK(a.ns_precision == "bf16" || a.ns_precision == "fp32",
             "--ns-precision must be bf16 or fp32, got '{}'", a.ns_precision);
  ZAYA_CHECK(a.peak_tflops > 0, "--peak-tflops must be positive");
  ZAYA_CHECK(a.bucket_elems >= 1, "--bucket-elems must be >= 1");
  ZAYA_CHECK(a.cp >= 1, "--cp must be >= 1, got {}", a.cp);
  ZAYA_CHECK(a.cp == 1 || !a.dp.empty(),
             "zaya bench train --cp {}: context parallelism runs through the data-parallel step "
             "(add --dp mpi or --dp nccl and launch cp ranks per sequence with mpirun)",
             a.cp);
  ZAYA_CHECK(a.seq % (2 * a.cp) == 0,
             "zaya bench train: --seq {} is not divisible by 2·cp = {} (two chunks per rank)",
             a.seq, 2 * a.cp);
  const LaunchInfo li = detect_launch();
  ZAYA_CHECK(!li.launched() || li.world == 1 || !a.dp.empty(),
             "zaya bench train: launched as {} ranks but without --dp (each rank would run the "
             "plain step alone)",
             li.world);
  // Rank 0 prints; the other ranks' tables would interleave with it (errors still reach stderr).
  if (li.rank != 0 && !std::freopen("/dev/null", "w", stdout))
    fail("zaya bench train: rank {} cannot silence its stdout", li.rank);
  if (li.rank != 0) a.json.clear();
  if (li.rank == 0) bench::check_output_path("--json", a.json);
  return bench::run_train_bench(a);
}

}  // namespace zaya::cli
