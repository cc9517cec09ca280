// Shared by the libFuzzer targets (one per parser; docs/ROBUSTNESS.md): the inputs are written to
// a private directory (on /dev/shm when there is one), because the parsers read files, as zaya
// does. A target catches zaya::Error only: any other exception, a crash, a sanitizer report, a
// leak or an allocation over libFuzzer's -malloc_limit_mb is a finding.
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace zaya::fuzz {

// The directory this process writes its inputs to (created once, removed at exit).
inline const std::string& work_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const fs::path base =
        fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string tmpl = (base / "zaya-fuzz-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    static const std::string keep = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return tmpl;
  }();
  return dir;
}

// Writes bytes to work_dir()/name and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = work_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace zaya::fuzz
