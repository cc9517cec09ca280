// The checkpoint tools (ckpt/inspect.h, ckpt/export_hf.h, train/ckpt_tools.h) on a checkpoint of a
// real one-process training run (two steps of a small model):
//  - export-hf: fp32 shards hold the checkpoint's tensors bit for bit (several shards and the
//    index), bf16 ones equal an independent round-to-nearest-even of them (balancing biases fp32),
//    config.json says the dtype; refusals (an existing OUT, an OUT inside the checkpoint, a
//    corrupt shard) leave no output behind;
//  - reshard: to 3 ranks with the CPU plan (experts split) and 2 with the CUDA plan (whole
//    tensors): every digest equals the source's, each output verifies, each rank file holds
//    exactly the boxes that rank owns under the plan for M, and a run resumed from the reshaped
//    checkpoint trains bit for bit like one resumed from the original.
// tests/cli/ckpt_tools.sh runs the same commands through the CLI on a 4-rank checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "ckpt/checkpoint.h"
#include "ckpt/export_hf.h"
#include "ckpt/inspect.h"
#include "ckpt/model_io.h"
#include "ckpt/sharded.h"
#include "core/json.h"
#include "dist/zero1.h"
#include "engine/data_parallel_step.h"
#include "io/atomic.h"
#include "io/safetensors.h"
#include "train/ckpt_tools.h"
#include "train/run_config.h"
#include "train_test_util.h"

using namespace zaya;
namespace fs = std::filesystem;

namespace {

// Two layers, hidden 32, three experts: 4 steps, a checkpoint at step 2 (and the final one).
constexpr test_util::BlendRunShape kShape{4, 2, 16, 3, 24};

struct Trained {
  std::string dir, toml, ckpt;  // the test's directory, the run config, the step-2 checkpoint
};

Trained train_two_steps() {
  Trained t;
  t.dir = test_util::fresh_test_dir("zaya_ckpt_tools_");
  test_util::write_blend_inputs(t.dir, test_util::small_model_config(), 40, 20, 17);
  t.toml = test_util::blend_run_toml(t.dir, kShape);
  test_util::run_training(t.toml, t.dir + "/run", {"--train.steps=2"});
  t.ckpt = t.dir + "/run/checkpoints/" + checkpoint_dir_name(2);
  return t;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round to nearest, ties to even, written out independently of core/dtype.h.
uint16_t bf16_reference(float f) {
  const uint32_t u = bits(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  const uint32_t lower = u & 0xffffu, upper = u >> 16;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) return uint16_t(upper + 1);
  return uint16_t(upper);
}

std::map<std::string, std::string> digests(const std::string& dir) {
  std::map<std::string, std::string> d;
  const CheckpointSummary s = inspect_checkpoint(dir, true);
  for (const auto& w : s.weights) d[w.name] = w.digest;
  for (const auto& t : s.state) d[t.name] = t.digest;
  return d;
}

std::vector<std::string> losses(const std::string& out) {
  std::vector<std::string> v;
  for (const auto& j : test_util::read_metrics(out))
    v.push_back(std::to_string(j["step"].get<int64_t>()) + ":" + j["loss"].dump());
  return v;
}

bool no_staging_left(const std::string& parent) {
  for (const auto& e : fs::directory_iterator(parent))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) return false;
  return true;
}

}  // namespace

TEST(CkptExport, Fp32IsBitExactAndBf16IsRoundedToNearestEven) {
  const Trained t = train_two_steps();
  const ZayaModel src = load_model(t.ckpt + "/model");
  const auto want = src.named_tensors();
  // Small shards: several files and an index.
  HfExportOptions o;
  o.dtype = DType::F32;
  o.max_shard_bytes = 40000;
  o.tokenizer = "bytes";
  const HfExportResult r32 = export_hf(t.ckpt, t.dir + "/hf32", o);
  EXPECT_TRUE(fs::exists(t.dir + "/hf32/" + std::string(kSafetensorsIndexName)));
  EXPECT_GT(r32.files.size(), 4u);
  EXPECT_TRUE(fs::exists(t.dir + "/hf32/tokenizer.txt"));
  const auto cfg32 = parse_json(read_file(t.dir + "/hf32/config.json"), "config.json");
  EXPECT_EQ(cfg32["dtype"], "float32");
  const ZayaModel m32 = load_model(t.dir + "/hf32");
  const auto got32 = m32.named_tensors();
  ASSERT_EQ(got32.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) {
    ASSERT_EQ(got32[i].first, want[i].first);
    const Tensor a = want[i].second.to(DType::F32), b = got32[i].second.to(DType::F32);
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << want[i].first;
  }

  o.dtype = DType::BF16;
  o.max_shard_bytes = size_t(5) << 30;  // one file, no index
  const HfExportResult r16 = export_hf(t.ckpt, t.dir + "/hf16", o);
  EXPECT_EQ(r16.files,
            (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.txt"}));
  const auto cfg16 = parse_json(read_file(t.dir + "/hf16/config.json"), "config.json");
  EXPECT_EQ(cfg16["dtype"], "bfloat16");
  const auto file = SafetensorsFile::open(t.dir + "/hf16/model.safetensors");
  EXPECT_EQ(file->metadata().at("format"), "pt");
  int64_t checked = 0, biases = 0;
  for (const auto& [name, w] : want) {
    const Tensor stored = file->get(name);
    const Tensor f = w.to(DType::F32);
    if (name.find("balancing_biases") != std::string::npos) {
      biases++;
      ASSERT_EQ(stored.dtype(), DType::F32) << name;
      EXPECT_EQ(0, std::memcmp(stored.raw(), f.raw(), f.nbytes())) << name;
      continue;
    }
    ASSERT_EQ(stored.dtype(), DType::BF16) << name;
    const uint16_t* h = stored.u16();
    for (int64_t k = 0; k < f.numel(); k++)
      ASSERT_EQ(h[k], bf16_reference(f.f32()[k])) << name << " element " << k;
    checked += f.numel();
  }
  EXPECT_EQ(biases, 2);
  EXPECT_GT(checked, 10000);
  // zaya's own loader reads the bf16 export.
  EXPECT_EQ(load_model(t.dir + "/hf16").named_tensors().size(), want.size());
}

TEST(CkptExport, RefusalsLeaveNothingBehind) {
  const Trained t = train_two_steps();
  HfExportOptions o;
  fs::create_directories(t.dir + "/taken");
  std::ofstream(t.dir + "/taken/mine.txt") << "user data\n";
  try {
    export_hf(t.ckpt, t.dir + "/taken", o);
    FAIL() << "an existing OUT was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(t.dir + "/taken/mine.txt"));
  EXPECT_THROW(export_hf(t.ckpt, t.ckpt + "/model", o), Error);  // would replace the input
  EXPECT_THROW(export_hf(t.ckpt, t.ckpt + "/inside", o), Error);
  EXPECT_FALSE(fs::exists(t.ckpt + "/inside"));
  o.force = true;
  export_hf(t.ckpt, t.dir + "/taken", o);
  EXPECT_FALSE(fs::exists(t.dir + "/taken/mine.txt"));
  EXPECT_TRUE(fs::exists(t.dir + "/taken/model.safetensors"));
  // One flipped byte in a model shard: refused, naming the shard; no OUT.
  std::string shard;
  for (const auto& e : fs::directory_iterator(t.ckpt + "/model"))
    if (e.path().extension() == ".safetensors") shard = e.path().string();
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-3, std::ios::end);
    f.put(char(c ^ 0x10));
  }
  try {
    export_hf(t.ckpt, t.dir + "/bad", HfExportOptions{});
    FAIL() << "a corrupt shard was exported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fs::path(shard).filename().string()), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(t.dir + "/bad"));
  EXPECT_TRUE(no_staging_left(t.dir));
}

TEST(CkptReshard, DigestsLayoutAndResumeMatchTheSource) {
  const Trained t = train_two_steps();
  const auto src_digests = digests(t.ckpt);
  const RunConfig rc = RunConfig::from_toml(t.toml, "test.toml");
  ZayaModel model = load_model(t.ckpt + "/model");
  const auto items = zero1_items(model, rc.optim.optimizer_settings());
  for (const int m : {3, 2}) {
    const std::string out = t.dir + "/r" + std::to_string(m);
    ReshardOptions o;
    o.ranks = m;
    const ReshardResult r = reshard_checkpoint(t.ckpt, out, o);
    EXPECT_EQ(r.from_world, 1);
    EXPECT_EQ(r.to_world, m);
    const CheckpointVerdict v = verify_checkpoint(out);
    EXPECT_TRUE(v.ok) << (v.problems.empty() ? "" : v.problems[0]);
    EXPECT_EQ(digests(out), src_digests) << m;
    const LoadedCheckpoint ck = load_checkpoint(out);
    EXPECT_EQ(ck.trainer.world, m);
    EXPECT_EQ(ck.trainer.step, 2);
    EXPECT_EQ(ck.trainer.save_id, r.save_id);
    EXPECT_EQ(ck.manifest.extra["resharded_from"]["world"], 1);
    // Each rank file holds exactly that rank's boxes under the plan for m.
    const Zero1Plan plan = plan_zero1(items, m, 1, /*split_slices=*/true);
    int64_t sliced = 0;
    ASSERT_EQ(ck.state->files().size(), size_t(m));
    for (int rank = 0; rank < m; rank++) {
      std::set<std::string> want, got;
      for (const OwnedStatePiece& p : owned_state_pieces(plan, items, rank)) {
        want.insert(fmt::format("{} {} {}", p.name, shape_str(p.offset), shape_str(p.shape)));
        sliced += !p.whole;
      }
      for (const std::string& name : ck.state->names())
        for (const ShardedState::Piece& p : ck.state->pieces(name))
          if (ck.state->file_rank(p.file) == rank && name.rfind("balance.", 0) != 0)
            got.insert(fmt::format("{} {} {}", name, shape_str(p.offset), shape_str(p.shape)));
      EXPECT_EQ(got, want) << "rank " << rank << " of " << m;
    }
    EXPECT_GT(sliced, 0) << "the experts are split between the ranks";
    // The weights: each in the shard of its writer.
    const std::vector<int> writers = weight_writers(plan);
    const auto store = TensorStore::open(out + "/model");
    for (size_t i = 0; i < items.size(); i++)
      EXPECT_EQ(fs::path(store->file_of(items[i].name)).filename().string(),
                fs::path(model_file_rel(writers[i], m)).filename().string())
          << items[i].name;
  }
  // Two more steps from the reshaped checkpoint equal two more from the original.
  test_util::run_training(t.toml, t.dir + "/from_src", {}, t.ckpt);
  test_util::run_training(t.toml, t.dir + "/from_r3", {}, t.dir + "/r3");
  const auto a = losses(t.dir + "/from_src"), b = losses(t.dir + "/from_r3");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b);
}

TEST(CkptReshard, BadRanksAndOutputsAreRefused) {
  const Trained t = train_two_steps();
  const auto refused = [&](int64_t ranks, const std::string& out, const std::string& needle) {
    ReshardOptions o;
    o.ranks = ranks;
    try {
      reshard_checkpoint(t.ckpt, out, o);
      ADD_FAILURE() << "accepted --ranks " << ranks << " --out " << out;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(0, t.dir + "/r0", "--ranks 0");
  refused(100000, t.dir + "/rbig", "--ranks 100000");
  refused(2, t.dir + "/step-00000009", "step-00000002");
  refused(2, t.ckpt, "input");
  fs::create_directories(t.dir + "/exists");
  refused(2, t.dir + "/exists", "--force");
  // Not a checkpoint.
  try {
    resolve_checkpoint_dir(t.dir + "/exists");
    ADD_FAILURE() << "an empty directory passed for a checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a checkpoint"), std::string::npos) << e.what();
  }
  // A root resolves to its newest valid checkpoint; a corrupt newest one falls back.
  test_util::run_training(t.toml, t.dir + "/run", {}, "auto");  // adds step 4
  const std::string root = t.dir + "/run/checkpoints";
  EXPECT_EQ(resolve_checkpoint_dir(t.dir + "/run"), root + "/" + checkpoint_dir_name(4));
  fs::remove(root + "/" + checkpoint_dir_name(4) + "/" + state_file_rel(0, 1));
  EXPECT_EQ(resolve_checkpoint_dir(root), t.ckpt);
  const CheckpointVerdict v = verify_checkpoint(root + "/" + checkpoint_dir_name(4));
  EXPECT_FALSE(v.ok);
  ASSERT_FALSE(v.problems.empty());
  EXPECT_NE(v.problems[0].find(state_file_rel(0, 1)), std::string::npos) << v.problems[0];
  EXPECT_FALSE(fs::exists(t.dir + "/r0"));
  EXPECT_TRUE(no_staging_left(t.dir));
}
