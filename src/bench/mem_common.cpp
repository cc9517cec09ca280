// The device-free half of `zaya bench mem` (see mem_bench.h): test names, byte accounting and the
// report writers.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "bench/mem_bench.h"
#include "core/error.h"
#include "core/plot.h"

namespace zaya::bench {

const std::vector<std::string>& mem_test_names() {
  static const std::vector<std::string> names = {"read",       "write",        "copy",
                                                 "triad",      "memcpy_d2d",   "h2d_pinned",
                                                 "d2h_pinned", "h2d_pageable", "d2h_pageable"};
  return names;
}

std::vector<std::string> parse_mem_tests(const std::string& list) {
  std::vector<std::string> out;
  for (const auto& t : split_list(list)) {
    if (t == "all") {
      for (const auto& n : mem_test_names())
        if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
      continue;
    }
    const auto& names = mem_test_names();
    ZAYA_CHECK(std::find(names.begin(), names.end(), t) != names.end(),
               "--tests: unknown test '{}' (expected read, write, copy, triad, memcpy_d2d, "
               "h2d_pinned, d2h_pinned, h2d_pageable, d2h_pageable or all)",
               t);
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  ZAYA_CHECK(!out.empty(), "--tests: no test given");
  return out;
}

uint64_t mem_bytes_moved(const std::string& test, uint64_t bytes) {
  if (test == "copy" || test == "memcpy_d2d") return 2 * bytes;
  if (test == "triad") return 3 * bytes;
  return bytes;  // read, write and the host<->device copies move each byte once
}

double mem_best_gbs(const std::vector<MemResult>& rs, const std::string& test, uint64_t min_bytes) {
  double best = 0;
  for (const auto& r : rs)
    if (r.test == test && r.bytes >= min_bytes) best = std::max(best, r.gbs);
  return best;
}

std::string mem_table_header() {
  return fmt::format("{:<13} {:>10} {:>12} {:>10} {:>9} {:>6} {:>6}", "#test", "size", "moved(B)",
                     "time(us)", "GB/s", "%peak", "wrong");
}

std::string mem_table_row(const MemResult& r) {
  return fmt::format("{:<13} {:>10} {:>12} {:>10.2f} {:>9.1f} {:>6.1f} {:>6}", r.test,
                     format_size(r.bytes), r.moved, r.time_us, r.gbs, 100 * r.fraction,
                     r.wrong < 0 ? std::string("N/A") : std::to_string(r.wrong));
}

std::string mem_results_json(const std::vector<MemResult>& rs, const DeviceInfo& dev,
                             double peak_gbs) {
  nlohmann::json j;
  j["schema"] = "zaya.bench.mem/1";
  j["device"] = dev.name;
  j["peak_hbm_gbs"] = peak_gbs;
  j["bandwidth_unit"] = "GB/s (1e9 bytes/s); bytes read + bytes written";
  auto& res = j["results"] = nlohmann::json::array();
  for (const auto& r : rs)
    res.push_back({{"name", r.test},
                   {"size", r.bytes},
                   {"moved", r.moved},
                   {"time_us", r.time_us},
                   {"gbs", r.gbs},
                   {"fraction", r.fraction},
                   {"wrong", r.wrong}});
  return j.dump(1) + "\n";
}

std::string mem_results_csv(const std::vector<MemResult>& rs) {
  std::string o = "name,size,moved,time_us,gbs,fraction,wrong\n";
  for (const auto& r : rs)
    o += fmt::format("{},{},{},{:.3f},{:.3f},{:.4f},{}\n", r.test, r.bytes, r.moved, r.time_us,
                     r.gbs, r.fraction, r.wrong);
  return o;
}

std::string mem_results_svg(const std::vector<MemResult>& rs, const std::string& device) {
  PlotSpec p;
  p.title = fmt::format("bench mem: bandwidth ({})", device);
  p.xlabel = "buffer size (bytes)";
  p.ylabel = "GB/s (read + written)";
  p.logx = true;
  p.xbytes = true;
  for (const auto& r : rs) {
    auto it = std::find_if(p.series.begin(), p.series.end(),
                           [&](const PlotSeries& s) { return s.label == r.test; });
    if (it == p.series.end()) {
      p.series.push_back({r.test, {}, {}});
      it = p.series.end() - 1;
    }
    it->x.push_back(double(r.bytes));
    it->y.push_back(r.gbs);
  }
  return render_svg(p);
}

}  // namespace zaya::bench
