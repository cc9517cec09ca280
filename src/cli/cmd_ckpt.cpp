// `zaya ckpt`: look at, check, export and reshape training checkpoints (docs/TRAINING.md,
// "Checkpoint tools").
//   zaya ckpt inspect DIR [--json] [--digest]     what is in it (a root: every checkpoint's status)
//   zaya ckpt verify DIR [--json]                 every checksum; exit 1 when any is invalid
//   zaya ckpt export-hf DIR --out OUT [--dtype bf16|fp32] [--max-shard-mb N] [--tokenizer T]
//   zaya ckpt reshard DIR --ranks M --out OUT
// DIR is a step-* checkpoint, a checkpoints root, or a run's --out (its checkpoints/). Thin: the
// work is in ckpt/inspect.h, ckpt/export_hf.h and train/ckpt_tools.h. Deliberately not here:
// changing a checkpoint in place (every tool writes a new directory, atomically).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/export_hf.h"
#include "ckpt/inspect.h"
#include "cli/command.h"
#include "core/error.h"
#include "train/ckpt_tools.h"

namespace zaya::cli {

namespace {

using nlohmann::json;

// Every step-* checkpoint of a root with its verdict, newest last.
std::vector<CheckpointVerdict> verdicts_of(const std::string& root, bool check_hashes) {
  std::vector<CheckpointVerdict> v;
  for (const std::string& d : checkpoint_dirs(root))
    v.push_back(verify_checkpoint(d, check_hashes));
  return v;
}

json verdict_json(const CheckpointVerdict& v) {
  return {{"dir", v.dir}, {"ok", v.ok}, {"problems", v.problems}};
}

int run_inspect(const std::string& path, bool as_json, bool digests) {
  const CheckpointPath p = classify_checkpoint_path(path);
  if (p.kind == CheckpointPath::Kind::Checkpoint) {
    const CheckpointSummary s = inspect_checkpoint(p.path, digests);
    fmt::print("{}", as_json ? s.to_json().dump(2) + "\n" : s.to_text());
    return 0;
  }
  // A root: the status of each (sizes only: `verify` reads every byte), then the newest valid.
  const auto all = verdicts_of(p.path, /*check_hashes=*/false);
  const CheckpointVerdict* newest = nullptr;
  for (const auto& v : all)
    if (v.ok) newest = &v;
  json j = {{"root", p.path}, {"checkpoints", json::array()}};
  if (!as_json)
    fmt::print("checkpoints under {} (sizes checked; `zaya ckpt verify` reads every byte):\n",
               p.path);
  for (const auto& v : all) {
    j["checkpoints"].push_back(verdict_json(v));
    if (!as_json)
      fmt::print("  {}  {}\n", std::filesystem::path(v.dir).filename().string(),
                 v.ok ? "valid" : "invalid: " + v.problems.front());
  }
  ZAYA_CHECK(newest, "{}: no valid checkpoint", p.path);
  const CheckpointSummary s = inspect_checkpoint(newest->dir, digests);
  if (as_json) {
    j["newest_valid"] = newest->dir;
    j["inspected"] = s.to_json();
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("newest valid: {}\n\n{}", newest->dir, s.to_text());
  }
  return 0;
}

// Exit 0 when every checkpoint is valid, 1 when any is not (on a root too: an older corrupt
// checkpoint is still corruption; the output says which one --resume auto would take).
int run_verify(const std::string& path, bool as_json) {
  const CheckpointPath p = classify_checkpoint_path(path);
  std::vector<CheckpointVerdict> all;
  if (p.kind == CheckpointPath::Kind::Checkpoint)
    all.push_back(verify_checkpoint(p.path));
  else
    all = verdicts_of(p.path, /*check_hashes=*/true);
  bool ok = true;
  std::string newest;
  json j = json::array();
  for (const auto& v : all) {
    ok = ok && v.ok;
    if (v.ok) newest = v.dir;
    j.push_back(verdict_json(v));
    if (as_json) continue;
    fmt::print("{}: {}\n", v.dir, v.ok ? "valid" : "INVALID");
    for (const std::string& problem : v.problems) fmt::print("  {}\n", problem);
  }
  if (as_json) {
    fmt::print("{}\n", json{{"ok", ok}, {"checkpoints", j}}.dump(2));
  } else if (p.kind == CheckpointPath::Kind::Root) {
    fmt::print("{} of {} checkpoints valid; --resume auto would take {}\n",
               std::count_if(all.begin(), all.end(), [](auto& v) { return v.ok; }), all.size(),
               newest.empty() ? "none (a fresh start)" : newest);
  }
  return ok ? 0 : 1;
}

int run_export(const std::string& path, const std::string& out, const std::string& dtype,
               int64_t shard_mb, std::string tokenizer, bool force) {
  ZAYA_CHECK(shard_mb >= 1, "--max-shard-mb {}: expected at least 1", shard_mb);
  const std::string dir = resolve_checkpoint_dir(path);
  HfExportOptions o;
  o.dtype = dtype == "fp32" ? DType::F32 : DType::BF16;
  o.max_shard_bytes = size_t(shard_mb) << 20;
  o.force = force;
  if (tokenizer.empty()) {
    std::string why;
    tokenizer = checkpoint_tokenizer(dir, &why);
    if (tokenizer.empty())
      fmt::print(stderr,
                 "zaya ckpt export-hf: warning: no tokenizer exported ({}); pass --tokenizer\n",
                 why);
  }
  o.tokenizer = tokenizer;
  const HfExportResult r = export_hf(dir, out, o);
  fmt::print("exported {} to {}: {} tensors in {}, {:.2f} MiB of tensor data\n", dir, out,
             r.tensors, dtype, double(r.tensor_bytes) / double(1 << 20));
  for (const std::string& f : r.files) fmt::print("  {}\n", f);
  return 0;
}

int run_reshard(const std::string& path, int64_t ranks, const std::string& out, bool force) {
  const std::string dir = resolve_checkpoint_dir(path);
  ReshardOptions o;
  o.ranks = ranks;
  o.force = force;
  const ReshardResult r = reshard_checkpoint(dir, out, o);
  fmt::print(
      "resharded {} (step {}, {} ranks) to {} for {} ranks, save id {}: {} files, {:.2f} MiB\n",
      dir, r.step, r.from_world, r.dir, r.to_world, r.save_id, r.files.size(),
      double(r.bytes) / double(1 << 20));
  return 0;
}

int run_ckpt(int argc, char** argv) {
  CLI::App app{"look at, check, export and reshape training checkpoints", "zaya ckpt"};
  app.require_subcommand(1);
  const char* dir_help = "a step-* checkpoint, a checkpoints root, or a run's --out";

  std::string dir;
  bool as_json = false, digests = false;
  auto* ins = app.add_subcommand(
      "inspect", "what a checkpoint holds (step, files, model, state); a root: every status");
  ins->add_option("dir", dir, dir_help)->required();
  ins->add_flag("--json", as_json, "print JSON instead of text");
  ins->add_flag("--digest", digests,
                "add the XXH64 of every global tensor's fp32 bytes, by name (comparable across "
                "world sizes)");

  auto* ver = app.add_subcommand(
      "verify", "check every file against the manifest; exit 1 when any checkpoint is invalid");
  ver->add_option("dir", dir, dir_help)->required();
  ver->add_flag("--json", as_json, "print JSON instead of text");

  std::string out, dtype = "bf16", tokenizer;
  int64_t shard_mb = 5 * 1024;
  bool force = false;
  auto* exp = app.add_subcommand(
      "export-hf", "write the model as a transformers checkpoint (bf16 or fp32, sharded)");
  exp->add_option("dir", dir, dir_help + std::string(" (a root: its newest valid checkpoint)"))
      ->required();
  exp->add_option("--out", out, "the new directory")->required();
  exp->add_option("--dtype", dtype, "bf16 or fp32 (balancing biases stay fp32)")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  exp->add_option("--max-shard-mb", shard_mb, "MiB of tensor data per shard")
      ->capture_default_str();
  exp->add_option("--tokenizer", tokenizer,
                  "'bytes' or a tokenizer.json to put beside it (default: the run's "
                  "data.tokenizer)");
  exp->add_flag("--force", force, "replace an existing --out (once the new one is complete)");

  int64_t ranks = 0;
  auto* rsh = app.add_subcommand(
      "reshard", "rewrite a checkpoint as M ranks would have written it (offline, any M)");
  rsh->add_option("dir", dir, dir_help + std::string(" (a root: its newest valid checkpoint)"))
      ->required();
  rsh->add_option("--ranks", ranks, "the new world size M")->required();
  rsh->add_option("--out", out, "the new checkpoint directory")->required();
  rsh->add_flag("--force", force, "replace an existing --out (once the new one is complete)");

  if (!parse_or_help(app, argc, argv)) return 0;
  if (ins->parsed()) return run_inspect(dir, as_json, digests);
  if (ver->parsed()) return run_verify(dir, as_json);
  if (exp->parsed()) return run_export(dir, out, dtype, shard_mb, tokenizer, force);
  return run_reshard(dir, ranks, out, force);
}

}  // namespace

ZAYA_COMMAND("ckpt", "inspect, verify, export (HF) and reshard training checkpoints", run_ckpt);

}  // namespace zaya::cli
