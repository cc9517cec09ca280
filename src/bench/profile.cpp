// Hardware profile merging (see profile.h).
#include "bench/profile.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/plot.h"

namespace zaya::bench {

namespace {

bool same_key(const nlohmann::json& a, const nlohmann::json& b,
              std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    const bool ha = a.contains(k), hb = b.contains(k);
    if (ha != hb) return false;
    if (ha && a[k] != b[k]) return false;
  }
  return true;
}

void merge_array(nlohmann::json& dst, const nlohmann::json& src,
                 std::initializer_list<const char*> keys) {
  if (!dst.is_array()) dst = nlohmann::json::array();
  for (const auto& e : src) {
    bool replaced = false;
    for (auto& d : dst) {
      if (same_key(d, e, keys)) {
        d = e;
        replaced = true;
        break;
      }
    }
    if (!replaced) dst.push_back(e);
  }
}

}  // namespace

void merge_profile(nlohmann::json& profile, const nlohmann::json& update) {
  if (!profile.is_object()) profile = nlohmann::json::object();
  profile["schema"] = kHardwareSchema;
  for (auto it = update.begin(); it != update.end(); ++it) {
    const std::string& k = it.key();
    if (k == "schema") continue;
    if (k == "gemm_efficiency") {
      merge_array(profile[k], *it, {"m", "n", "k", "dtype", "groups", "method"});
    } else if (k == "collectives") {
      merge_array(profile[k], *it, {"op", "ranks", "bytes", "backend", "dtype", "group"});
    } else if (it->is_object() && profile.contains(k) && profile[k].is_object()) {
      for (auto jt = it->begin(); jt != it->end(); ++jt) profile[k][jt.key()] = *jt;
    } else {
      profile[k] = *it;
    }
  }
}

void merge_profile_file(const std::string& path, const nlohmann::json& update) {
  nlohmann::json profile = nlohmann::json::object();
  if (std::filesystem::exists(path)) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    try {
      profile = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      fail("--profile: '{}' exists but is not JSON ({})", path, e.what());
    }
    ZAYA_CHECK(profile.is_object() && profile.value("schema", "") == kHardwareSchema,
               "--profile: '{}' exists but is not a {} profile", path, kHardwareSchema);
  }
  merge_profile(profile, update);
  write_text_file_atomic(path, profile.dump(1) + "\n");
}

void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  const auto parent = std::filesystem::path(path).parent_path();
  ZAYA_CHECK(parent.empty() || std::filesystem::is_directory(parent),
             "{}: cannot write '{}': folder '{}' does not exist", flag, path, parent.string());
  ZAYA_CHECK(!std::filesystem::is_directory(path), "{}: '{}' is a folder, expected a file path",
             flag, path);
}

}  // namespace zaya::bench
