// Sharded, asynchronous checkpoints (ckpt/async_writer.h, ckpt/sharded.h, ckpt/checkpoint.h) in
// one process: the box copy against an element-by-element reference, the background writer's
// bytes and checksums against an independent hash of the files, snapshot consistency (sources
// changed right after submit, with a ring far smaller than the save), pieces written by three
// "ranks" read back as any box, and the refusals: a missing rank file, overlapping pieces, a
// flipped byte, a manifest of another checkpoint.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "../io/io_test_util.h"
#include "ckpt/async_writer.h"
#include "ckpt/checkpoint.h"
#include "ckpt/named_state.h"
#include "ckpt/sharded.h"
#include "io/atomic.h"
#include "io/manifest.h"
#include "io/safetensors.h"

using namespace zaya;
using namespace zaya::iotest;

namespace {

Tensor iota(const Shape& s, float base) {
  Tensor t = Tensor::zeros(s);
  for (int64_t i = 0; i < t.numel(); i++) t.f32()[i] = base + float(i);
  return t;
}

// Element (i, j, k) of a row-major [A, B, C] tensor.
float at3(const Tensor& t, int64_t i, int64_t j, int64_t k) {
  return t.f32()[(i * t.shape()[1] + j) * t.shape()[2] + k];
}

// The pieces of a [6, 4, 3] tensor as three ranks own them: rows [0,1), [1,4), [4,6).
std::vector<NamedState> rank_pieces(const Tensor& whole, int rank) {
  const int64_t first[3] = {0, 1, 4}, count[3] = {1, 3, 2};
  Tensor piece = whole.slice(0, first[rank], first[rank] + count[rank]).clone();
  return {{"optim.muon.momentum.w", piece, whole.shape(), {first[rank], 0, 0}}};
}

// Writes a three-rank checkpoint's files the way the ranks would, then its manifest.
void write_three_ranks(const std::string& dir, const Tensor& whole, const Tensor& bias) {
  std::vector<ManifestEntry> entries;
  for (int r = 0; r < 3; r++) {
    RankContribution c;
    c.rank = r;
    c.world = 3;
    c.state = rank_pieces(whole, r);
    if (r == 0) {
      c.state.push_back({"balance.exp_avg.b", bias, bias.shape(), {0}});
      c.placements = {{"w", {2, 2}, 0}};
      c.weights = {{"w", {2, 2}, bias.f32()}};
      c.config_json = "{}\n";
      TrainerState ts;
      ts.step = 7;
      ts.world = 3;
      ts.save_id = "abc";
      c.trainer_json = ts.to_json().dump();
    }
    AsyncWriter w(0);
    w.submit(rank_checkpoint_files(dir, c));
    for (const WrittenFile& f : w.wait()) entries.push_back({f.rel, f.size, f.xxh64});
  }
  write_manifest_entries(dir, entries, {{"step", 7}, {"save_id", "abc"}});
}

}  // namespace

TEST(CheckpointBoxes, CopyBoxOverlapMatchesElementwise) {
  std::mt19937 rng(3);
  const Tensor g = iota({5, 7, 4}, 0.0f);
  for (int trial = 0; trial < 200; trial++) {
    auto box = [&](std::vector<int64_t>& off, Shape& sh) {
      off.resize(3);
      sh.resize(3);
      for (int d = 0; d < 3; d++) {
        off[size_t(d)] = int64_t(rng() % uint32_t(g.shape()[size_t(d)]));
        sh[size_t(d)] = 1 + int64_t(rng() % uint32_t(g.shape()[size_t(d)] - off[size_t(d)]));
      }
    };
    std::vector<int64_t> po, oo;
    Shape ps, os;
    box(po, ps);
    box(oo, os);
    Tensor piece = Tensor::zeros(ps), out = Tensor::zeros(os);
    for (int64_t i = 0; i < ps[0]; i++)
      for (int64_t j = 0; j < ps[1]; j++)
        for (int64_t k = 0; k < ps[2]; k++)
          piece.f32()[(i * ps[1] + j) * ps[2] + k] = at3(g, po[0] + i, po[1] + j, po[2] + k);
    for (int64_t i = 0; i < out.numel(); i++) out.f32()[i] = -1;
    const int64_t n = copy_box_overlap(piece, po, out, oo);
    int64_t expect = 0;
    for (int64_t i = 0; i < os[0]; i++)
      for (int64_t j = 0; j < os[1]; j++)
        for (int64_t k = 0; k < os[2]; k++) {
          const int64_t gi = oo[0] + i, gj = oo[1] + j, gk = oo[2] + k;
          const bool inside = gi >= po[0] && gi < po[0] + ps[0] && gj >= po[1] &&
                              gj < po[1] + ps[1] && gk >= po[2] && gk < po[2] + ps[2];
          expect += inside;
          ASSERT_EQ(out.f32()[(i * os[1] + j) * os[2] + k], inside ? at3(g, gi, gj, gk) : -1.0f)
              << "trial " << trial;
        }
    EXPECT_EQ(n, expect);
  }
}

TEST(AsyncWriter, FilesHoldTheSnapshotAndTheirChecksums) {
  TempDir d;
  // 1 MiB of source through a 4 KiB ring: the snapshot blocks on the writer many times over.
  std::vector<float> a(1 << 18), b(1000);
  for (size_t i = 0; i < a.size(); i++) a[i] = float(i) * 0.25f;
  for (size_t i = 0; i < b.size(); i++) b[i] = -float(i);
  const std::vector<float> a0 = a, b0 = b;
  AsyncWriter w(4096);
  StreamFile f1{d / "one.bin", "one.bin", "HEAD", {{a.data(), a.size() * 4}, {b.data(), 4000}}};
  StreamFile f2{d / "two.txt", "two.txt", "just text\n", {}};
  w.submit({f1, f2});
  // The snapshot is taken: changing the sources now must not reach the files.
  std::fill(a.begin(), a.end(), 7.0f);
  std::fill(b.begin(), b.end(), 9.0f);
  auto files = w.wait();
  ASSERT_EQ(files.size(), 2u);
  const std::string one = read_raw(d / "one.bin");
  std::string want = "HEAD";
  want.append(reinterpret_cast<const char*>(a0.data()), a0.size() * 4);
  want.append(reinterpret_cast<const char*>(b0.data()), 4000);
  EXPECT_TRUE(one == want);
  EXPECT_EQ(files[0].rel, "one.bin");
  EXPECT_EQ(files[0].size, want.size());
  EXPECT_EQ(files[0].xxh64, XXH64(one.data(), one.size(), 0));
  EXPECT_EQ(files[1].xxh64, xxh64_file(d / "two.txt"));
  EXPECT_EQ(read_raw(d / "two.txt"), "just text\n");
  EXPECT_LE(w.ring_bytes(), 4096u);
  EXPECT_EQ(w.last_bytes(), want.size() + 10);
}

// A ring the writer may not read directly (a GPU ring): every byte goes through StagingMemory::read
// into the bounce buffer, and the files are those of a host ring, byte for byte and checksum for
// checksum, the snapshot included. A read that fails is an error naming the file, and never a hang.
TEST(AsyncWriter, ARingReadThroughABounceBufferWritesTheSameFiles) {
  TempDir d;
  std::vector<float> a(3 << 20), b(777);  // 12 MiB: several ring pieces
  for (size_t i = 0; i < a.size(); i++) a[i] = float(i % 1000003) * 0.5f;
  for (size_t i = 0; i < b.size(); i++) b[i] = float(i) - 300.0f;
  auto files_of = [&](const std::string& tag) {
    return std::vector<StreamFile>{
        {d / (tag + "-one.bin"), "one.bin", "HEAD", {{a.data(), a.size() * 4}, {b.data(), 3000}}},
        {d / (tag + "-two.bin"), "two.bin", "", {{b.data(), b.size() * 4}}}};
  };
  AsyncWriter host(0);
  host.submit(files_of("host"));
  const auto want = host.wait();
  std::atomic<int64_t> read_bytes{0}, bounces{0};
  std::thread::id writer_thread;
  StagingMemory m;
  m.alloc = [](size_t n) {
    auto* p = static_cast<unsigned char*>(::operator new(n, std::align_val_t(64)));
    std::memset(p, 0xAB, n);  // garbage where nothing was copied
    return static_cast<void*>(p);
  };
  m.free = [](void* p) { ::operator delete(p, std::align_val_t(64)); };
  m.read = [&](void* dst, const void* src, size_t n) {
    writer_thread = std::this_thread::get_id();
    std::memcpy(dst, src, n);
    read_bytes += int64_t(n);
  };
  m.bounce_alloc = [&](size_t n) {
    bounces++;
    return ::operator new(n, std::align_val_t(64));
  };
  m.bounce_free = [](void* p) { ::operator delete(p, std::align_val_t(64)); };
  m.where = "test ring";
  {
    AsyncWriter w(size_t(5) << 20, m);  // a ring smaller than the save: the snapshot waits
    w.submit(files_of("ring"));
    const std::vector<float> a0 = a;
    std::fill(a.begin(), a.end(), 1.0f);  // after the snapshot: must not reach the files
    const auto got = w.wait();
    a = a0;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++) {
      EXPECT_EQ(got[i].size, want[i].size) << got[i].rel;
      EXPECT_EQ(got[i].xxh64, want[i].xxh64) << got[i].rel;
    }
    EXPECT_TRUE(read_raw(d / "ring-one.bin") == read_raw(d / "host-one.bin"));
    EXPECT_TRUE(read_raw(d / "ring-two.bin") == read_raw(d / "host-two.bin"));
    EXPECT_EQ(read_bytes.load(), int64_t(a.size() * 4 + 3000 + b.size() * 4));
    EXPECT_EQ(bounces.load(), 1);
    EXPECT_NE(writer_thread, std::this_thread::get_id());
    EXPECT_EQ(w.ring_where(), "test ring");
  }
  m.read = [](void*, const void*, size_t) { throw Error("device unreachable"); };
  AsyncWriter w(0, m);
  w.submit(files_of("bad"));
  expect_error([&] { w.wait(); }, {"bad-one.bin", "device unreachable"});
  w.submit({{d / "next.bin", "next.bin", "ok", {}}});
  EXPECT_EQ(w.wait().size(), 1u);
}

TEST(AsyncWriter, AFailedWriteIsReportedAndNeverHangs) {
  TempDir d;
  std::vector<float> a(100000, 1.0f);
  AsyncWriter w(8192);
  w.submit({{d / "missing-dir/x.bin", "x.bin", "", {{a.data(), a.size() * 4}}}});
  expect_error([&] { w.wait(); }, {"missing-dir/x.bin"});
  // The writer takes the next save.
  w.submit({{d / "y.bin", "y.bin", "ok", {}}});
  EXPECT_EQ(w.wait().size(), 1u);
}

TEST(ShardedState, ThreeRanksReadBackAsAnyBox) {
  TempDir d;
  const Tensor whole = iota({6, 4, 3}, 1.0f), bias = iota({5}, 100.0f);
  write_three_ranks(d.path(), whole, bias);
  ASSERT_TRUE(verify_manifest(d.path()).ok);
  auto s = ShardedState::open(d.path(), read_manifest(d.path()), true);
  EXPECT_EQ(s->writer_world(), 3);
  EXPECT_EQ(s->names(), (std::vector<std::string>{"balance.exp_avg.b", "optim.muon.momentum.w"}));
  EXPECT_EQ(s->pieces("optim.muon.momentum.w").size(), 3u);
  const Tensor back = s->read_whole("optim.muon.momentum.w");
  EXPECT_EQ(0, std::memcmp(back.raw(), whole.raw(), whole.nbytes()));
  // Rows [2, 5) straddle ranks 1 and 2: a reader at another world size owning them.
  const Tensor rows = s->read_rows("optim.muon.momentum.w", 2, 3);
  EXPECT_EQ(0, std::memcmp(rows.raw(), whole.slice(0, 2, 5).clone().raw(), rows.nbytes()));
  const Tensor b = s->read_whole("balance.exp_avg.b");
  EXPECT_EQ(0, std::memcmp(b.raw(), bias.raw(), bias.nbytes()));
  // Only the files read from were verified: rank 0's (bias, row 0 not needed here: rows 2..4
  // touched ranks 1 and 2) -- all three by now.
  EXPECT_GT(s->verified_bytes(), 0u);
  expect_error(
      [&] {
        s->read("optim.muon.momentum.w", {5, 0, 0}, {2, 4, 3});
      },
      {"optim.muon.momentum.w", "outside"});
}

TEST(ShardedState, RefusesAMissingRankFileAndCorruptBytes) {
  TempDir d;
  const Tensor whole = iota({6, 4, 3}, 1.0f), bias = iota({5}, 100.0f);
  write_three_ranks(d.path(), whole, bias);
  // Rank 1's file gone from the manifest and the directory: the rows it held are uncovered.
  {
    Manifest m = read_manifest(d.path());
    std::vector<ManifestEntry> kept;
    for (auto& e : m.files)
      if (e.path != state_file_rel(1, 3)) kept.push_back(e);
    m.files = kept;
    expect_error([&] { ShardedState::open(d.path(), m, true); },
                 {"optim.muon.momentum.w", "cover 36 of its 72 elements"});
  }
  // A flipped byte in rank 2's data: refused, naming the file, when its rows are read.
  const std::string f = d / state_file_rel(2, 3);
  std::string bytes = read_raw(f);
  bytes[bytes.size() - 3] ^= 0x10;
  write_raw(f, bytes);
  auto s = ShardedState::open(d.path(), read_manifest(d.path()), true);
  EXPECT_NO_THROW(s->read_rows("optim.muon.momentum.w", 0, 1));  // rank 0's rows only
  expect_error([&] { s->read_rows("optim.muon.momentum.w", 4, 2); },
               {state_file_rel(2, 3), "checksum"});
  EXPECT_FALSE(verify_manifest(d.path()).ok);
}

TEST(ShardedState, RefusesOverlappingPieces) {
  TempDir d;
  const Tensor whole = iota({4, 2}, 0.0f);
  std::vector<ManifestEntry> entries;
  for (int r = 0; r < 2; r++) {
    RankContribution c;
    c.rank = r;
    c.world = 2;
    // Rows [0, 2) and [1, 3): row 1 twice and row 3 never, yet 8 elements in all, as the tensor
    // has (the count alone would pass).
    c.state = {{"s", whole.slice(0, r, r + 2).clone(), {4, 2}, {r, 0}}};
    AsyncWriter w(0);
    w.submit(rank_checkpoint_files(d.path(), c));
    for (const WrittenFile& f : w.wait()) entries.push_back({f.rel, f.size, f.xxh64});
  }
  write_manifest_entries(d.path(), entries);
  expect_error([&] { ShardedState::open(d.path(), read_manifest(d.path()), true); },
               {"pieces of 's'", "overlap"});
}

TEST(Checkpointer, OneProcessSavesCommitsAndPrunes) {
  TempDir d;
  const std::string root = d / "ck";
  Tensor w = iota({3, 4}, 0.5f);
  Tensor mom = iota({3, 4}, -3.0f);
  auto contribution = [&](int64_t step, const std::string& id) {
    RankContribution c;
    c.weights = {{"model.w", {3, 4}, w.f32()}};
    c.placements = {{"model.w", {3, 4}, 0}};
    c.state = whole_tensors({{"optim.muon.momentum.model.w", mom}});
    c.config_json = "{}\n";
    TrainerState ts;
    ts.step = step;
    ts.save_id = id;
    ts.data_cursor = nullptr;
    c.trainer_json = ts.to_json().dump();
    return c;
  };
  {
    Checkpointer ck(root, 2, 0, {}, nullptr, "job1");
    for (int64_t step : {1, 2, 3}) {
      const std::string id = Checkpointer::new_save_id(step);
      ck.begin(step, contribution(step, id), id);
      EXPECT_TRUE(ck.in_flight());
      // Training goes on: the weights change after the snapshot.
      w.f32()[0] += 1.0f;
      const std::string dir = ck.finish();
      EXPECT_EQ(dir, root + "/" + checkpoint_dir_name(step));
      EXPECT_TRUE(check_checkpoint(dir).ok) << check_checkpoint(dir).reason;
      // Every file is in the manifest: the weight shard, the index, the config, the state file
      // and trainer.json.
      const Manifest m = read_manifest(dir);
      std::vector<std::string> paths;
      for (const auto& e : m.files) paths.push_back(e.path);
      EXPECT_EQ(paths, (std::vector<std::string>{
                           "model/config.json", "model/model-00001-of-00001.safetensors",
                           "model/model.safetensors.index.json",
                           "state/rank-00000-of-00001.safetensors", "trainer.json"}));
      EXPECT_TRUE(verify_manifest(dir).unlisted.empty());
    }
    EXPECT_EQ(ck.stats().blocking_ms.size(), 0u);  // recorded by the caller
    EXPECT_EQ(ck.stats().bytes.size(), 3u);
  }
  // keep_last = 2: step 1 is gone, 2 and 3 remain; no staging leftovers.
  EXPECT_EQ(list_dir(root), (std::vector<std::string>{"step-00000002", "step-00000003"}));
  // The bytes of step 3 are the weights at its snapshot (w[0] was 0.5 + 2 then).
  {
    auto st = TensorStore::open(root + "/step-00000003/model");
    EXPECT_EQ(st->get("model.w").f32()[0], 2.5f);
    EXPECT_EQ(st->get("model.w").f32()[1], 1.5f);
  }
  EXPECT_EQ(find_resumable_checkpoint(root), root + "/step-00000003");
  // A manifest from another checkpoint: refused (the step and the save id disagree), and the
  // resume falls back to step 2.
  std::filesystem::copy_file(root + "/step-00000002/manifest.json",
                             root + "/step-00000003/manifest.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::vector<std::string> skipped;
  EXPECT_EQ(find_resumable_checkpoint(root, &skipped), root + "/step-00000002");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step-00000003"), std::string::npos) << skipped[0];
  // A staging directory of an interrupted job is removed by the next job's Checkpointer.
  std::filesystem::create_directories(root + "/.tmp-step-00000009-deadjob/state");
  Checkpointer again(root, 2, 0, {}, nullptr, "job2");
  EXPECT_FALSE(std::filesystem::exists(root + "/.tmp-step-00000009-deadjob"));
}
