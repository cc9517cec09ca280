// The training loop end to end on a small model: N steps straight equal N/2 steps, a checkpoint,
// and N/2 resumed steps, bit for bit (losses and weights), across a phase change (sequence length
// and RoPE theta) with a two-dataset blend and gradient accumulation; `--resume auto` skips a
// checkpoint whose checksum fails and says why.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "io/manifest.h"
#include "ckpt/model_io.h"
#include "model/zaya.h"
#include "ckpt/checkpoint.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace zaya;

namespace {

// A small model (test_util::small_model_config: two layers, hidden 32, three experts).
std::string setup_dir() {
  const std::string d = test_util::fresh_test_dir("zaya_train_resume_");
  test_util::write_blend_inputs(d, test_util::small_model_config(), 40, 20, 17);
  return d;
}

// 6 steps, the phase change after step 4, a checkpoint every 3 steps.
constexpr test_util::BlendRunShape kShape{6, 3, 16, 4, 24};

std::vector<std::string> losses(const std::string& out) {
  std::vector<std::string> v;
  for (const auto& j : test_util::read_metrics(out))
    v.push_back(std::to_string(j["step"].get<int64_t>()) + ":" + j["loss"].dump());
  return v;
}

TrainResult run(const std::string& d, const std::string& out, const std::vector<std::string>& ov,
                const std::string& resume = "") {
  return test_util::run_training(test_util::blend_run_toml(d, kShape), out, ov, resume);
}

}  // namespace

TEST(TrainResume, SplitRunIsBitExactAcrossPhaseChangeAndBlend) {
  const std::string d = setup_dir();
  TrainResult a = run(d, d + "/straight", {});
  EXPECT_EQ(a.steps, 6);
  TrainResult b1 = run(d, d + "/split", {"--train.steps=3"});
  EXPECT_EQ(b1.steps, 3);
  TrainResult b2 = run(d, d + "/split", {}, "auto");
  EXPECT_EQ(b2.steps, 6);
  auto la = losses(d + "/straight"), lb = losses(d + "/split");
  ASSERT_EQ(la.size(), 6u);
  EXPECT_EQ(la, lb);
  ZayaModel ma = load_model(d + "/straight/model"), mb = load_model(d + "/split/model");
  auto ta = ma.named_tensors(), tb = mb.named_tensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); i++)
    EXPECT_EQ(0, std::memcmp(ta[i].second.raw(), tb[i].second.raw(), ta[i].second.nbytes()))
        << ta[i].first;
  // Training did something: the weights moved and the balancing biases were updated.
  ZayaModel init = ZayaModel::init(ma.cfg, 7);
  EXPECT_NE(0,
            std::memcmp(init.layers[0].wq.raw(), ma.layers[0].wq.raw(), ma.layers[0].wq.nbytes()));
  EXPECT_NE(ma.layers[0].balancing_bias.f32()[0], 0.0f);
}

TEST(TrainResume, AutoResumeSkipsACorruptCheckpoint) {
  const std::string d = setup_dir();
  run(d, d + "/r", {});
  const std::string root = d + "/r/checkpoints";
  ASSERT_TRUE(verify_manifest(root + "/step-00000006").ok);
  // Flip one byte of the newest checkpoint's weights.
  const std::string f = root + "/step-00000006/model/model-00001-of-00001.safetensors";
  {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-5, std::ios::end);
    char c;
    io.read(&c, 1);
    io.seekp(-5, std::ios::end);
    c ^= 0x40;
    io.write(&c, 1);
  }
  std::vector<std::string> skipped;
  EXPECT_EQ(find_resumable_checkpoint(root, &skipped), root + "/step-00000003");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("model/model-00001-of-00001.safetensors"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find("checksum"), std::string::npos) << skipped[0];
  // An explicit resume from the corrupt one is refused with the reason.
  try {
    run(d, d + "/r", {}, root + "/step-00000006");
    FAIL() << "resumed from a corrupt checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  // A fresh run into a directory with checkpoints is refused (nothing is overwritten).
  EXPECT_THROW(run(d, d + "/r", {}), Error);
  EXPECT_TRUE(verify_manifest(root + "/step-00000003").ok);
}

// The other corruptions of the newest checkpoint: each is refused naming the file, and resuming
// falls back to the previous checkpoint.
TEST(TrainResume, AutoResumeSkipsTruncatedMissingAndForeignFiles) {
  namespace fs = std::filesystem;
  const std::string d = setup_dir();
  run(d, d + "/r", {});
  const std::string root = d + "/r/checkpoints", last = root + "/step-00000006";
  const std::string keep = d + "/step6-copy";
  fs::copy(last, keep, fs::copy_options::recursive);
  struct Case {
    const char* what;
    std::function<void()> damage;
    const char* expect;  // in the reason
  };
  const std::string state = last + "/state/rank-00000-of-00001.safetensors";
  const std::vector<Case> cases = {
      {"truncated", [&] { fs::resize_file(state, fs::file_size(state) - 100); },
       "state/rank-00000-of-00001.safetensors"},
      {"missing", [&] { fs::remove(state); }, "state/rank-00000-of-00001.safetensors: missing"},
      {"foreign manifest",
       [&] {
         fs::copy_file(root + "/step-00000003/manifest.json", last + "/manifest.json",
                       fs::copy_options::overwrite_existing);
       },
       "expected"},  // the first file whose size or checksum is not the listed one
  };
  for (const Case& c : cases) {
    fs::remove_all(last);
    fs::copy(keep, last, fs::copy_options::recursive);
    ASSERT_EQ(find_resumable_checkpoint(root), last) << c.what;
    c.damage();
    std::vector<std::string> skipped;
    EXPECT_EQ(find_resumable_checkpoint(root, &skipped), root + "/step-00000003") << c.what;
    ASSERT_EQ(skipped.size(), 1u) << c.what;
    EXPECT_NE(skipped[0].find(c.expect), std::string::npos) << c.what << ": " << skipped[0];
  }
  // And the run resumes from step 3 and ends where the straight run does.
  TrainResult r = run(d, d + "/r", {}, "auto");
  EXPECT_EQ(r.steps, 6);
}

TEST(TrainResume, UnwritableOutputIsAnError) {
  const std::string d = setup_dir();
  std::ofstream(d + "/plainfile") << "x";
  try {
    run(d, d + "/plainfile/out", {});
    FAIL() << "trained into a path under a regular file";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("plainfile"), std::string::npos) << e.what();
  }
}
