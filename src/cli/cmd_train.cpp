// `zaya train`: the main job. With no arguments it trains the `tiny` preset on the built-in Brown
// corpus (configs/tiny.toml's settings are the defaults) and leaves a model that `zaya generate`
// can run. Any config key can be overridden: --optim.lr=3e-4, --train.steps=200, ...
// `--device cuda` (or --train.device=cuda) trains on the GPU when the binary has the CUDA backend.
// Under a launcher (`mpirun -np N zaya train ...`, `srun zaya train ...`) every rank runs this;
// rank 0 alone prints the summary, and an error on any rank names the rank and host and ends the
// whole job (docs/TRAINING.md, "Several processes").
#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>

#include "cli/command.h"
#include "core/log.h"
#include "core/source_dir.h"
#include "dist/heartbeat.h"
#include "dist/launch.h"
#include "train/trainer.h"

namespace zaya::cli {

static int run_train_rank(int argc, char** argv) {
  // Split "--section.key=value" overrides from the ordinary flags.
  std::vector<std::string> overrides;
  std::vector<char*> rest;
  for (int i = 0; i < argc; i++) {
    if (i > 0 && is_config_override(argv[i]))
      overrides.push_back(argv[i]);
    else
      rest.push_back(argv[i]);
  }
  CLI::App app{"Train a ZAYA1-style model (CPU reference or CUDA backend)", "zaya train"};
  std::string config, out = "runs/tiny-brown", resume, device;
  double peak_tflops = 790.0;
  int64_t steps = -1;
  bool quiet = false;
  app.add_option("--config", config, "TOML run config (default: the built-in tiny/Brown run)");
  app.add_option("--steps", steps, "optimizer steps (overrides train.steps)");
  app.add_option("--out", out, "output directory (checkpoints, metrics.jsonl, model/)");
  app.add_option("--resume", resume,
                 "'auto' (newest valid checkpoint in --out) or a checkpoint path");
  app.add_option("--device", device, "cpu or cuda (overrides train.device)");
  app.add_option(
      "--peak-tflops", peak_tflops,
      "bf16 peak TFLOP/s that MFU is quoted against on the GPU (default: measured H200)");
  app.add_flag("--quiet", quiet, "no per-step progress");
  if (!parse_or_help(app, int(rest.size()), rest.data())) return 0;
  ZAYA_CHECK(device.empty() || device == "cpu" || device == "cuda",
             "--device {}: expected cpu or cuda", device);
  ZAYA_CHECK(peak_tflops > 0, "--peak-tflops must be positive, got {}", peak_tflops);
  if (!device.empty()) overrides.push_back("--train.device=" + device);
  if (steps >= 0) overrides.push_back("--train.steps=" + std::to_string(steps));
  TrainOptions o;
  if (config.empty()) {
    // The built-in default run is configs/tiny.toml of the source tree this binary was built from.
    const std::string builtin = zaya::source_dir() + "/configs/tiny.toml";
    ZAYA_CHECK(std::filesystem::exists(builtin),
               "no --config given and the built-in default {} is missing", builtin);
    config = builtin;
  }
  o.config = RunConfig::load(config, overrides);
  o.out_dir = out;
  o.resume = resume;
  o.quiet = quiet;
  o.peak_tflops = peak_tflops;
  TrainResult r = train(o);
  if (detect_launch().rank != 0) return 0;
  fmt::print(
      "{{\"steps\": {}, \"tokens\": {}, \"first_loss\": {:.6f}, \"last_loss\": {:.6f}, "
      "\"eval_loss\": {:.6f}, \"unigram_entropy\": {:.6f}, \"seconds\": {:.1f}, \"skipped_steps\": "
      "{}, "
      "\"checkpoint\": \"{}\", \"model\": \"{}\"}}\n",
      r.steps, r.tokens, r.first_loss, r.last_loss, r.eval_loss, r.unigram_entropy, r.seconds,
      r.skipped_steps, r.final_checkpoint, r.model_dir);
  return 0;
}

// Errors of a launched job: every rank's message names it; an error only some ranks raised ends
// the job through MPI_Abort, so no rank is left waiting in a collective. Exit codes follow
// dist/ft_protocol.h (2: the configuration, 3: numerics, 1: anything else), and a supervised rank
// says goodbye (with the code) before it returns.
static int run_train(int argc, char** argv) {
  LaunchInfo li;
  try {
    li = detect_launch();
  } catch (const Error& e) {
    fmt::print(stderr, "zaya train: error: {}\n", e.what());
    return 1;
  }
  const bool many = li.launched() && li.world > 1;
  const std::string who =
      many ? fmt::format("rank {} of {} on {}: ", li.rank, li.world, local_host_name()) : "";
  const auto stop = [&](int code, const std::string& message) {
    ft::send_event("error", {{"message", message}, {"code", code}});
    ft::finish_reporting("error", code);
    fmt::print(stderr, "zaya train: {}error: {}\n", who, message);
    return code;
  };
  try {
    const int code = run_train_rank(argc, argv);
    ft::finish_reporting(code == 0 ? "completed" : "error", code);
    return code;
  } catch (const JobWideError& e) {
    return stop(e.code(), e.what());
  } catch (const ConfigError& e) {
    return stop(ft::kExitBadConfig, e.what());  // every rank reads the same config, before MPI
  } catch (const CLI::ParseError& e) {
    if (!many) throw;
    fmt::print(stderr, "zaya train: {}{}\n", who, e.what());
    return 2;  // every rank parses the same arguments, before any collective
  } catch (const std::exception& e) {
    if (!many) {
      ft::send_event("error", {{"message", e.what()}, {"code", 1}});
      ft::finish_reporting("error", 1);
      throw;
    }
    ft::send_event("error", {{"message", e.what()}, {"code", 1}});
    ft::finish_reporting("error", 1, 1.0);
    fmt::print(stderr, "zaya train: {}error: {}\nzaya train: {}ending the whole job\n", who,
               e.what(), who);
    abort_all_ranks(1);
  }
}

ZAYA_COMMAND("train", "train a model (default: tiny preset on the built-in Brown corpus)",
             run_train);

}  // namespace zaya::cli
