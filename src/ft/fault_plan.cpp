#include "ft/fault_plan.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace zaya::ft {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

int64_t parse_int(const std::string& v, const std::string& what) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ZAYA_CHECK(used == v.size() && used > 0 && n >= 0, "{}: '{}' is not a non-negative integer", what,
             v);
  return n;
}

// splitmix64: a small stateless mix so that attempt k's draw does not depend on earlier attempts.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::string PlannedFault::spec() const {
  return kind + "@rank=" + std::to_string(rank) + ",step=" + (relative ? "+" : "") +
         std::to_string(step) + rest;
}

std::vector<PlannedFault> parse_fault_spec(const std::string& spec, const std::string& where) {
  std::vector<PlannedFault> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ';')) {
    item = trim(item);
    if (item.empty() || item == "-") continue;
    const size_t at = item.find('@');
    ZAYA_CHECK(at != std::string::npos && at > 0,
               "{}: fault '{}': expected KIND@rank=R,step=S[,...]", where, item);
    PlannedFault f;
    f.kind = item.substr(0, at);
    bool rank = false, step = false;
    std::stringstream fs(item.substr(at + 1));
    std::string kv;
    while (std::getline(fs, kv, ',')) {
      const size_t eq = kv.find('=');
      ZAYA_CHECK(eq != std::string::npos, "{}: fault '{}': '{}' is not KEY=VALUE", where, item, kv);
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      const std::string what = where + ": fault '" + item + "': " + k;
      if (k == "rank") {
        f.rank = int(parse_int(v, what));
        rank = true;
      } else if (k == "step") {
        f.relative = !v.empty() && v[0] == '+';
        f.step = parse_int(f.relative ? v.substr(1) : v, what);
        step = true;
      } else {
        f.rest += "," + kv;
      }
    }
    ZAYA_CHECK(rank && step, "{}: fault '{}': rank= and step= are required", where, item);
    out.push_back(f);
  }
  return out;
}

std::string join_specs(const std::vector<PlannedFault>& faults) {
  std::string s;
  for (const auto& f : faults)
    if (!f.by_supervisor()) s += (s.empty() ? "" : ";") + f.spec();
  return s;
}

RandomFaults parse_random_faults(const std::string& text) {
  RandomFaults r;
  bool seed = false, count = false;
  std::string key;
  std::stringstream ss(text);
  std::string item;
  const std::string where = "--random-faults '" + text + "'";
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    const size_t eq = item.find('=');
    std::string v = item;
    if (eq != std::string::npos) {
      key = item.substr(0, eq);
      v = item.substr(eq + 1);
    } else {
      // A bare item continues the previous key's list (kinds=kill,hang).
      ZAYA_CHECK(key == "kinds", "{}: '{}' is not KEY=VALUE", where, item);
    }
    if (key == "seed") {
      r.seed = uint64_t(parse_int(v, where + ": seed"));
      seed = true;
    } else if (key == "count") {
      r.count = int(parse_int(v, where + ": count"));
      count = true;
    } else if (key == "kinds") {
      ZAYA_CHECK(!v.empty(), "{}: an empty kind", where);
      r.kinds.push_back(v);
    } else if (key == "steps") {
      const size_t dash = v.find('-');
      ZAYA_CHECK(dash != std::string::npos, "{}: steps '{}': expected LO-HI", where, v);
      r.first_step = parse_int(v.substr(0, dash), where + ": steps");
      r.last_step = parse_int(v.substr(dash + 1), where + ": steps");
      ZAYA_CHECK(r.first_step >= 1 && r.last_step >= r.first_step,
                 "{}: steps '{}': expected 1 <= LO <= HI", where, v);
    } else if (key == "ranks") {
      r.ranks = int(parse_int(v, where + ": ranks"));
    } else {
      fail("{}: unknown key '{}' (expected seed, count, kinds, steps, ranks)", where, key);
    }
  }
  ZAYA_CHECK(seed && count && !r.kinds.empty(), "{}: seed=, count= and kinds= are required", where);
  return r;
}

FaultPlan FaultPlan::parse(const std::string& plan) {
  FaultPlan p;
  std::error_code ec;
  if (std::filesystem::is_regular_file(plan, ec)) {
    std::ifstream in(plan);
    ZAYA_CHECK(in.good(), "--faults {}: cannot read the file", plan);
    std::string line;
    int attempt = 0, n = 0;
    while (std::getline(in, line)) {
      n++;
      line = trim(line);
      if (line.empty() || line[0] == '#') continue;
      const size_t colon = line.find(':');
      const size_t at = line.find('@');
      if (colon != std::string::npos && (at == std::string::npos || colon < at)) {
        attempt = int(parse_int(trim(line.substr(0, colon)), plan + ":" + std::to_string(n)));
        line = trim(line.substr(colon + 1));
      }
      p.fixed_[attempt] = parse_fault_spec(line, plan + ":" + std::to_string(n));
      attempt++;
    }
    return p;
  }
  std::stringstream ss(plan);
  std::string item;
  while (ss >> item) {
    const size_t colon = item.find(':');
    ZAYA_CHECK(colon != std::string::npos && colon > 0,
               "--faults: '{}' is neither a file nor ATTEMPT:SPEC", item);
    const int a = int(parse_int(item.substr(0, colon), "--faults: '" + item + "': attempt"));
    auto faults = parse_fault_spec(item.substr(colon + 1), "--faults");
    p.fixed_[a].insert(p.fixed_[a].end(), faults.begin(), faults.end());
  }
  return p;
}

FaultPlan FaultPlan::random(RandomFaults r) {
  FaultPlan p;
  p.random_ = std::move(r);
  return p;
}

std::vector<PlannedFault> FaultPlan::for_attempt(int attempt, int world, int64_t newest_checkpoint,
                                                 int64_t last_step) const {
  auto it = fixed_.find(attempt);
  if (it != fixed_.end() || !random_) {
    if (it == fixed_.end()) return {};
    std::vector<PlannedFault> out = it->second;
    for (auto& f : out)
      if (f.relative) {
        f.step += newest_checkpoint;
        f.relative = false;
      }
    return out;
  }
  const RandomFaults& r = *random_;
  if (attempt >= r.count) return {};
  const int64_t last = r.last_step ? r.last_step : last_step;
  const int64_t first = std::max(r.first_step, newest_checkpoint + 1);
  if (last < first) return {};
  const int ranks = r.ranks ? r.ranks : std::max(1, world);
  const uint64_t h = mix(r.seed ^ mix(uint64_t(attempt) + 1));
  PlannedFault f;
  const std::string& kind = r.kinds[h % r.kinds.size()];
  const size_t colon = kind.find(':');
  f.kind = kind.substr(0, colon);
  if (colon != std::string::npos) f.rest = ",section=" + kind.substr(colon + 1);
  f.rank = int(mix(h + 1) % uint64_t(ranks));
  f.step = first + int64_t(mix(h + 2) % uint64_t(last - first + 1));
  return {f};
}

}  // namespace zaya::ft
