// RunConfig: the example file, strict keys, value checks, command-line overrides of every type,
// TOML round trip, phase selection and the batch ramp.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/run_config.h"
#include "train_test_util.h"

using namespace zaya;

namespace {

using test_util::error_of;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const char* kThreePhases = R"(
[train]
micro_batch = 2
grad_accum = 2
steps = 1000
seq_len = 128
[[phase]]
name = "p1"
tokens = 1000
[[phase]]
name = "p2"
tokens = 2000
seq_len = 512
rope_theta = 1e6
batch_size = 8
[[phase.blend]]
prefix = "math"
weight = 2.0
[[phase]]
name = "p3"
seq_len = 1024
)";

// [parallel]: defaults, validation, and resolve_parallel against a world size.
TEST(RunConfigParallel, DefaultsResolveToTheWorldSize) {
  RunConfig c = RunConfig::defaults();
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(c.parallel.backend, "auto");
  auto r = c.resolve_parallel(4);
  EXPECT_EQ(r.dp, 4);
  EXPECT_EQ(r.backend, "mpi");  // train.device = cpu
  EXPECT_EQ(r.bucket_elems, int64_t(25) << 18);
  RunConfig g = RunConfig::defaults({"--train.device=cuda"});
  EXPECT_EQ(g.resolve_parallel(2).backend, "nccl");
  RunConfig m = RunConfig::defaults({"--train.device=cuda", "--parallel.backend=mpi"});
  EXPECT_EQ(m.resolve_parallel(2).backend, "mpi");
  // Round trip through TOML keeps the section.
  RunConfig back = RunConfig::from_toml(m.to_toml());
  EXPECT_EQ(back.parallel.backend, "mpi");
}

TEST(RunConfigParallel, BadValuesNameTheField) {
  EXPECT_NE(error_of([] { RunConfig::defaults({"--parallel.dp=-1"}); }).find("parallel.dp"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { RunConfig::defaults({"--parallel.backend=gloo"}); }).find("parallel.backend"),
      std::string::npos);
  EXPECT_NE(error_of([] { RunConfig::defaults({"--parallel.backend=nccl"}); }).find("NCCL"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { RunConfig::defaults({"--parallel.bucket_mb=0"}); }).find("parallel.bucket_mb"),
      std::string::npos);
}

// parallel.overlap and checkpoint.snapshot: defaults, overrides, round trip, bad values.
TEST(RunConfigParallel, OverlapAndSnapshotSettings) {
  const RunConfig d = RunConfig::defaults({});
  EXPECT_TRUE(d.parallel.overlap);
  EXPECT_EQ(d.checkpoint.snapshot, "auto");
  const RunConfig c =
      RunConfig::defaults({"--parallel.overlap=false", "--checkpoint.snapshot=device"});
  EXPECT_FALSE(c.parallel.overlap);
  EXPECT_EQ(c.checkpoint.snapshot, "device");
  const RunConfig back = RunConfig::from_toml(c.to_toml(), "round trip");
  EXPECT_FALSE(back.parallel.overlap);
  EXPECT_EQ(back.checkpoint.snapshot, "device");
  const std::string e = error_of([] { RunConfig::defaults({"--checkpoint.snapshot=gpu"}); });
  EXPECT_NE(e.find("checkpoint.snapshot"), std::string::npos) << e;
  EXPECT_NE(e.find("\"auto\", \"device\" or \"host\""), std::string::npos) << e;
}

// model.layers: a preset's widths with fewer (or more) layers; the layer pattern follows.
TEST(RunConfigModel, LayersCutThePresetToThatDepth) {
  const ZayaConfig full = ZayaConfig::preset("zaya1-base");
  const ZayaConfig eight =
      RunConfig::defaults({"--model.config=zaya1-base", "--model.layers=8"}).resolve_model();
  EXPECT_EQ(eight.num_hidden_layers, 8);
  EXPECT_EQ(eight.hidden_size, full.hidden_size);
  EXPECT_EQ(eight.num_experts, full.num_experts);
  ASSERT_EQ(eight.layer_types.size(), full.layer_types.empty() ? 0u : 8u);
  for (size_t i = 0; i < eight.layer_types.size(); i++)
    EXPECT_EQ(eight.layer_types[i], full.layer_types[i]);
  EXPECT_EQ(RunConfig::defaults({}).resolve_model().num_hidden_layers,
            ZayaConfig::preset("tiny").num_hidden_layers);
  const ZayaConfig deeper = RunConfig::defaults({"--model.layers=7"}).resolve_model();
  EXPECT_EQ(deeper.num_hidden_layers, 7);
  const std::string e = error_of([] { RunConfig::defaults({"--model.layers=-1"}); });
  EXPECT_NE(e.find("model.layers"), std::string::npos) << e;
}

// [fault_tolerance]: defaults, round trip, validation; every load error is a ConfigError (the CLI
// exits 2 for it) with the message unchanged.
TEST(RunConfigFaultTolerance, DefaultsRoundTripAndBadValues) {
  RunConfig c = RunConfig::defaults();
  EXPECT_EQ(c.fault_tolerance.collective_timeout, 0);
  EXPECT_EQ(c.fault_tolerance.nonfinite, "auto");
  EXPECT_EQ(c.fault_tolerance.loss_spike, 0);
  EXPECT_EQ(c.fault_tolerance.loss_spike_window, 20);
  RunConfig s = RunConfig::defaults(
      {"--fault_tolerance.collective_timeout=600", "--fault_tolerance.nonfinite=restart",
       "--fault_tolerance.loss_spike=3.5", "--fault_tolerance.loss_spike_window=50"});
  RunConfig back = RunConfig::from_toml(s.to_toml());
  EXPECT_EQ(back.fault_tolerance.collective_timeout, 600);
  EXPECT_EQ(back.fault_tolerance.nonfinite, "restart");
  EXPECT_EQ(back.fault_tolerance.loss_spike, 3.5);
  EXPECT_EQ(back.fault_tolerance.loss_spike_window, 50);
  const std::pair<const char*, const char*> bad[] = {
      {"--fault_tolerance.collective_timeout=-1", "fault_tolerance.collective_timeout = -1"},
      {"--fault_tolerance.nonfinite=maybe", "fault_tolerance.nonfinite = \"maybe\" is invalid"},
      {"--fault_tolerance.loss_spike=0.5", "fault_tolerance.loss_spike = 0.5"},
      {"--fault_tolerance.loss_spike_window=0", "fault_tolerance.loss_spike_window = 0"},
  };
  for (const auto& [o, want] : bad) {
    try {
      RunConfig::defaults({o});
      ADD_FAILURE() << o << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_TRUE(contains(e.what(), want)) << e.what();
    }
  }
  EXPECT_THROW(RunConfig::from_toml("[fault_tolerance]\nwatchdog = 1\n"), ConfigError);
  EXPECT_THROW(RunConfig::load("/nonexistent/run.toml"), ConfigError);
}

TEST(RunConfigParallel, DpMustDivideAndEqualTheWorld) {
  RunConfig c = RunConfig::defaults({"--parallel.dp=2"});
  EXPECT_NE(error_of([&] { c.resolve_parallel(3); }).find("does not divide the world size 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.resolve_parallel(4); }).find("set parallel.dp = 4"),
            std::string::npos);
  EXPECT_EQ(c.resolve_parallel(2).dp, 2);
}

TEST(RunConfigParallel, GlobalBatchMustBeWholeMicroBatchesPerRank) {
  RunConfig c = RunConfig::from_toml(R"(
[train]
micro_batch = 2
[[phase]]
name = "a"
batch_size = 12
)");
  EXPECT_EQ(c.resolve_parallel(3).dp, 3);
  EXPECT_NE(error_of([&] { c.resolve_parallel(4); })
                .find("batch_size = 12 (global sequences per step) is not divisible by "
                      "train.micro_batch × parallel.dp = 2 × 4 = 8"),
            std::string::npos);
}

}  // namespace

TEST(RunConfig, ParsesTheTinyExample) {
  const std::string path = std::string(ZAYA_SOURCE_DIR) + "/configs/tiny.toml";
  RunConfig c = RunConfig::load(path);
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.model.config, "tiny");
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optim.balancing.beta2, 0.999);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::Cosine);
  EXPECT_EQ(c.schedule.warmup_steps, 50);
  EXPECT_EQ(c.resolved_schedule().total_steps, 1000);  // total_steps 0 → train.steps
  EXPECT_EQ(c.data.corpus, "brown");
  EXPECT_TRUE(c.data.blend.empty());
  EXPECT_EQ(c.checkpoint.keep_last, 2);
  EXPECT_EQ(c.train.device, "cpu");
  // Two phases: short context first, then context extension with a larger RoPE θ.
  ASSERT_EQ(c.phases.size(), 2u);
  EXPECT_EQ(c.phases[0].steps, 250);
  EXPECT_EQ(c.resolve_model().num_hidden_layers, ZayaConfig::preset("tiny").num_hidden_layers);
  auto st = c.phase_at(0, 0, 1, 1e4);
  EXPECT_EQ(st.name, "short-context");
  EXPECT_EQ(st.seq_len, 64);
  EXPECT_EQ(st.batch_size, 16);  // two micro-batches of 8
  EXPECT_EQ(st.micro_steps, 2);
  EXPECT_DOUBLE_EQ(st.rope_theta, 1e4);  // the model's
  auto lc = c.phase_at(250, 250 * 16 * 64, 1, 1e4);
  EXPECT_EQ(lc.name, "long-context");
  EXPECT_EQ(lc.seq_len, 256);
  EXPECT_EQ(lc.batch_size, 8);
  EXPECT_EQ(lc.micro_steps, 1);
  EXPECT_DOUBLE_EQ(lc.rope_theta, 1e5);
  EXPECT_EQ(c.phase_at(249, 0, 1, 1e4).name, "short-context");
  auto os = c.optim.optimizer_settings();
  EXPECT_DOUBLE_EQ(os.adamw.beta1, 0.9);
  EXPECT_TRUE(os.default_rules);
}

TEST(RunConfig, ParsesTheZaya1Recipe) {
  RunConfig c = RunConfig::load(std::string(ZAYA_SOURCE_DIR) + "/configs/zaya1.toml");
  ASSERT_EQ(c.phases.size(), 3u);
  const int64_t dp = 1024;
  auto p0 = c.phase_at(0, 0, dp, 1e6);
  EXPECT_EQ(p0.batch_size, 1024);
  EXPECT_EQ(p0.micro_steps, 1);
  EXPECT_DOUBLE_EQ(p0.rope_theta, 1e4);
  EXPECT_EQ(c.phase_at(0, 200'000'000'000, dp, 1e6).batch_size, 4096);
  EXPECT_EQ(c.phase_at(0, 200'000'000'000, dp, 1e6).micro_steps, 4);
  auto p2 = c.phase_at(0, 12'000'000'000'000, dp, 1e6);  // context parallelism over 2 ranks
  EXPECT_EQ(p2.name, "context-extension");
  EXPECT_EQ(p2.cp, 2);
  EXPECT_EQ(p2.dp, dp / 2);
  EXPECT_EQ(c.resolve_parallel(dp).dp, dp);
  EXPECT_EQ(p2.seq_len, 32768);
  EXPECT_DOUBLE_EQ(p2.rope_theta, 1e6);
  EXPECT_EQ(p2.batch_size * p2.seq_len, 4096 * 4096);
  EXPECT_EQ(p2.micro_steps, 1);
}

TEST(RunConfig, DefaultsAreValidAndKeyPathsListEveryKey) {
  RunConfig c = RunConfig::defaults();
  EXPECT_EQ(c.model.config, "tiny");
  auto keys = RunConfig::key_paths();
  for (const char* k :
       {"model.init", "optim.lr", "optim.balancing.betas", "optim.rules.N.weight_decay",
        "data.blend.N.weight", "phase.N.seq_len", "phase.N.blend.N.prefix", "train.log_every",
        "checkpoint.dir", "schedule.decay_shape"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
}

TEST(RunConfig, UnknownKeysNameThePathAndTheFile) {
  auto msg = error_of([] { RunConfig::from_toml("[modle]\nconfig = 'tiny'\n", "run.toml"); });
  EXPECT_TRUE(contains(msg, "run.toml")) << msg;
  EXPECT_TRUE(contains(msg, "'modle'")) << msg;
  msg = error_of([] { RunConfig::from_toml("stray = 1\n", "run.toml"); });
  EXPECT_TRUE(contains(msg, "'stray'")) << msg;
  msg = error_of([] { RunConfig::from_toml("[optim]\nlrr = 1e-3\n", "run.toml"); });
  EXPECT_TRUE(contains(msg, "'optim.lrr'")) << msg;
  EXPECT_TRUE(contains(msg, "optim.lr,")) << msg;  // suggested
  EXPECT_TRUE(contains(msg, "line 2")) << msg;
  msg = error_of([] { RunConfig::from_toml("[optim.balancing]\nbeta = 0.9\n", "r.toml"); });
  EXPECT_TRUE(contains(msg, "'optim.balancing.beta'")) << msg;
  msg = error_of(
      [] { RunConfig::from_toml("[[phase]]\nname = 'a'\nsteps = 5\nseqlen = 3\n", "r.toml"); });
  EXPECT_TRUE(contains(msg, "'phase.0.seqlen'")) << msg;
  EXPECT_TRUE(contains(msg, "phase.N.seq_len")) << msg;
  msg = error_of([] {
    RunConfig::from_toml("[[data.blend]]\nprefix = 'a'\nweight = 1\nwieght = 2\n", "r.toml");
  });
  EXPECT_TRUE(contains(msg, "'data.blend.0.wieght'")) << msg;
  msg = error_of([] { RunConfig::from_toml("[[optim.rules]]\npattern = '*'\nopt = 'muon'\n"); });
  EXPECT_TRUE(contains(msg, "'optim.rules.0.opt'")) << msg;
  // Syntax errors carry file:line.
  msg = error_of([] { RunConfig::from_toml("[optim]\nlr = = 3\n", "bad.toml"); });
  EXPECT_TRUE(contains(msg, "bad.toml:2")) << msg;
  msg = error_of([] { RunConfig::load("/nonexistent/run.toml"); });
  EXPECT_TRUE(contains(msg, "/nonexistent/run.toml")) << msg;
}

TEST(RunConfig, BadValuesNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[optim]\nlr = -1e-3", "optim.lr"},
      {"[optim]\nlr = 0", "optim.lr"},
      {"[optim]\nlr = 1e-3\nmin_lr = 1e-2", "optim.min_lr"},
      {"[optim]\nweight_decay = -0.1", "optim.weight_decay"},
      {"[optim]\nbetas = [0.9, 1.0]", "optim.betas[1]"},
      {"[optim]\nbetas = [0.9]", "optim.betas"},
      {"[optim]\neps = 0", "optim.eps"},
      {"[optim]\nclip = -1", "optim.clip"},
      {"[optim]\nmuon_momentum = 1.5", "optim.muon_momentum"},
      {"[optim]\nmuon_ns_steps = 0", "optim.muon_ns_steps"},
      {"[optim]\nlr = 'fast'", "optim.lr"},
      {"[optim.balancing]\nlr = -1", "optim.balancing.lr"},
      {"[[optim.rules]]\npattern = '*'\noptimizer = 'sgd'", "optim.rules.0.optimizer"},
      {"[[optim.rules]]\npattern = 're:('", "optim.rules.0"},
      {"[[optim.rules]]\npattern = '*'\nlr_mult = -2", "optim.rules.0"},
      {"[schedule]\nkind = 'linear'", "schedule.kind"},
      {"[schedule]\ndecay_shape = 'cubic'", "schedule.decay_shape"},
      {"[schedule]\nwarmup_steps = -5", "schedule.warmup_steps"},
      {"[schedule]\nkind = 'wsd'\ndecay_fraction = 0", "schedule.decay_fraction"},
      {"[[data.blend]]\nprefix = 'a'\nweight = 0", "data.blend.0.weight"},
      {"[[data.blend]]\nprefix = 'a'\nweight = -1", "data.blend.0.weight"},
      {"[[data.blend]]\nweight = 1", "data.blend.0.prefix"},
      {"[eval]\nbatches = 0", "eval.batches"},
      {"[eval]\nevery = -1", "eval.every"},
      {"[checkpoint]\nkeep_last = 0", "checkpoint.keep_last"},
      {"[checkpoint]\ndir = ''", "checkpoint.dir"},
      {"[train]\nseq_len = 0", "train.seq_len"},
      {"[train]\nmicro_batch = 0", "train.micro_batch"},
      {"[train]\ngrad_accum = 0", "train.grad_accum"},
      {"[train]\nsteps = 0", "train.steps"},
      {"[train]\nseed = -1", "train.seed"},
      {"[train]\ndevice = 'tpu'", "train.device"},
      {"[train]\nlog_every = 0", "train.log_every"},
      {"[train]\nsteps = 1.5", "train.steps"},
      {"[model]\nconfig = 'no-such-preset'", "model.config"},
      {"[[phase]]\nname = 'a'\nsteps = 10\nseq_len = 0", "phase.0.seq_len"},
      {"[[phase]]\nname = 'a'\nsteps = 10\nrope_theta = -1.0", "phase.0.rope_theta"},
      {"[[phase]]\nname = 'a'\nsteps = -3", "phase.0.steps"},
      {"[[phase]]\nname = ''\nsteps = 3", "phase.0.name"},
      {"[[phase]]\nname = 'a'\nsteps = 3\ntokens = 5", "phase.0"},
      {"[[phase]]\nname = 'a'\n[[phase]]\nname = 'b'", "phase.0"},
      {"[[phase]]\nname = 'a'\nsteps = 3\n[[phase]]\nname = 'a'", "phase.1.name"},
      {"[[phase]]\nname = 'a'\nsteps = 3\n[[phase]]\nname = 'b'\ntokens = 5", "same unit"},
      {"[[phase]]\nname = 'a'\nsteps = 3\nbatch_size = 0", "phase.0.batch_size"},
      {"[[phase]]\nname = 'a'\nsteps = 3\nbatch_ramp_tokens = 100", "phase.0.batch_start"},
      {"[[phase]]\nname = 'a'\nsteps = 3\nbatch_size = 4\nbatch_start = 8\nbatch_ramp_tokens = 1",
       "phase.0.batch_start"},
      {"[[phase]]\nname = 'a'\nsteps = 3\n[[phase.blend]]\nprefix = 'x'\nweight = 0",
       "phase.0.blend.0.weight"},
  };
  for (const auto& [text, field] : cases) {
    auto msg = error_of([&] { RunConfig::from_toml(text, "bad.toml"); });
    EXPECT_TRUE(contains(msg, field)) << "for:\n" << text << "\ngot: " << msg;
    EXPECT_TRUE(contains(msg, "bad.toml")) << msg;
  }
}

TEST(RunConfig, OverridesOfEveryType) {
  RunConfig c = RunConfig::from_toml(
      kThreePhases, "x.toml",
      {"--optim.lr=3e-4", "--train.steps=50", "--optim.muon_nesterov=false", "--train.device=cuda",
       "--optim.betas=[0.8, 0.9]", "--optim.balancing.lr=0.01", "--phase.0.seq_len=256",
       "--phase.2.rope_theta=5e6", "--phase.1.blend.0.weight=3", "data.corpus='other'",
       "--schedule.kind=wsd", "--optim.clip=2"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.train.steps, 50);
  EXPECT_FALSE(c.optim.muon_nesterov);
  EXPECT_EQ(c.train.device, "cuda");
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.9);
  EXPECT_DOUBLE_EQ(c.optim.balancing.lr, 0.01);
  EXPECT_EQ(c.phases[0].seq_len, 256);
  EXPECT_EQ(c.phases[1].seq_len, 512);  // untouched
  EXPECT_DOUBLE_EQ(*c.phases[2].rope_theta, 5e6);
  EXPECT_DOUBLE_EQ(c.phases[1].blend[0].weight, 3.0);
  EXPECT_EQ(c.data.corpus, "other");
  EXPECT_EQ(c.schedule.kind, ScheduleKind::WSD);
  EXPECT_DOUBLE_EQ(c.optim.clip, 2.0);  // an integer spelling of a float field
  // Rules entries can be overridden field by field.
  RunConfig r =
      RunConfig::from_toml("[[optim.rules]]\npattern = '*.w'\noptimizer = 'adamw'\n", "r",
                           {"--optim.rules.0.lr_mult=0.5", "--optim.rules.0.weight_decay=0",
                            "--optim.rules.0.optimizer=muon"});
  EXPECT_DOUBLE_EQ(r.optim.rules[0].lr_mult, 0.5);
  EXPECT_EQ(r.optim.rules[0].weight_decay, 0.0);
  EXPECT_EQ(r.optim.rules[0].optimizer, OptimizerKind::Muon);
  // Overridden values are validated like file values.
  auto msg = error_of([] { RunConfig::defaults({"--train.seq_len=0"}); });
  EXPECT_TRUE(contains(msg, "train.seq_len")) << msg;
}

TEST(RunConfig, BadOverridesAreExplained) {
  auto msg = error_of([] { RunConfig::defaults({"--optim.lrr=1"}); });
  EXPECT_TRUE(contains(msg, "optim.lrr")) << msg;
  EXPECT_TRUE(contains(msg, "optim.lr")) << msg;
  msg = error_of([] { RunConfig::defaults({"--train.steps=1.5"}); });
  EXPECT_TRUE(contains(msg, "integer")) << msg;
  msg = error_of([] { RunConfig::defaults({"--optim.lr=fast"}); });
  EXPECT_TRUE(contains(msg, "number")) << msg;
  msg = error_of([] { RunConfig::defaults({"--optim.muon_nesterov=yes"}); });
  EXPECT_TRUE(contains(msg, "true or false")) << msg;
  msg = error_of([] { RunConfig::defaults({"--optim.betas=0.9"}); });
  EXPECT_TRUE(contains(msg, "array")) << msg;
  msg = error_of([] { RunConfig::from_toml(kThreePhases, "x", {"--phase.3.seq_len=1"}); });
  EXPECT_TRUE(contains(msg, "3 entries")) << msg;
  msg = error_of([] { RunConfig::from_toml(kThreePhases, "x", {"--phase.first.seq_len=1"}); });
  EXPECT_TRUE(contains(msg, "index")) << msg;
  msg = error_of([] { RunConfig::defaults({"--phase.0.seq_len=1"}); });
  EXPECT_TRUE(contains(msg, "phase")) << msg;
  msg = error_of([] { RunConfig::defaults({"--optim"}); });
  EXPECT_TRUE(contains(msg, "--section.key=value")) << msg;
  msg = error_of([] { RunConfig::defaults({"--optim=3"}); });
  EXPECT_TRUE(contains(msg, "section")) << msg;
  msg = error_of([] { RunConfig::defaults({"--optim.lr.x=3"}); });
  EXPECT_TRUE(contains(msg, "optim.lr")) << msg;
  msg = error_of([] { RunConfig::from_toml("optim = [1]\n", "x", {"--optim.lr=1"}); });
  EXPECT_TRUE(contains(msg, "expected a table")) << msg;
  EXPECT_TRUE(is_config_override("--optim.lr=3"));
  EXPECT_FALSE(is_config_override("--steps=3"));
  EXPECT_FALSE(is_config_override("configs/tiny.toml"));
}

TEST(RunConfig, TomlRoundTrip) {
  RunConfig c = RunConfig::from_toml(kThreePhases, "x.toml");
  c.optim.lr = 0.1 + 0.2;  // not a short decimal: the printer must keep every bit
  c.optim.min_lr = 1e-5 / 3;
  c.optim.rules = {{"re:.*\\.o_proj\\.weight", OptimizerKind::AdamW, 0.5, 0.01},
                   {"*.experts.*", OptimizerKind::Muon, 2.0, {}},
                   {"*.temp", OptimizerKind::None, 1.0, {}}};
  c.data.blend = {{"/data/web", 0.7}, {"/data/code \"quoted\"", 0.3}};
  c.schedule.kind = ScheduleKind::WSD;
  c.schedule.decay_shape = DecayShape::OneMinusSqrt;
  c.train.seed = (int64_t(1) << 40) + 7;
  c.phases[0].batch_start = 2;
  c.phases[0].batch_ramp_tokens = 500;
  const std::string text = c.to_toml();
  RunConfig d = RunConfig::from_toml(text, "checkpoint");
  EXPECT_EQ(d.to_toml(), text);
  EXPECT_EQ(d.optim.lr, c.optim.lr);
  EXPECT_EQ(d.optim.min_lr, c.optim.min_lr);
  ASSERT_EQ(d.optim.rules.size(), 3u);
  EXPECT_EQ(d.optim.rules[0].pattern, c.optim.rules[0].pattern);
  EXPECT_EQ(d.optim.rules[0].weight_decay, 0.01);
  EXPECT_FALSE(d.optim.rules[1].weight_decay.has_value());
  EXPECT_EQ(d.optim.rules[2].optimizer, OptimizerKind::None);
  EXPECT_EQ(d.data.blend, c.data.blend);
  EXPECT_EQ(d.train.seed, c.train.seed);
  EXPECT_EQ(d.schedule.decay_shape, DecayShape::OneMinusSqrt);
  ASSERT_EQ(d.phases.size(), 3u);
  EXPECT_FALSE(d.phases[0].seq_len.has_value());
  EXPECT_EQ(d.phases[1].seq_len, 512);
  EXPECT_EQ(d.phases[1].blend, c.phases[1].blend);
  EXPECT_EQ(d.phases[0].batch_ramp_tokens, 500);
  // The defaults round-trip too.
  RunConfig e = RunConfig::defaults();
  EXPECT_EQ(RunConfig::from_toml(e.to_toml()).to_toml(), e.to_toml());
}

TEST(RunConfig, PhaseSelectionAcrossBoundaries) {
  RunConfig c = RunConfig::from_toml(kThreePhases, "x.toml");
  auto at = [&](int64_t tokens) { return c.phase_at(0, tokens, 1, 1e4); };
  EXPECT_EQ(at(0).name, "p1");
  EXPECT_EQ(at(999).name, "p1");
  EXPECT_EQ(at(1000).name, "p2");
  EXPECT_EQ(at(2999).name, "p2");
  EXPECT_EQ(at(3000).name, "p3");
  EXPECT_EQ(at(1000000).name, "p3");  // open-ended last phase
  EXPECT_FALSE(at(1000000).past_end);
  EXPECT_EQ(at(0).seq_len, 128);  // train.seq_len
  EXPECT_EQ(at(1000).seq_len, 512);
  EXPECT_DOUBLE_EQ(at(0).rope_theta, 1e4);  // the model's
  EXPECT_DOUBLE_EQ(at(1500).rope_theta, 1e6);
  EXPECT_EQ(at(0).batch_size, 4);  // micro_batch 2 × grad_accum 2
  EXPECT_EQ(at(0).micro_steps, 2);
  EXPECT_EQ(at(1000).batch_size, 8);
  EXPECT_EQ(at(1000).micro_steps, 4);
  EXPECT_TRUE(at(0).blend.empty());
  ASSERT_EQ(at(1000).blend.size(), 1u);
  EXPECT_EQ(at(1000).blend[0].prefix, "math");
  EXPECT_EQ(at(1000).index, 1u);
  // With 2 data-parallel ranks the default batch doubles and phase 2's 8 is 2 micro-steps each.
  EXPECT_EQ(c.phase_at(0, 0, 2).batch_size, 8);
  EXPECT_EQ(c.phase_at(0, 1000, 2).micro_steps, 2);
  EXPECT_THROW(c.phase_at(0, 1000, 3), Error);  // 8 is not a multiple of 2 × 3

  // Step budgets; past the last phase the last phase continues, flagged.
  RunConfig s = RunConfig::from_toml(
      "[[phase]]\nname='a'\nsteps=10\n[[phase]]\nname='b'\nsteps=5\nseq_len=64\n", "s.toml");
  EXPECT_EQ(s.phase_at(9, 123456).name, "a");
  EXPECT_EQ(s.phase_at(10, 0).name, "b");
  EXPECT_EQ(s.phase_at(14, 0).seq_len, 64);
  EXPECT_TRUE(s.phase_at(15, 0).past_end);
  EXPECT_EQ(s.phase_at(15, 0).name, "b");
  // No phases: one implicit phase from [train].
  RunConfig n = RunConfig::defaults({"--train.steps=20"});
  EXPECT_EQ(n.phase_at(3, 0).name, "main");
  EXPECT_EQ(n.phase_at(3, 0).seq_len, n.train.seq_len);
  EXPECT_TRUE(n.phase_at(20, 0).past_end);
}

TEST(RunConfig, BatchRamp) {
  RunConfig c = RunConfig::from_toml(R"(
[train]
micro_batch = 2
[[phase]]
name = "warm"
tokens = 10000
batch_size = 16
batch_start = 2
batch_ramp_tokens = 1000
[[phase]]
name = "next"
tokens = 10000
batch_size = 16
batch_start = 4
batch_ramp_tokens = 2000
)",
                                     "ramp.toml");
  auto batch = [&](int64_t tokens, int64_t dp = 1) { return c.phase_at(0, tokens, dp).batch_size; };
  EXPECT_EQ(batch(0), 2);
  EXPECT_EQ(batch(500), 8);   // 2 + 7 = 9, rounded down to whole micro-batches of 2
  EXPECT_EQ(batch(999), 14);  // 2 + floor(0.999·14) = 15 → 14
  EXPECT_EQ(batch(1000), 16);
  EXPECT_EQ(batch(9999), 16);
  EXPECT_EQ(c.phase_at(0, 500, 1).micro_steps, 4);
  EXPECT_EQ(batch(0, 4), 8);  // never below one micro-step on every rank (2 × 4 ranks)
  // The second phase's ramp is measured from its own start (token 10000).
  EXPECT_EQ(batch(10000), 4);
  EXPECT_EQ(batch(11000), 10);
  EXPECT_EQ(batch(12000), 16);
  for (int64_t t = 0; t < 1000; t += 37) ASSERT_LE(batch(t), batch(t + 37));
}

// [parallel] cp and a phase's cp: dp = world / cp groups, seq_len a multiple of 2·cp.
TEST(RunConfigPhases, RecomputePerPhase) {
  RunConfig c = RunConfig::from_toml(R"(
[train]
recompute = true
[[phase]]
name = "short"
steps = 5
recompute = false
[[phase]]
name = "long"
steps = 5
[[phase]]
name = "longer"
recompute = true
)");
  EXPECT_FALSE(c.phase_at(0, 0, 1).recompute);
  EXPECT_TRUE(c.phase_at(5, 0, 1).recompute);  // unset: train.recompute
  EXPECT_TRUE(c.phase_at(10, 0, 1).recompute);
  // The written config reads back the same (what a checkpoint stores).
  const RunConfig back = RunConfig::from_toml(c.to_toml(), "round trip");
  ASSERT_EQ(back.phases.size(), 3u);
  EXPECT_TRUE(back.train.recompute);
  EXPECT_EQ(back.phases[0].recompute, std::optional<bool>(false));
  EXPECT_FALSE(back.phases[1].recompute.has_value());
  EXPECT_NE(
      error_of([] { RunConfig::from_toml("[train]\nrecompute = 1\n"); }).find("train.recompute"),
      std::string::npos);
  RunConfig plain = RunConfig::from_toml("[train]\nsteps = 3\n");
  EXPECT_FALSE(plain.phase_at(0, 0, 1).recompute);
}

TEST(RunConfigParallel, ContextParallelSizes) {
  RunConfig c = RunConfig::from_toml(R"(
[train]
micro_batch = 1
seq_len = 32
[parallel]
cp = 2
[[phase]]
name = "a"
steps = 5
batch_size = 8
cp = 1
[[phase]]
name = "b"
seq_len = 64
batch_size = 4
cp = 4
)");
  EXPECT_EQ(c.resolve_parallel(8).dp, 4);  // parallel.cp = 2 over 8 ranks
  const PhaseState a = c.phase_at(0, 0, 8), b = c.phase_at(5, 0, 8);
  EXPECT_EQ(a.cp, 1);
  EXPECT_EQ(a.dp, 8);
  EXPECT_EQ(b.cp, 4);
  EXPECT_EQ(b.dp, 2);
  EXPECT_EQ(b.micro_steps, 2);  // 4 sequences over 2 groups of micro_batch 1
  EXPECT_NE(error_of([&] { c.resolve_parallel(6); }).find("phase.1.cp = 4 does not divide"),
            std::string::npos)
      << error_of([&] { c.resolve_parallel(6); });
  EXPECT_NE(error_of([&] {
              RunConfig::from_toml("[train]\nseq_len = 30\n[parallel]\ncp = 2\n");
            }).find("train.seq_len = 30 is not divisible by 2·cp = 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { RunConfig::from_toml("[parallel]\ncp = 0\n"); }).find("parallel.cp"),
            std::string::npos);
  RunConfig d = RunConfig::from_toml("[train]\nseq_len = 32\n[parallel]\ncp = 2\ndp = 4\n");
  EXPECT_EQ(d.resolve_parallel(8).dp, 4);
  EXPECT_NE(error_of([&] { d.resolve_parallel(4); }).find("the other factor"), std::string::npos);
}
