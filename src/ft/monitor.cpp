#include "ft/monitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dist/ft_protocol.h"

namespace zaya::ft {
namespace {

using nlohmann::json;

// Field readers that never throw: a rank's message is input, and a malformed field is ignored.
int64_t get_int(const json& m, const char* k, int64_t dflt) {
  auto it = m.find(k);
  if (it == m.end() || !it->is_number()) return dflt;
  const double d = it->get<double>();
  return std::isfinite(d) && std::abs(d) < 9e15 ? int64_t(d) : dflt;
}
double get_num(const json& m, const char* k, double dflt) {
  auto it = m.find(k);
  if (it == m.end() || !it->is_number()) return dflt;
  const double d = it->get<double>();
  return std::isfinite(d) ? d : dflt;
}
std::string get_str(const json& m, const char* k, const std::string& dflt = "") {
  auto it = m.find(k);
  return it != m.end() && it->is_string() ? it->get<std::string>() : dflt;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool slow_section(const std::string& s) {
  return s == "checkpoint" || s == "eval" || s == "shutdown";
}

const char* cause_of_code(int code) {
  switch (code) {
    case kExitBadConfig: return kCauseBadConfig;
    case kExitNumerics: return kCauseNumerics;
    case kExitWatchdog: return kCauseCollective;
    default: return kCauseExit;
  }
}

}  // namespace

void StepTimes::add(double s) {
  if (!(s > 0) || !std::isfinite(s)) return;
  recent_.push_back(s);
  if (recent_.size() > 256) recent_.pop_front();
}

double StepTimes::median() const {
  return median_of({recent_.begin(), recent_.end()});
}

AttemptMonitor::AttemptMonitor(MonitorSettings s, double launch_time, StepTimes* step_times)
    : s_(s), launch_time_(launch_time), step_times_(step_times) {}

double AttemptMonitor::step_timeout() const {
  return std::max(s_.hang_min, s_.hang_factor * step_times_->median());
}

double AttemptMonitor::timeout_for(const std::string& section) const {
  if (section == "startup") return s_.startup_timeout;
  if (slow_section(section)) return s_.ckpt_timeout;
  return step_timeout();
}

void AttemptMonitor::note_fault(int rank, double now) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) it->second.fault_at = now;
}

std::optional<int> AttemptMonitor::rank_of(int conn) const {
  auto it = conn_rank_.find(conn);
  if (it == conn_rank_.end()) return std::nullopt;
  return it->second;
}

Finding AttemptMonitor::base(const RankView& r, const char* cause) const {
  Finding f;
  f.cause = cause;
  f.rank = r.rank;
  f.host = r.host;
  f.step = r.step;
  f.section = r.section;
  return f;
}

void AttemptMonitor::progress(RankView& r, double now) {
  r.last_progress = now;
}

std::vector<Finding> AttemptMonitor::on_message(int conn, const json& m, double now) {
  std::vector<Finding> out;
  if (!m.is_object()) return out;
  const std::string type = get_str(m, "type");
  const int64_t rank = get_int(m, "rank", -1);
  if (rank < 0 || rank > (1 << 24)) return out;
  conn_rank_[conn] = int(rank);
  RankView& r = ranks_[int(rank)];
  const bool first = r.rank < 0;
  r.rank = int(rank);
  if (auto h = get_str(m, "host"); !h.empty()) r.host = h;
  r.pid = get_int(m, "pid", r.pid);
  r.world = int(get_int(m, "world", r.world));
  world_ = std::max(world_, r.world);
  if (first) {
    r.last_progress = r.section_since = now;
    r.hello_at = now;
  }
  const int64_t step = get_int(m, "step", -1);

  if (type == "hello") {
    r.hello_at = now;
    r.kind = get_str(m, "kind", "train");
    r.start_step = r.step = r.done = std::max<int64_t>(0, step);
    r.section = "startup";
    r.section_since = now;
    progress(r, now);
  } else if (type == "beat") {
    const std::string section = get_str(m, "section", r.section);
    const bool new_step = step > r.step;
    // The rank's own clock of its section ("section_s": seconds since it last changed) dates a
    // change that beat throttling hid (a short optimizer section between two collectives).
    const double section_s = get_num(m, "section_s", -1);
    const double changed_at = section_s >= 0 ? std::min(now, now - section_s) : now;
    if (new_step || section != r.section) {
      if (r.section == "checkpoint" && !r.computing) r.restore_s += now - r.section_since;
      // Checkpoints and evaluation are not the step's compute (rank 0 may do more of them).
      if (r.computing && (r.section == "checkpoint" || r.section == "eval"))
        r.aside[r.step] += std::max(0.0, changed_at - r.section_since);
      if (section != "startup" && section != "checkpoint" && !r.computing) {
        r.computing = true;
        if (first_compute_at_ < 0) first_compute_at_ = now;
      }
      r.section_since = changed_at;
      progress(r, now);
    }
    if (section_s >= 0 && changed_at > r.last_progress + 1e-3) progress(r, changed_at);
    if (new_step) {
      r.step = step;
      r.step_begin[step] = now;
      r.done = std::max(r.done, step - 1);
    }
    r.section = section;
    if (section == "collective") {
      // Compute time: from the step's first beat to entering its first collective (by the
      // rank's own section clock when it sends one).
      r.saw_collective = true;
      auto b = r.step_begin.find(r.step);
      if (b != r.step_begin.end() && !r.busy.count(r.step))
        r.busy[r.step] = std::max(0.0, changed_at - b->second - r.aside[r.step]);
    }
    const double step_s = get_num(m, "step_s", -1);
    if (step_s > 0 && r.step >= 2) {
      step_times_->add(step_s);
      step_s_[r.step - 1] = std::max(step_s_[r.step - 1], step_s);
      // No beat inside a collective during that step: it was shorter than the beat throttle,
      // so this rank was the one the others waited for; its compute time is the whole step.
      r.busy.emplace(r.step - 1, std::max(0.0, step_s - r.aside[r.step - 1]));
    }
    const double busy_s = get_num(m, kBeatBusyField, -1);
    if (busy_s > 0 && r.step >= 2) r.busy[r.step - 1] = busy_s;
    if (r.done > r.start_step && first_step_done_at_ < 0) first_step_done_at_ = now;
    if (auto f = check_stragglers()) out.push_back(*f);
  } else if (type == "event") {
    const std::string ev = get_str(m, "event");
    if (step >= 0 && ev != "health") r.step = std::max(r.step, step);
    if (ev == "nonfinite" || ev == "loss_spike") {
      Finding f = base(r, kCauseNumerics);
      if (step >= 0) f.step = step;
      f.message = ev + (m.contains("message") ? ": " + get_str(m, "message") : "");
      f.detect_s = r.fault_at >= 0 ? now - r.fault_at : 0;
      out.push_back(f);
    } else if (ev == "watchdog_abort") {
      Finding f = base(r, kCauseCollective);
      f.message = "the rank's watchdog aborted a collective" +
                  (m.contains("message") ? ": " + get_str(m, "message") : "");
      f.detect_s = r.fault_at >= 0 ? now - r.fault_at : now - r.last_progress;
      out.push_back(f);
    } else if (ev == "checkpoint_saved") {
      // The step saved ("checkpoint_step"; "step" is the one in progress at the commit).
      const int64_t saved = get_int(m, "checkpoint_step", step);
      if (saved >= 0) {
        newest_checkpoint_ = std::max(newest_checkpoint_, saved);
        r.done = std::max(r.done, saved);
      }
      progress(r, now);
    } else if (ev == "fault_injected") {
      r.fault_at = now;
    } else if (ev == "error") {
      r.last_error = get_str(m, "message");
    } else if (ev == "health") {
      r.health = m;
    }
  } else if (type == "bye") {
    r.bye = true;
    r.bye_status = get_str(m, "status");
    r.bye_code = int(get_int(m, "code", -1));
    if (r.bye_status == "completed") {
      if (step >= 0) r.done = std::max(r.done, step);
      if (r.done > r.start_step && first_step_done_at_ < 0) first_step_done_at_ = now;
    } else {
      Finding f = base(r, cause_of_code(r.bye_code));
      f.code = r.bye_code;
      f.message = fmt::format("the rank is exiting with code {}{}", r.bye_code,
                              r.last_error.empty() ? "" : ": " + r.last_error);
      f.detect_s = r.fault_at >= 0 ? now - r.fault_at : 0;
      out.push_back(f);
    }
  }
  return out;
}

std::optional<Finding> AttemptMonitor::on_close(int conn, double now) {
  auto c = conn_rank_.find(conn);
  if (c == conn_rank_.end()) return std::nullopt;
  RankView& r = ranks_[c->second];
  conn_rank_.erase(c);
  if (r.closed) return std::nullopt;
  r.closed = true;
  if (r.bye) return std::nullopt;
  Finding f = base(r, kCauseDied);
  f.message = "its connection closed without a bye" +
              (r.last_error.empty() ? std::string() : " (last error: " + r.last_error + ")");
  f.detect_s = r.fault_at >= 0 ? now - r.fault_at : 0;
  return f;
}

std::optional<Finding> AttemptMonitor::check_hang(double now) const {
  std::vector<const RankView*> live;
  for (const auto& [k, r] : ranks_)
    if (!r.bye && !r.closed) live.push_back(&r);
  const RankView* hung = nullptr;
  for (const RankView* r : live)
    if (now - r->last_progress > timeout_for(r->section)) {
      hung = r;
      break;
    }
  if (!hung) {
    // Ranks that never said hello.
    if (now - launch_time_ <= s_.startup_timeout) return std::nullopt;
    int missing = -1;
    if (ranks_.empty()) {
      Finding f;
      f.cause = kCauseHang;
      f.section = "startup";
      f.step = 0;
      f.detect_s = now - launch_time_;
      f.message = fmt::format("no rank connected within the startup timeout ({:.0f} s)",
                              s_.startup_timeout);
      return f;
    }
    for (int i = 0; i < world_ && missing < 0; i++)
      if (!ranks_.count(i)) missing = i;
    if (missing < 0) return std::nullopt;
    Finding f;
    f.cause = kCauseHang;
    f.rank = missing;
    f.section = "startup";
    f.step = 0;
    f.detect_s = now - launch_time_;
    f.message = fmt::format("rank {} never connected within the startup timeout ({:.0f} s)",
                            missing, s_.startup_timeout);
    return f;
  }
  // Name the lagging rank. Ranks wait for the others in a collective, so the suspects are the
  // ranks at the lowest step and, among them, those outside a collective when some are inside
  // one. With three or more suspects, the only one whose section differs from all the others'
  // (which agree); else the suspect whose last progress is oldest.
  std::vector<const RankView*> suspects;
  int64_t low = live.front()->step;
  for (const RankView* r : live) low = std::min(low, r->step);
  for (const RankView* r : live)
    if (r->step == low) suspects.push_back(r);
  std::vector<const RankView*> outside;
  for (const RankView* r : suspects)
    if (r->section != "collective") outside.push_back(r);
  if (!outside.empty() && outside.size() < suspects.size()) suspects = outside;
  const RankView* lag = suspects.front();
  for (const RankView* r : suspects)
    if (r->last_progress < lag->last_progress) lag = r;
  if (suspects.size() >= 3) {
    std::map<std::string, int> where;
    for (const RankView* r : suspects) where[r->section]++;
    if (where.size() == 2) {
      for (const RankView* r : suspects)
        if (where[r->section] == 1) lag = r;
    }
  }
  Finding f = base(*lag, kCauseHang);
  const double idle = now - lag->last_progress;
  f.detect_s = lag->fault_at >= lag->hello_at && lag->fault_at >= 0 ? now - lag->fault_at : idle;
  std::string others;
  for (const RankView* r : live)
    if (r != lag)
      others += fmt::format("{}rank {}: step {} {}", others.empty() ? "" : ", ", r->rank, r->step,
                            r->section);
  f.message = fmt::format("no progress for {:.1f} s (timeout {:.1f} s in section {}){}", idle,
                          timeout_for(lag->section), lag->section,
                          others.empty() ? "" : "; others: " + others);
  return f;
}

std::optional<Finding> AttemptMonitor::check_stragglers() {
  const int W = s_.straggler_window;
  if (W <= 0 || world_ < 2) return std::nullopt;
  // Every rank of the job, including those that finished or went: a window is judged once each
  // rank still running is past it, with the step times the others left.
  std::vector<const RankView*> live;
  for (const auto& [k, r] : ranks_)
    if (r.kind == "train") live.push_back(&r);
  if (int(live.size()) < world_) return std::nullopt;
  if (window_end_ < 0) window_end_ = start_step() + W;
  std::optional<Finding> found;
  for (;;) {
    for (const RankView* r : live)
      if (!r->closed && !r->bye && r->done < window_end_) return found;
    bool any_running = false;
    for (const RankView* r : live) any_running = any_running || (!r->closed && !r->bye);
    if (!any_running) return found;
    std::map<int, double> val;
    for (const RankView* r : live) {
      std::vector<double> v;
      for (auto it = r->busy.upper_bound(window_end_ - W);
           it != r->busy.end() && it->first <= window_end_; ++it)
        v.push_back(it->second);
      if (2 * int(v.size()) >= W) val[r->rank] = median_of(v);
    }
    if (val.size() >= 2) {
      for (const auto& [rank, v] : val) {
        std::vector<double> others;
        for (const auto& [o, w] : val)
          if (o != rank) others.push_back(w);
        const double m = median_of(others);
        // Ranks that wait in a collective from their step's first beat on measure 0 s: the
        // comparison needs a margin in seconds too (1 ms), not only a fraction of the median.
        const bool slow = v >= (1 + s_.straggler_threshold) * m && v > m + 1e-3;
        int& n = slow_windows_[rank];
        n = slow ? n + 1 : 0;
        if (slow && n >= s_.straggler_windows && !reported_[rank] && !found) {
          reported_[rank] = true;
          const RankView& r = ranks_.at(rank);
          Finding f = base(r, "straggler");
          f.step = window_end_;
          f.detect_s = 0;
          f.message = fmt::format(
              "{} than the others' median ({:.3f} s vs {:.3f} s of compute per step) in {} "
              "consecutive windows of {} steps",
              m > 0 ? fmt::format("{:.0f}% slower", 100 * (v / m - 1)) : std::string("slower"), v,
              m, n, W);
          found = f;
        }
      }
    }
    window_end_ += W;
  }
}

int64_t AttemptMonitor::max_done() const {
  int64_t d = 0;
  for (const auto& [k, r] : ranks_) d = std::max(d, r.done);
  return d;
}

int64_t AttemptMonitor::max_step() const {
  int64_t d = 0;
  for (const auto& [k, r] : ranks_) d = std::max(d, r.step);
  return d;
}

int64_t AttemptMonitor::start_step() const {
  int64_t s = -1;
  for (const auto& [k, r] : ranks_) s = s < 0 ? r.start_step : std::min(s, r.start_step);
  return std::max<int64_t>(0, s);
}

double AttemptMonitor::restore_s() const {
  double s = 0;
  for (const auto& [k, r] : ranks_) s = std::max(s, r.restore_s);
  return s;
}

}  // namespace zaya::ft
