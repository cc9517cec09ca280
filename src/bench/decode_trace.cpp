#include "bench/decode_trace.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace zaya::bench {

TraceSummary summarize_decode_trace(std::vector<std::pair<unsigned, uint64_t>> stamps,
                                    const std::vector<std::string>& names, unsigned step_end) {
  for (const auto& [ev, ns] : stamps)
    ZAYA_CHECK(ev < names.size(), "decode trace: event id {} has no name ({} known)", ev,
               names.size());
  std::stable_sort(stamps.begin(), stamps.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<size_t> ends;
  for (size_t i = 0; i < stamps.size(); i++)
    if (stamps[i].first == step_end) ends.push_back(i);
  ZAYA_CHECK(ends.size() >= 2, "decode trace: {} step-end stamps, need two to bound a step",
             ends.size());
  TraceSummary s;
  s.steps = int64_t(ends.size()) - 1;
  s.step_us =
      double(stamps[ends.back()].second - stamps[ends.front()].second) * 1e-3 / double(s.steps);
  struct Acc {
    int64_t n = 0;
    double us = 0;
  };
  std::map<std::pair<unsigned, unsigned>, Acc> acc;
  for (size_t i = ends.front(); i < ends.back(); i++) {
    Acc& a = acc[{stamps[i].first, stamps[i + 1].first}];
    a.n++;
    a.us += double(stamps[i + 1].second - stamps[i].second) * 1e-3;
  }
  for (const auto& [key, a] : acc) {
    TraceTransition t;
    t.from = names[key.first], t.to = names[key.second];
    t.per_step = double(a.n) / double(s.steps);
    t.mean_us = a.us / double(a.n);
    t.total_us = a.us / double(s.steps);
    s.rows.push_back(t);
  }
  std::stable_sort(s.rows.begin(), s.rows.end(),
                   [](const auto& a, const auto& b) { return a.total_us > b.total_us; });
  return s;
}

}  // namespace zaya::bench
