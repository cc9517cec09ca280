// libFuzzer target: a checkpoint's manifest.json (read_manifest, and verify_manifest as
// `--resume auto` runs it, over a directory with two small files).
#include "core/error.h"
#include "fuzz_util.h"
#include "io/manifest.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string& d = zaya::fuzz::work_dir();
  const uint8_t a[] = {'a', 'b', 'c'};
  zaya::fuzz::write_input("a.bin", a, sizeof a);
  std::filesystem::create_directories(d + "/shard");
  zaya::fuzz::write_input("shard/b.bin", a, 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zaya::fuzz::write_input("manifest.json", data, size);
  const std::string& d = zaya::fuzz::work_dir();
  zaya::ManifestCheck c = zaya::verify_manifest(d);  // never throws
  (void)c;
  try {
    zaya::Manifest m = zaya::read_manifest(d);
    (void)m.extra.dump();
  } catch (const zaya::Error&) {
  }
  return 0;
}
