// Checkpoint manifests: contents checked against sizes and XXH64 one-shot digests computed here
// from the bytes; corruption (flipped byte, truncation, missing file, bad manifest) is reported
// with the file's name.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic.h"
#include "io/manifest.h"
#include "io/safetensors.h"
#include "io_test_util.h"

using namespace zaya;
using namespace zaya::iotest;
using json = nlohmann::json;

namespace {
// A small checkpoint: weights, a rank subfolder, a file of JSON.
void make_checkpoint(const std::string& dir) {
  std::filesystem::create_directories(dir + "/rank1");
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); i++) v[i] = float(i) * 0.5f;
  save_safetensors(dir + "/model.safetensors", {{"w", Tensor::from_vector(v, {10, 100})}});
  write_raw(dir + "/rank1/optimizer.bin", std::string(777, 'o'));
  write_raw(dir + "/config.json", R"({"d": 8})");
}
}  // namespace

TEST(Manifest, ListsEveryFileWithSizeAndChecksum) {
  TempDir tmp;
  const std::string dir = tmp / "ck";
  make_checkpoint(dir);
  write_raw(dir + "/leftover.bin.tmp.4242", "stale temp of a crashed writer");
  write_manifest(dir, {{"step", 100}, {"phase", "pretrain"}});

  json doc = json::parse(read_raw(dir + "/manifest.json"));
  EXPECT_EQ(doc["version"], 1);
  EXPECT_EQ(doc["extra"]["step"], 100);
  std::vector<std::string> paths;
  for (const auto& f : doc["files"]) {
    const std::string p = f["path"];
    paths.push_back(p);
    const std::string bytes = read_raw(dir + "/" + p);
    EXPECT_EQ(f["size"].get<uint64_t>(), bytes.size()) << p;
    EXPECT_EQ(f["xxh64"].get<std::string>(),
              fmt::format("{:016x}", XXH64(bytes.data(), bytes.size(), 0)))
        << p;
  }
  EXPECT_EQ(paths,
            (std::vector<std::string>{"config.json", "model.safetensors", "rank1/optimizer.bin"}));

  ManifestCheck c = verify_manifest(dir);
  EXPECT_TRUE(c.ok) << c.reason;
  EXPECT_TRUE(c.reason.empty());
  EXPECT_EQ(c.manifest.extra["phase"], "pretrain");
  EXPECT_EQ(c.manifest.files.size(), 3u);
  EXPECT_TRUE(c.unlisted.empty());
  // A file added later is not corruption, but it is reported.
  write_raw(dir + "/notes.txt", "x");
  c = verify_manifest(dir);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.unlisted, (std::vector<std::string>{"notes.txt"}));
}

TEST(Manifest, DetectsFlippedByte) {
  TempDir tmp;
  const std::string dir = tmp / "ck";
  make_checkpoint(dir);
  write_manifest(dir);
  std::string b = read_raw(dir + "/model.safetensors");
  const uint64_t want = XXH64(b.data(), b.size(), 0);
  b[b.size() / 2] ^= 0x10;
  write_raw(dir + "/model.safetensors", b);
  const uint64_t got = XXH64(b.data(), b.size(), 0);
  ManifestCheck c = verify_manifest(dir);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason,
            fmt::format("model.safetensors: checksum 0x{:016x} expected 0x{:016x}", got, want));
  // Size-only checking cannot see a flipped byte, by design.
  EXPECT_TRUE(verify_manifest(dir, /*check_hashes=*/false).ok);
}

TEST(Manifest, DetectsTruncatedAndMissingFiles) {
  TempDir tmp;
  const std::string dir = tmp / "ck";
  make_checkpoint(dir);
  write_manifest(dir);
  write_raw(dir + "/rank1/optimizer.bin", std::string(700, 'o'));
  ManifestCheck c = verify_manifest(dir, /*check_hashes=*/false);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason, "rank1/optimizer.bin: size 700 expected 777");

  std::filesystem::remove(dir + "/config.json");
  c = verify_manifest(dir);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason, "config.json: missing");  // files are checked in path order
  EXPECT_EQ(c.problems.size(), 2u);
}

TEST(Manifest, MissingOrMalformedManifest) {
  TempDir tmp;
  const std::string dir = tmp / "ck";
  make_checkpoint(dir);
  ManifestCheck c = verify_manifest(dir);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason.rfind("manifest.json missing or malformed", 0), 0u) << c.reason;

  write_manifest(dir, {{"step", 1}});
  const std::string good = read_raw(dir + "/manifest.json");
  auto check_bad = [&](const std::string& text, const std::string& part) {
    write_raw(dir + "/manifest.json", text);
    ManifestCheck r = verify_manifest(dir);
    EXPECT_FALSE(r.ok) << text;
    EXPECT_EQ(r.reason.rfind("manifest.json missing or malformed", 0), 0u) << r.reason;
    EXPECT_NE(r.reason.find(part), std::string::npos) << r.reason;
    expect_error([&] { read_manifest(dir); }, {"manifest.json", part});
  };
  check_bad(good.substr(0, good.size() / 2), "not valid JSON");
  json j = json::parse(good);
  j["version"] = 2;
  check_bad(j.dump(), "version 2");
  j = json::parse(good);
  j["files"][0]["xxh64"] = "xyz";
  check_bad(j.dump(), "xxh64");
  j = json::parse(good);
  j["files"][0]["path"] = "../escape";
  check_bad(j.dump(), "../escape");
  j = json::parse(good);
  j["files"][1]["path"] = j["files"][0]["path"];
  check_bad(j.dump(), "listed twice");
  j = json::parse(good);
  j["files"][0].erase("size");
  check_bad(j.dump(), "size");

  expect_error([&] { write_manifest(dir, json::array()); }, {dir, "extra must be a JSON object"});
  expect_error([&] { write_manifest(tmp / "absent"); }, {tmp / "absent", "not a directory"});
}

TEST(Manifest, WorksInsideAtomicDirCommit) {
  // The intended protocol: files, then the manifest last, then one rename.
  TempDir tmp;
  const std::string final_dir = tmp / "step-5";
  {
    AtomicDirCommit c(final_dir);
    make_checkpoint(c.staging());
    write_manifest(c.staging(), {{"step", 5}});
    c.commit();
  }
  ManifestCheck r = verify_manifest(final_dir);
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(r.manifest.extra["step"], 5);
  EXPECT_EQ(TensorStore::open(final_dir)->get("w").f32()[999], 499.5f);
}
