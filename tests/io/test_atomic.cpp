// Atomic file and directory commits: failures leave neither a partial file nor a temp file and
// keep the previous version; XXH64 against values computed by the independent `xxhsum` tool.
// The tests run as root in CI, which ignores permission bits, so failures are forced with paths
// that cannot exist (under a regular file, under a missing directory, in /proc) and with
// RLIMIT_FSIZE, which makes write() fail like a full disk does.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <xxhash.h>

#include "io/atomic.h"
#include "io/safetensors.h"
#include "io_test_util.h"

using namespace zaya;
using namespace zaya::iotest;

namespace {
// ((i*31+7) ^ (i>>11)) & 255: generated identically here and for the xxhsum reference values.
std::string pattern_bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i++) s[i] = char(((i * 31 + 7) ^ (i >> 11)) & 255);
  return s;
}
}  // namespace

TEST(Atomic, WriteReplacesWholeFileAndLeavesNoTemp) {
  TempDir tmp;
  const std::string p = tmp / "f.txt";
  write_file_atomic(p, "first version");
  write_file_atomic(p, "second");
  EXPECT_EQ(read_raw(p), "second");
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"f.txt"}));
  EXPECT_EQ(read_file(p), "second");
  expect_error([&] { read_file(tmp / "nope"); }, {tmp / "nope"});
}

TEST(Atomic, UncommittedWriterKeepsPreviousFile) {
  TempDir tmp;
  const std::string p = tmp / "f.txt";
  write_file_atomic(p, "old contents");
  {
    AtomicFileWriter w(p);
    w.write("new contents that never get committ");
    EXPECT_EQ(read_raw(p), "old contents");  // nothing visible before commit
    // w is destroyed here as if an exception had unwound past it.
  }
  EXPECT_EQ(read_raw(p), "old contents");
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"f.txt"}));
}

TEST(Atomic, UnwritableLocationsFailNamingThePath) {
  TempDir tmp;
  write_raw(tmp / "plainfile", "x");
  // A regular file where a directory should be, a missing directory, and /proc (no new files).
  for (const std::string& p : {tmp / "plainfile/out.bin", tmp / "missing/dir/out.bin",
                               std::string("/proc/zaya-io-test")}) {
    SCOPED_TRACE(p);
    expect_error([&] { write_file_atomic(p, "data"); }, {p});
    expect_error([&] { save_safetensors(p, {{"w", Tensor::zeros({4})}}); }, {p});
  }
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"plainfile"}));
  EXPECT_EQ(read_raw(tmp / "plainfile"), "x");
}

TEST(Atomic, FailedWriteMidwayKeepsPreviousFileIntact) {
  TempDir tmp;
  const std::string p = tmp / "model.safetensors";
  save_safetensors(p, {{"w", Tensor::from_vector({1, 2, 3}, {3})}});
  const std::string before = read_raw(p);

  // A 1 MiB file-size limit makes the second megabyte's write() fail with EFBIG, exactly where a
  // full disk fails with ENOSPC: in the middle of the data.
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg;
  try {
    save_safetensors(p, {{"big", Tensor::zeros({1 << 19})}});  // 2 MiB
  } catch (const Error& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);

  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_EQ(read_raw(p), before);
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(SafetensorsFile::open(p)->get("w").f32()[2], 3.0f);
}

TEST(Atomic, Xxh64MatchesXxhsumReference) {
  // Reference digests printed by `xxhsum -H1` (xxHash 0.8.1 command-line tool).
  EXPECT_EQ(xxh64_bytes("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(xxh64_bytes("abc", 3), 0x44bc2cf5ad770999ull);
  TempDir tmp;
  const std::string p = tmp / "pattern.bin";
  // Larger than the 4 MiB read block and not a multiple of it, so the streaming path is used.
  const std::string data = pattern_bytes(10 * 1024 * 1024 + 12345);
  write_raw(p, data);
  EXPECT_EQ(xxh64_file(p), 0x999d8ec842edb06bull);
  write_raw(tmp / "empty", "");
  EXPECT_EQ(xxh64_file(tmp / "empty"), 0xef46db3751d8e999ull);
  EXPECT_EQ(hex64(0x00ab), "00000000000000ab");
  expect_error([&] { xxh64_file(tmp / "absent"); }, {tmp / "absent"});
}

TEST(Atomic, DirCommitIsAllOrNothing) {
  TempDir tmp;
  const std::string final_dir = tmp / "step-100";
  {
    AtomicDirCommit c(final_dir);
    EXPECT_EQ(c.staging(), tmp / (".tmp-step-100-" + std::to_string(getpid())));
    write_file_atomic(c.staging() + "/a.bin", "aaaa");
    std::filesystem::create_directory(c.staging() + "/rank1");
    write_raw(c.staging() + "/rank1/b.bin", "bb");
    EXPECT_FALSE(std::filesystem::exists(final_dir));  // invisible until committed
    c.commit();
  }
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"step-100"}));
  EXPECT_EQ(read_raw(final_dir + "/rank1/b.bin"), "bb");

  // Abandoned (an exception before commit): nothing appears, the staging directory is removed.
  {
    AtomicDirCommit c(tmp / "step-200");
    write_raw(c.staging() + "/x", "x");
  }
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"step-100"}));

  // An existing directory is never silently merged into or overwritten.
  {
    AtomicDirCommit c(final_dir);
    write_raw(c.staging() + "/new.bin", "new");
    expect_error([&] { c.commit(); }, {final_dir, "already exists"});
  }
  EXPECT_EQ(list_dir(final_dir), (std::vector<std::string>{"a.bin", "rank1"}));
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"step-100"}));

  // Replace swaps the whole directory and deletes the old one.
  {
    AtomicDirCommit c(final_dir + "/");  // a trailing slash names the same directory
    write_raw(c.staging() + "/new.bin", "new");
    c.commit(AtomicDirCommit::IfExists::Replace);
  }
  EXPECT_EQ(list_dir(final_dir), (std::vector<std::string>{"new.bin"}));
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"step-100"}));
}

TEST(Atomic, DirCommitSharedTagAndFailures) {
  TempDir tmp;
  // Writers that agree on a tag (ranks of one job) fill the same staging directory.
  AtomicDirCommit r0(tmp / "ck", "job7"), r1(tmp / "ck", "job7");
  EXPECT_EQ(r0.staging(), r1.staging());
  write_raw(r0.staging() + "/rank0.bin", "0");
  write_raw(r1.staging() + "/rank1.bin", "1");
  r0.commit();
  EXPECT_EQ(list_dir(tmp / "ck"), (std::vector<std::string>{"rank0.bin", "rank1.bin"}));

  write_raw(tmp / "file", "x");
  expect_error([&] { AtomicDirCommit c(tmp / "file/sub"); }, {tmp / "file"});
  expect_error([&] { AtomicDirCommit c("/proc/zaya-io-test-dir"); }, {"/proc/zaya-io-test-dir"});
}
