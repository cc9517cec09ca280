// Helpers for the end-to-end training-loop tests (tests/train/test_train_resume.cpp,
// test_train_init.cpp and test_ckpt_tools.cpp on the CPU, tests/gpu/test_train_gpu.cpp with
// train.device = "cuda"): a fresh directory per test, a small model config plus two token datasets
// with different statistics (so the blend weights matter), the run config text for a two-phase run
// (sequence length and RoPE theta change) over that blend, one training run in-process, the
// metrics.jsonl it wrote, and the message of an expected Error. Header-only, CPU-only. The run
// lengths and every expectation stay with the tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/indexed_dataset.h"
#include "model/zaya.h"
#include "train/trainer.h"

namespace zaya::test_util {

// An empty directory <temp>/<prefix><current test's name>, removed first if it exists. One per
// test: ctest runs the tests of a file in parallel processes.
inline std::string fresh_test_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  const std::string d =
      (fs::temp_directory_path() /
       (prefix + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
          .string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A small model for loop tests: the tiny preset cut to two layers, hidden 32, head dim 8, three
// experts of width 16.
inline ZayaConfig small_model_config() {
  ZayaConfig c = ZayaConfig::preset("tiny");
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.head_dim = 8;
  c.moe_intermediate_size = 16;
  c.num_experts = 3;
  c.router_hidden_size = 8;
  return c;
}

// Writes <dir>/config.json from `cfg` and two indexed datasets, <dir>/a (tokens uniform in
// [32, 127)) and <dir>/b ([97, 123)), each of `docs` documents of min_len + doc % len_mod tokens
// plus the end-of-document token 258; the same seeds every time.
inline void write_blend_inputs(const std::string& dir, const ZayaConfig& cfg, int docs, int min_len,
                               int len_mod) {
  std::ofstream(dir + "/config.json") << cfg.to_json().dump();
  for (auto [name, lo, hi] : {std::tuple{"a", 32, 127}, std::tuple{"b", 97, 123}}) {
    IndexedDatasetWriter w(dir + "/" + name, TokenDType::UInt16);
    Rng r(name[0]);
    for (int doc = 0; doc < docs; doc++) {
      std::vector<int32_t> t(static_cast<size_t>(min_len + doc % len_mod));
      for (auto& x : t) x = lo + int32_t(r.next_u32() % uint32_t(hi - lo));
      t.push_back(258);
      w.add_document(t);
    }
    w.finish();
  }
}

// The lengths of a blend run: `steps` optimizer steps (also the cosine schedule's total), eval
// and checkpoint every `every` steps, a "short" phase of short_steps steps at seq_len, then a
// "long" phase at long_seq_len with RoPE theta 1e5.
struct BlendRunShape {
  int steps = 0, every = 0, seq_len = 0, short_steps = 0, long_seq_len = 0;
};

// Run config (TOML) over the files write_blend_inputs put in `dir`: blend 0.7 a / 0.3 b, byte
// tokenizer, lr 3e-3 → 3e-4 cosine with 2 warmup steps, seed 7, micro-batch 2 × 2 accumulation,
// one eval batch, checkpoints kept (5) under <out>/checkpoints, metrics every step.
inline std::string blend_run_toml(const std::string& dir, const BlendRunShape& s) {
  const auto n = [](int v) { return std::to_string(v); };
  return "[model]\nconfig = \"" + dir + "/config.json\"\n" + "[optim]\nlr = 3e-3\nmin_lr = 3e-4\n" +
         "[schedule]\nkind = \"cosine\"\nwarmup_steps = 2\ntotal_steps = " + n(s.steps) + "\n" +
         "[data]\ntokenizer = \"bytes\"\n" + "[[data.blend]]\nprefix = \"" + dir +
         "/a\"\nweight = 0.7\n" + "[[data.blend]]\nprefix = \"" + dir + "/b\"\nweight = 0.3\n" +
         "[eval]\nevery = " + n(s.every) + "\nbatches = 1\n" +
         "[checkpoint]\nevery = " + n(s.every) + "\nkeep_last = 5\ndir = \"checkpoints\"\n" +
         "[train]\nseed = 7\nmicro_batch = 2\ngrad_accum = 2\nsteps = " + n(s.steps) +
         "\nseq_len = " + n(s.seq_len) + "\nlog_every = 1\n" +
         "[[phase]]\nname = \"short\"\nsteps = " + n(s.short_steps) +
         "\nseq_len = " + n(s.seq_len) + "\n" +
         "[[phase]]\nname = \"long\"\nseq_len = " + n(s.long_seq_len) + "\nrope_theta = 100000.0\n";
}

// One quiet training run of the config text `toml` (with command-line style overrides such as
// "--train.steps=4") into `out`; resume is "" (fresh), "auto" or a checkpoint directory.
inline TrainResult run_training(const std::string& toml, const std::string& out,
                                const std::vector<std::string>& overrides,
                                const std::string& resume = "") {
  TrainOptions o;
  o.config = RunConfig::from_toml(toml, "test.toml", overrides);
  o.out_dir = out;
  o.resume = resume;
  o.quiet = true;
  return train(o);
}

// Runs fn, expects a zaya::Error, and returns its message (a failure of the test when none came).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a zaya::Error";
  return "";
}

// The records of <out>/metrics.jsonl, in order (empty when the file does not exist).
inline std::vector<nlohmann::json> read_metrics(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::ifstream in(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) v.push_back(nlohmann::json::parse(line));
  return v;
}

}  // namespace zaya::test_util
