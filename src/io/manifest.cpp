// Checkpoint manifest writer and verifier (see manifest.h; format in docs/CHECKPOINT_FORMAT.md).
#include "io/manifest.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/json.h"
#include "io/atomic.h"

namespace zaya {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormatTag = "zaya-checkpoint-manifest";

// Leftovers of interrupted atomic writes (`name.tmp.<pid>`, `.tmp-<name>-<tag>/`) are never part
// of a checkpoint.
bool is_temp_leftover(const std::string& name) {
  if (name.rfind(".tmp-", 0) == 0) return true;
  auto p = name.rfind(".tmp.");
  if (p == std::string::npos || p + 5 == name.size()) return false;
  return std::all_of(name.begin() + long(p) + 5, name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

// Regular files under dir (relative '/'-paths, sorted), excluding the manifest and temp files.
std::vector<std::string> list_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) fail("cannot list checkpoint directory {}: {}", dir, ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail("cannot list checkpoint directory {}: {}", dir, ec.message());
    const fs::path rel = it->path().lexically_relative(dir);
    const std::string name = it->path().filename().string();
    if (is_temp_leftover(name)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (rel == kManifestName) continue;
    const fs::file_status st = it->status(ec);  // follows symlinks
    if (fs::is_directory(st)) {
      if (it->is_symlink(ec))
        fail("{}: {} is a link to a directory; a checkpoint must hold its files itself", dir,
             rel.generic_string());
      continue;
    }
    if (!fs::is_regular_file(st))
      fail("{}: {} is not a regular file (or a link to one); cannot include it in a manifest", dir,
           rel.generic_string());
    out.push_back(rel.generic_string());
  }
  if (ec) fail("cannot list checkpoint directory {}: {}", dir, ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

bool parse_hex64(const std::string& s, uint64_t* v) {
  if (s.size() != 16) return false;
  uint64_t r = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    r = r << 4 | uint64_t(d);
  }
  *v = r;
  return true;
}

}  // namespace

namespace {

// manifest.json for `m`, atomically.
void write_manifest_file(const std::string& dir, const Manifest& m) {
  json files = json::array();
  for (const ManifestEntry& e : m.files)
    files.push_back({{"path", e.path}, {"size", e.size}, {"xxh64", hex64(e.xxh64)}});
  nlohmann::ordered_json doc;
  doc["format"] = kFormatTag;
  doc["version"] = kManifestVersion;
  doc["hash"] = "xxh64";
  doc["files"] = files;
  doc["extra"] = m.extra;
  write_file_atomic((fs::path(dir) / kManifestName).string(), doc.dump(2) + "\n");
}

void check_extra(const std::string& dir, const json& extra) {
  ZAYA_CHECK(extra.is_object(), "writing the manifest of {}: extra must be a JSON object, found {}",
             dir, extra.type_name());
  std::error_code ec;
  ZAYA_CHECK(fs::is_directory(dir, ec), "writing the manifest of {}: not a directory", dir);
}

}  // namespace

Manifest write_manifest(const std::string& dir, const json& extra) {
  check_extra(dir, extra);
  Manifest m;
  m.extra = extra;
  for (const std::string& rel : list_files(dir)) {
    const std::string full = (fs::path(dir) / rel).string();
    struct stat st;
    if (::stat(full.c_str(), &st) != 0) fail("cannot stat {}: {}", full, std::strerror(errno));
    ManifestEntry e{rel, uint64_t(st.st_size), xxh64_file(full)};
    // The size recorded must be the size hashed; a file that grows meanwhile is a caller bug.
    if (::stat(full.c_str(), &st) != 0 || uint64_t(st.st_size) != e.size)
      fail(
          "{} changed while its checksum was computed; write the manifest after all files are "
          "complete",
          full);
    m.files.push_back(std::move(e));
  }
  write_manifest_file(dir, m);
  return m;
}

Manifest write_manifest_entries(const std::string& dir, std::vector<ManifestEntry> files,
                                const json& extra) {
  check_extra(dir, extra);
  std::sort(files.begin(), files.end(),
            [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; });
  for (size_t i = 0; i < files.size(); i++) {
    const ManifestEntry& e = files[i];
    ZAYA_CHECK(!e.path.empty() && e.path != kManifestName && e.path[0] != '/' &&
                   e.path.find("..") == std::string::npos,
               "writing the manifest of {}: '{}' is not a relative path of a checkpoint file", dir,
               e.path);
    ZAYA_CHECK(i == 0 || files[i - 1].path != e.path,
               "writing the manifest of {}: '{}' is listed twice", dir, e.path);
    const std::string full = (fs::path(dir) / e.path).string();
    struct stat st;
    if (::stat(full.c_str(), &st) != 0)
      fail("writing the manifest of {}: {} is missing: {}", dir, e.path, std::strerror(errno));
    ZAYA_CHECK(uint64_t(st.st_size) == e.size,
               "writing the manifest of {}: {} has {} bytes, but its writer recorded {}", dir,
               e.path, uint64_t(st.st_size), e.size);
  }
  Manifest m;
  m.files = std::move(files);
  m.extra = extra;
  write_manifest_file(dir, m);
  return m;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  const json doc = parse_json(read_file(path), path);
  if (!doc.is_object()) fail("{}: expected a JSON object, found {}", path, doc.type_name());
  if (!doc.contains("format") || doc["format"] != kFormatTag)
    fail("{}: format: expected \"{}\", found {}", path, kFormatTag,
         doc.contains("format") ? json_show(doc["format"]) : "nothing");
  Manifest m;
  if (!doc.contains("version") || !doc["version"].is_number_unsigned())
    fail("{}: version: expected a positive integer", path);
  const uint64_t version = doc["version"].get<uint64_t>();
  if (version != uint64_t(kManifestVersion))
    fail("{}: version {} is not one this zaya reads (it reads version {})", path, version,
         kManifestVersion);
  m.version = int(version);
  if (!doc.contains("hash") || doc["hash"] != "xxh64")
    fail("{}: hash: expected \"xxh64\", found {}", path,
         doc.contains("hash") ? json_show(doc["hash"]) : "nothing");
  if (!doc.contains("files") || !doc["files"].is_array())
    fail("{}: files: expected a list of {{path, size, xxh64}}", path);
  std::set<std::string> seen;
  for (size_t i = 0; i < doc["files"].size(); i++) {
    const json& f = doc["files"][i];
    if (!f.is_object()) fail("{}: files[{}]: expected an object", path, i);
    ManifestEntry e;
    if (!f.contains("path") || !f["path"].is_string())
      fail("{}: files[{}].path: expected a string", path, i);
    e.path = f["path"].get<std::string>();
    fs::path rel(e.path);
    bool bad = e.path.empty() || rel.is_absolute() || e.path == kManifestName;
    for (const auto& part : rel) bad |= part == ".." || part == ".";
    if (bad)
      fail("{}: files[{}].path \"{}\": expected a relative path inside the checkpoint", path, i,
           e.path);
    if (!seen.insert(e.path).second) fail("{}: files: \"{}\" is listed twice", path, e.path);
    if (!f.contains("size") || !f["size"].is_number_unsigned())
      fail("{}: {}: size: expected a non-negative integer", path, e.path);
    e.size = f["size"].get<uint64_t>();
    if (!f.contains("xxh64") || !f["xxh64"].is_string() ||
        !parse_hex64(f["xxh64"].get<std::string>(), &e.xxh64))
      fail("{}: {}: xxh64: expected 16 lowercase hex digits", path, e.path);
    m.files.push_back(std::move(e));
  }
  if (doc.contains("extra")) {
    if (!doc["extra"].is_object()) fail("{}: extra: expected an object", path);
    m.extra = doc["extra"];
  }
  return m;
}

ManifestCheck verify_manifest(const std::string& dir, bool check_hashes) {
  ManifestCheck r;
  auto problem = [&](std::string s) {
    if (r.problems.empty()) r.reason = s;
    r.problems.push_back(std::move(s));
  };
  try {
    r.manifest = read_manifest(dir);
  } catch (const Error& e) {
    r.ok = false;
    r.reason = std::string(kManifestName) + " missing or malformed: " + e.what();
    r.problems = {r.reason};
    r.manifest = Manifest{};
    return r;
  }
  std::set<std::string> listed;
  for (const ManifestEntry& e : r.manifest.files) {
    listed.insert(e.path);
    const std::string full = (fs::path(dir) / e.path).string();
    struct stat st;
    if (::stat(full.c_str(), &st) != 0) {
      problem(errno == ENOENT ? e.path + ": missing"
                              : fmt::format("{}: cannot stat: {}", e.path, std::strerror(errno)));
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      problem(e.path + ": not a regular file");
      continue;
    }
    if (uint64_t(st.st_size) != e.size) {
      problem(fmt::format("{}: size {} expected {}", e.path, uint64_t(st.st_size), e.size));
      continue;
    }
    if (!check_hashes) continue;
    try {
      const uint64_t h = xxh64_file(full);
      if (h != e.xxh64)
        problem(fmt::format("{}: checksum 0x{} expected 0x{}", e.path, hex64(h), hex64(e.xxh64)));
    } catch (const Error& err) {
      problem(fmt::format("{}: {}", e.path, err.what()));
    }
  }
  try {
    for (const std::string& f : list_files(dir))
      if (!listed.count(f)) r.unlisted.push_back(f);
  } catch (const Error&) {
    // Listing problems (e.g. a fifo in the directory) do not make listed files wrong.
  }
  r.ok = r.problems.empty();
  return r;
}

}  // namespace zaya
