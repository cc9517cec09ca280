// model.init (continued pretraining) end to end on the CPU. A fresh run started from a checkpoint
// computes its step-1 loss with the checkpoint's weights (the loss `zaya eval` gives the same row)
// and, at a learning rate too small to move them, ends with exactly those weights; this for the
// parity fixture cfg_a (transformers layout, fp32), a bf16 sharded copy of it and an original
// release layout copy (whose config.json states a stale depth). `--resume` ignores model.init;
// a model.config disagreeing with the checkpoint on a shape is refused naming the field and both
// values, and a missing directory or config.json is refused before any work. The data are
// identical documents of exactly S tokens, so every packed row is the same, whatever the shuffle.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../ckpt/original_layout.h"
#include "ckpt/model_io.h"
#include "data/indexed_dataset.h"
#include "engine/decoder.h"
#include "model/zaya.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace zaya;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(ZAYA_SOURCE_DIR) + "/tests/fixtures/parity/cfg_a";
constexpr int64_t kSeq = 16;  // S: each document is S tokens, the last one the EOS 258

// The document every row is made of: S-1 tokens in [3, 258) (ids the byte tokenizer and the
// fixture's vocabulary of 384 both allow), then 258.
std::vector<int32_t> the_document() {
  std::vector<int32_t> d;
  for (int64_t i = 0; i + 1 < kSeq; i++) d.push_back(int32_t(3 + (i * 53 + 17) % 255));
  d.push_back(258);
  return d;
}

// A packed row is S+1 tokens starting at a document boundary: the document, then the next one's
// first token.
std::vector<int32_t> the_row() {
  std::vector<int32_t> r = the_document();
  r.push_back(r.front());
  return r;
}

// <dir>/docs: 100 copies of the document (the 2 held out make one evaluation row).
void write_dataset(const std::string& dir) {
  IndexedDatasetWriter w(dir + "/docs", TokenDType::UInt16);
  for (int i = 0; i < 100; i++) w.add_document(the_document());
  w.finish();
}

// One optimizer step of 2 sequences; lr 1e-20 and no balancing update, so the weights stay put.
std::string run_toml(const std::string& dir, const std::string& init) {
  return "[model]\ninit = \"" + init + "\"\n[optim]\nlr = 1e-20\nmin_lr = 0.0\n" +
         "[optim.balancing]\nenabled = false\n[data]\ntokenizer = \"bytes\"\n[[data.blend]]\n" +
         "prefix = \"" + dir + "/docs\"\n[eval]\nevery = 0\n[checkpoint]\nevery = 0\n" +
         "[train]\nmicro_batch = 2\nsteps = 1\nseq_len = " + std::to_string(kSeq) + "\n";
}

// The mean next-token loss of the row under `m`, as `zaya eval` computes it.
double eval_loss(const ZayaModel& m) {
  const std::vector<int32_t> row = the_row();
  auto dec = make_decoder(m, {.device = "cpu", .max_context = int64_t(row.size())});
  return evaluate(*dec, row, 0).loss;
}

double step1_loss(const std::string& out) {
  const auto metrics = test_util::read_metrics(out);
  EXPECT_FALSE(metrics.empty());
  return metrics.empty() ? NAN : metrics[0]["loss"].get<double>();
}

// Largest |a - b| over the tensors of two models of one architecture (fp32 comparison).
double max_weight_diff(const ZayaModel& a, const ZayaModel& b) {
  auto ta = a.named_tensors(), tb = b.named_tensors();
  EXPECT_EQ(ta.size(), tb.size());
  double worst = 0;
  for (size_t i = 0; i < ta.size() && i < tb.size(); i++) {
    EXPECT_EQ(ta[i].first, tb[i].first);
    Tensor x = ta[i].second.to(DType::F32), y = tb[i].second.to(DType::F32);
    EXPECT_EQ(x.shape(), y.shape()) << ta[i].first;
    if (x.shape() != y.shape()) return INFINITY;
    for (int64_t k = 0; k < x.numel(); k++)
      worst = std::max(worst, double(std::fabs(x.f32()[k] - y.f32()[k])));
  }
  return worst;
}

// A run with model.init = `init` starts from that checkpoint's weights: step-1 loss and the
// weights after a step that cannot move them.
void expect_starts_from(const std::string& dir, const std::string& init) {
  const std::string out = dir + "/out";
  fs::remove_all(out);
  test_util::run_training(run_toml(dir, init), out, {});
  const ZayaModel expected = load_model(init);
  const double want = eval_loss(expected), got = step1_loss(out);
  // Training forward and the decoder are separate fp32 code paths over the same weights.
  EXPECT_NEAR(got, want, 1e-6 * want) << init;
  const ZayaModel trained = load_model(out + "/model");
  nlohmann::json want_cfg = expected.cfg.to_json(), got_cfg = trained.cfg.to_json();
  want_cfg.erase("dtype");  // the storage dtype: the run saves fp32
  got_cfg.erase("dtype");
  EXPECT_EQ(got_cfg, want_cfg) << init;
  EXPECT_LE(max_weight_diff(trained, expected), 1e-12) << init;
  // Not the seed's random initialisation, which the same run would otherwise start from.
  EXPECT_GT(max_weight_diff(trained, ZayaModel::init(expected.cfg, 1234)), 1e-3) << init;
}

using test_util::error_of;

}  // namespace

TEST(TrainInit, StartsFromTheTransformersLayoutFixture) {
  const std::string d = test_util::fresh_test_dir("zaya_train_init_");
  write_dataset(d);
  expect_starts_from(d, kFixture);
}

TEST(TrainInit, StartsFromABf16ShardedCheckpoint) {
  const std::string d = test_util::fresh_test_dir("zaya_train_init_");
  write_dataset(d);
  save_model(load_model(kFixture), d + "/bf16", DType::BF16, 100000);
  ASSERT_TRUE(fs::exists(d + "/bf16/model.safetensors.index.json"));
  ASSERT_EQ(load_model(d + "/bf16").layers[0].wq.dtype(), DType::BF16);
  expect_starts_from(d, d + "/bf16");
}

TEST(TrainInit, StartsFromTheOriginalReleaseLayout) {
  const std::string d = test_util::fresh_test_dir("zaya_train_init_");
  write_dataset(d);
  test_util::save_original_layout(load_model(kFixture),
                                  d + "/orig");  // config.json says 999 layers
  const ZayaConfig c = load_model_config(d + "/orig");
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.skip_output, SkipOutput::ScaledInput);
  expect_starts_from(d, d + "/orig");
}

// A resumed run takes its weights from the training checkpoint: with model.init now naming a
// checkpoint of other weights, the split run still equals the straight one bit for bit.
TEST(TrainInit, ResumeIgnoresInit) {
  const std::string d = test_util::fresh_test_dir("zaya_train_init_");
  write_dataset(d);
  ZayaModel other = load_model_f32(kFixture);
  for (auto& [name, t] : other.named_tensors())
    for (int64_t i = 0; i < t.numel(); i++) t.f32()[i] += 0.05f;
  save_model(other, d + "/other");
  const std::vector<std::string> moving = {"--optim.lr=1e-2", "--optim.min_lr=1e-3",
                                           "--train.steps=2", "--checkpoint.every=1"};
  test_util::run_training(run_toml(d, kFixture), d + "/straight", moving);
  auto split1 = moving;
  split1.push_back("--train.steps=1");
  test_util::run_training(run_toml(d, kFixture), d + "/split", split1);
  testing::internal::CaptureStderr();
  test_util::run_training(run_toml(d, d + "/other"), d + "/split", moving, "auto");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("model.init = " + d + "/other is ignored"), std::string::npos) << log;
  const auto a = test_util::read_metrics(d + "/straight"),
             b = test_util::read_metrics(d + "/split");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(a[1]["loss"], b[1]["loss"]);
  EXPECT_NE(a[0]["loss"], a[1]["loss"]);  // the weights moved
  EXPECT_EQ(max_weight_diff(load_model(d + "/straight/model"), load_model(d + "/split/model")), 0);
}

TEST(TrainInit, TheArchitectureComesFromTheCheckpoint) {
  const std::string d = test_util::fresh_test_dir("zaya_train_init_");
  // Left out, model.config is the checkpoint's; it round-trips as "".
  RunConfig c = RunConfig::from_toml("[model]\ninit = \"" + kFixture + "\"\n", "r.toml");
  EXPECT_EQ(c.model.config, "");
  EXPECT_EQ(c.resolve_model().hidden_size, 64);
  const std::string text = c.to_toml();
  RunConfig back = RunConfig::from_toml(text, "checkpoint");
  EXPECT_EQ(back.model.init, kFixture);
  EXPECT_EQ(back.to_toml(), text);
  // A model.config that restates the shapes is accepted; the other fields that differ are noted
  // and the checkpoint's values used.
  ZayaConfig same = load_model_config(kFixture);
  same.rope_hybrid.theta = 5e5;
  std::ofstream(d + "/same.json") << same.to_json().dump();
  std::vector<std::string> notes;
  RunConfig s = RunConfig::from_toml(
      "[model]\nconfig = \"" + d + "/same.json\"\ninit = \"" + kFixture + "\"\n", "r.toml");
  EXPECT_EQ(s.resolve_model(&notes).rope_hybrid.theta, 10000.0);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("rope_parameters"), std::string::npos) << notes[0];
  // A shape that disagrees is refused, naming the field and both values.
  RunConfig t = RunConfig::from_toml("[model]\ninit = \"" + kFixture + "\"\n", "r.toml",
                                     {"--model.config=tiny"});
  const ZayaConfig tiny = ZayaConfig::preset("tiny");
  ASSERT_NE(tiny.hidden_size, 64);
  std::string e = error_of([&] { t.resolve_model(); });
  EXPECT_NE(e.find("model.init = \"" + kFixture + "\""), std::string::npos) << e;
  EXPECT_NE(e.find(fmt::format("hidden_size = {} in model.config, 64 in the checkpoint",
                               tiny.hidden_size)),
            std::string::npos)
      << e;
  // ... and the run stops with that error.
  write_dataset(d);
  e = error_of(
      [&] { test_util::run_training(run_toml(d, kFixture), d + "/out", {"--model.config=tiny"}); });
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
}

TEST(TrainInit, MissingCheckpointsAreRefusedWhenTheConfigIsRead) {
  const std::string d = test_util::fresh_test_dir("zaya_train_init_");
  std::string e = error_of(
      [&] { RunConfig::from_toml("[model]\ninit = \"" + d + "/nowhere\"\n", "run.toml"); });
  EXPECT_NE(e.find("run.toml: model.init = \"" + d + "/nowhere\" is not a directory"),
            std::string::npos)
      << e;
  fs::create_directories(d + "/empty");
  e = error_of([&] { RunConfig::defaults({"--model.init=" + d + "/empty"}); });
  EXPECT_NE(e.find("model.init = \"" + d + "/empty\" has no config.json"), std::string::npos) << e;
  // Without init, model.config may not be empty.
  e = error_of([&] { RunConfig::defaults({"--model.config="}); });
  EXPECT_NE(e.find("model.config"), std::string::npos) << e;
}
