#include "ft/supervisor.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/source_dir.h"
#include "dist/ft_protocol.h"
#include "ft/fault_plan.h"
#include "ft/launch_cmd.h"
#include "ft/listener.h"
#include "ft/process.h"
#include "io/atomic.h"
#include "train/run_config.h"

namespace zaya::ft {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int s) {
  g_stop = s;
}

double mono_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json stats(std::vector<double> v) {
  json s = {{"count", v.size()}};
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s["median"] = v[v.size() / 2];
  s["mean"] = sum / double(v.size());
  s["max"] = v.back();
  s["min"] = v.front();
  return s;
}

std::string where_of(const Finding& f) {
  std::string s = f.rank >= 0 ? fmt::format("rank {}", f.rank) : "the job";
  if (!f.host.empty()) s += " on " + f.host;
  if (f.step >= 0) s += fmt::format(" at step {}", f.step);
  if (!f.section.empty()) s += " (" + f.section + ")";
  return s;
}

json finding_json(const Finding& f) {
  json j = {{"cause", f.cause},    {"rank", f.rank},       {"host", f.host},
            {"step", f.step},      {"section", f.section}, {"detect_s", f.detect_s},
            {"message", f.message}};
  if (f.code >= 0) j["code"] = f.code;
  return j;
}

// "rank 1 on h2: gemm 95.4 (limit 1000 GFLOP/s)" for each failed check of the health event's
// failed ranks ({"rank", "host", "checks"}), for the console.
std::string short_number(const json& v) {
  return v.is_number() ? fmt::format("{:.4g}", v.get<double>()) : v.dump();
}

std::string failed_checks(const json& failed) {
  std::string s;
  for (const auto& f : failed) {
    std::string what;
    if (f.contains("checks") && f["checks"].is_array())
      for (const auto& c : f["checks"]) {
        if (!c.is_object()) continue;
        bool bad = false;
        for (const char* k : {"ok", "pass"})
          if (c.contains(k) && c[k].is_boolean() && !c[k].get<bool>()) bad = true;
        if (!bad) continue;
        const json v = c.contains("measured") ? c["measured"] : c.value("value", json());
        const json l = c.contains("threshold") ? c["threshold"] : c.value("limit", json());
        what += fmt::format("{}{} {} (limit {}{})", what.empty() ? "" : ", ",
                            c.value("name", std::string("?")), short_number(v), short_number(l),
                            c.contains("unit") ? " " + c.value("unit", std::string()) : "");
      }
    s += fmt::format("{}rank {} on {}: {}", s.empty() ? "" : "; ", f.value("rank", -1),
                     f.value("host", std::string("?")),
                     what.empty() ? std::string("no report") : what);
  }
  return s;
}

// The events log: one JSON object per line, flushed as written, and a console line beside it.
class EventLog {
 public:
  EventLog(const std::string& path, double t0) : t0_(t0) {
    fs::create_directories(fs::path(path).parent_path());
    out_.open(path, std::ios::app);
    ZAYA_CHECK(out_.good(), "--events {}: cannot open it for writing", path);
  }
  void write(int attempt, const std::string& event, json fields, const std::string& console) {
    fields["t"] = wall_now();
    fields["elapsed"] = std::round((mono_now() - t0_) * 1000) / 1000;
    fields["attempt"] = attempt;
    fields["event"] = event;
    out_ << fields.dump() << "\n";
    out_.flush();
    if (!console.empty()) fmt::print(stderr, "supervise: [attempt {}] {}\n", attempt, console);
  }

 private:
  double t0_;
  std::ofstream out_;
};

struct FailureRecord {
  int attempt = 0;
  Finding f;
  double detected_at = 0;
  double recover_s = -1, restore_s = -1;
  int64_t lost_steps = 0;
};

struct AttemptRecord {
  int attempt = 0, world = 0;
  int64_t start_step = 0, done = 0, checkpoint = 0;
  double wall_s = 0;
  std::string exit;
  std::optional<std::string> cause;
};

// One run of a command under the listener: the training job or the health checks.
struct JobRun {
  std::unique_ptr<AttemptMonitor> mon;
  std::optional<Finding> failure;
  double detected_at = -1;
  int code = 0;
  std::string exit;
  bool exec_failed = false, torn_down = false;
  std::vector<Finding> stragglers;
};

class Supervisor {
 public:
  explicit Supervisor(const SupervisorOptions& o);
  int run();

 private:
  JobRun run_job(const LaunchCommand& cmd, int attempt, bool health,
                 const std::vector<PlannedFault>& faults);
  bool run_health(int attempt, int* code);
  bool exclude(const std::vector<RankView>& bad, const std::map<int, RankView>& all,
               const std::string& why, int attempt, int* code);
  int finish(int code, const std::string& result, const std::string& why, int attempt);

  SupervisorOptions o_;
  LaunchCommand cmd_;
  std::string run_dir_, ckpt_dir_;
  std::optional<RunConfig> config_;
  int64_t last_step_ = 0;
  int world_ = 0;
  double t0_ = 0;
  std::unique_ptr<Listener> listener_;
  std::string address_;
  std::unique_ptr<EventLog> log_;
  std::string report_path_;
  StepTimes step_times_;
  FaultPlan plan_;
  std::vector<AttemptRecord> attempts_;
  std::vector<FailureRecord> failures_;
  std::set<int64_t> numerics_steps_;
  std::vector<json> stragglers_, excluded_;
  std::map<int64_t, double> step_s_;
  int64_t final_step_ = 0, newest_checkpoint_ = 0;
  int injected_ = 0;
  std::string last_event_ = "none";
  int64_t best_done_ = 0, best_ckpt_ = 0;  // over the attempts so far
  void note_recovery(const AttemptMonitor& mon, int attempt);
};

// The newest failure's recovery: to the first step the next attempt completes.
void Supervisor::note_recovery(const AttemptMonitor& mon, int attempt) {
  if (mon.first_step_done_at() < 0) return;
  // Every failure since the last completed step recovers now (a relaunch that failed before its
  // first step leaves the earlier failure unrecovered too).
  for (auto it = failures_.rbegin(); it != failures_.rend(); ++it) {
    FailureRecord& f = *it;
    if (f.recover_s >= 0 || f.attempt >= attempt) break;
    f.recover_s = mon.first_step_done_at() - f.detected_at;
    f.restore_s = mon.restore_s();
    log_->write(attempt, "recovered",
                {{"recover_s", f.recover_s},
                 {"restore_s", f.restore_s},
                 {"from_attempt", f.attempt},
                 {"resumed_step", mon.start_step()}},
                fmt::format("recovered {:.2f} s after the failure of attempt {} (checkpoint "
                            "restore {:.2f} s; resumed at step {})",
                            f.recover_s, f.attempt, f.restore_s, mon.start_step()));
  }
}

Supervisor::Supervisor(const SupervisorOptions& o) : o_(o) {
  cmd_ = LaunchCommand::parse(o.command, o.zaya_exe);
  ZAYA_CHECK(o.max_restarts >= 0 && o.no_progress >= 1 && o.min_ranks >= 1,
             "supervise: --max-restarts must be >= 0, --no-progress and --min-ranks >= 1");
  ZAYA_CHECK(o.monitor.hang_min > 0 && o.monitor.hang_factor > 0 && o.monitor.ckpt_timeout > 0 &&
                 o.monitor.startup_timeout > 0 && o.grace >= 0,
             "supervise: timeouts must be positive");
  ZAYA_CHECK(o.monitor.straggler_window >= 1 && o.monitor.straggler_windows >= 1 &&
                 o.monitor.straggler_threshold > 0,
             "supervise: --straggler-window/-windows must be >= 1 and --straggler-threshold > 0");
  t0_ = mono_now();
  run_dir_ = cmd_.zaya_option("--out").value_or("runs/tiny-brown");
  // The run config, for the checkpoint directory, the step count and the batch arithmetic.
  std::string config = cmd_.zaya_option("--config").value_or("");
  if (config.empty() && fs::exists(source_dir() + "/configs/tiny.toml"))
    config = source_dir() + "/configs/tiny.toml";
  std::string config_problem;
  if (cmd_.subcommand == "train" && !config.empty()) {
    try {
      config_ = RunConfig::load(config, cmd_.config_overrides());
    } catch (const Error& e) {
      config_problem = e.what();
    }
  }
  std::string dir = config_ ? config_->checkpoint.dir : "checkpoints";
  ckpt_dir_ = fs::path(dir).is_absolute() ? dir : (fs::path(run_dir_) / dir).string();
  if (config_) last_step_ = config_->train.steps;
  if (auto s = cmd_.zaya_option("--steps")) last_step_ = std::atoll(s->c_str());
  world_ = cmd_.world().value_or(0);

  if (!o.faults.empty()) plan_ = FaultPlan::parse(o.faults);
  if (!o.random_faults.empty()) {
    plan_.add_random(parse_random_faults(o.random_faults));
    ZAYA_CHECK(!plan_.needs_last_step() || last_step_ > 0,
               "--random-faults: the run's last step is unknown (no readable --config); give "
               "steps=LO-HI");
  }
  const std::string sup_dir = (fs::path(run_dir_) / "supervisor").string();
  const std::string events = o.events.empty() ? sup_dir + "/events.jsonl" : o.events;
  report_path_ = o.report.empty() ? sup_dir + "/report.json" : o.report;
  log_ = std::make_unique<EventLog>(events, t0_);
  listener_ = std::make_unique<Listener>(o.listen);
  std::string adv = o.advertise.empty() ? default_advertise_host() : o.advertise;
  if (adv.find(':') == std::string::npos) adv += ":" + std::to_string(listener_->port());
  address_ = adv;
  log_->write(0, "start",
              {{"command", o.command},
               {"address", address_},
               {"run_dir", run_dir_},
               {"checkpoint_dir", ckpt_dir_},
               {"world", world_},
               {"hang_min", o.monitor.hang_min},
               {"hang_factor", o.monitor.hang_factor},
               {"ckpt_timeout", o.monitor.ckpt_timeout},
               {"startup_timeout", o.monitor.startup_timeout}},
              fmt::format("listening on {} (ranks connect to {}); events in {}", o.listen, address_,
                          events));
  if (!config_problem.empty())
    log_->write(0, "warning", {{"message", config_problem}},
                "cannot read the run config (the job will say why): " + config_problem);
}

JobRun Supervisor::run_job(const LaunchCommand& launch, int attempt, bool health,
                           const std::vector<PlannedFault>& faults) {
  JobRun r;
  Job::Env env = {{kEnvAddress, address_}, {kEnvAttempt, std::to_string(attempt)}};
  std::vector<std::string> unset;
  const std::string spec = health ? "" : join_specs(faults);
  if (!spec.empty())
    env.push_back({kEnvFaults, spec});
  else
    unset.push_back(kEnvFaults);
  if (o_.collective_timeout > 0)
    env.push_back({kEnvCollectiveTimeout, fmt::format("{}", o_.collective_timeout)});
  LaunchCommand cmd = launch;
  if (o_.forward_env) {
    std::vector<std::string> names;
    for (const auto& [k, v] : env) names.push_back(k);
    cmd = with_forwarded_env(cmd, names);
  }
  const double launched = mono_now();
  r.mon = std::make_unique<AttemptMonitor>(o_.monitor, launched, &step_times_);
  std::unique_ptr<Job> job;
  try {
    job = std::make_unique<Job>(cmd.argv, env, unset);
  } catch (const Error& e) {
    r.exec_failed = true;
    r.code = 127;
    r.exit = e.what();
    Finding f;
    f.cause = kCauseBadConfig;
    f.message = e.what();
    r.failure = f;
    r.detected_at = launched;
    return r;
  }
  std::vector<PlannedFault> sigkills;
  for (const auto& f : faults)
    if (f.by_supervisor()) sigkills.push_back(f);
  const std::string me = host_name();
  double last_print = launched;
  std::optional<std::pair<Finding, double>> pending_close;
  constexpr double kCloseConfirm = 3.0;  // s the launcher has to exit 0 after such a close
  const auto log_failure = [&] {
    const Finding& f = *r.failure;
    log_->write(attempt, "failure", finding_json(f),
                fmt::format("{}: {}, detected in {:.2f} s: {}", f.cause, where_of(f), f.detect_s,
                            f.message));
  };
  const auto fail_with = [&](const Finding& f, double now) {
    if (r.failure) return;
    r.failure = f;
    r.detected_at = now;
  };
  const auto on_close = [&](int conn, double now) {
    auto f = r.mon->on_close(conn, now);
    if (!f || health) return;
    // A rank that goes without bye at the very end may have finished: the launcher's exit
    // status decides (for a short while).
    if (f->section == "shutdown" || (last_step_ > 0 && f->step >= last_step_)) {
      if (!pending_close) pending_close = {*f, now};
    } else {
      fail_with(*f, now);
    }
  };
  for (;;) {
    const double now0 = mono_now();
    for (const Incoming& in : listener_->poll(50)) {
      const double now = mono_now();
      if (!in.error.empty()) {
        log_->write(attempt, "warning", {{"message", in.error}}, "");
        continue;
      }
      if (in.closed) {
        on_close(in.conn, now);
        continue;
      }
      const json& m = *in.message;
      if (m.is_object() && m.contains("attempt") && m["attempt"].is_number() &&
          m["attempt"].get<double>() != attempt)
        continue;  // a straggling process of an earlier attempt
      for (const Finding& f : r.mon->on_message(in.conn, m, now)) {
        if (!f.failure()) {
          r.stragglers.push_back(f);
          stragglers_.push_back(finding_json(f));
          last_event_ = "straggler " + where_of(f);
          log_->write(attempt, "straggler", finding_json(f),
                      fmt::format("straggler: {}: {}", where_of(f), f.message));
        } else if (!health) {
          fail_with(f, now);
        }
      }
      if (m.is_object() && m.value("type", "") == "event") {
        const std::string ev = m.value("event", "");
        if (ev == "fault_injected") injected_++;
        if (ev != "checkpoint_saved" && ev != "done" && ev != "health") {
          json e = m;
          e.erase("type");
          e["rank_event"] = ev;
          e.erase("event");
          log_->write(attempt, "rank_event", e, "");
        }
      }
    }
    const double now = mono_now();
    if (pending_close && !r.failure && now - pending_close->second > kCloseConfirm)
      fail_with(pending_close->first, pending_close->second);
    if (!health && !r.failure) {
      if (auto f = r.mon->check_hang(now)) fail_with(*f, now);
      note_recovery(*r.mon, attempt);
    }
    if (health && !r.failure && now - launched > o_.health_timeout) {
      Finding f;
      f.cause = kCauseHang;
      f.message =
          fmt::format("the health checks did not finish within {:.0f} s", o_.health_timeout);
      fail_with(f, now);
    }
    for (auto it = sigkills.begin(); it != sigkills.end();) {
      auto rv = r.mon->ranks().find(it->rank);
      if (rv == r.mon->ranks().end() || rv->second.step < it->step || rv->second.pid <= 0) {
        ++it;
        continue;
      }
      const RankView& v = rv->second;
      if (v.host.empty() || v.host == me) {
        kill(pid_t(v.pid), SIGKILL);
        r.mon->note_fault(v.rank, now);
        injected_++;
        log_->write(
            attempt, "fault_injected",
            {{"kind", "sigkill"},
             {"rank", v.rank},
             {"host", v.host},
             {"step", v.step},
             {"pid", v.pid},
             {"by", "supervisor"}},
            fmt::format("injected: SIGKILL to rank {} (pid {}) at step {}", v.rank, v.pid, v.step));
      } else {
        log_->write(attempt, "warning", {{"message", "sigkill fault on another host skipped"}},
                    fmt::format("cannot SIGKILL rank {} on {} from {}", v.rank, v.host, me));
      }
      it = sigkills.erase(it);
    }
    if (g_stop && !r.failure) {
      Finding f;
      f.cause = "interrupted";
      f.message = fmt::format("supervise got signal {}", int(g_stop));
      fail_with(f, now);
    }
    if (r.failure && !job->exited()) {
      const double t = mono_now();
      if (!health && r.failure->cause != "interrupted") log_failure();
      job->terminate(o_.grace);
      r.torn_down = true;
      // Ranks on this host that left the launcher's process group.
      for (const auto& [k, v] : r.mon->ranks())
        if ((v.host.empty() || v.host == me) && !v.closed && process_alive(pid_t(v.pid)))
          kill(pid_t(v.pid), SIGKILL);
      log_->write(attempt, "teardown", {{"seconds", mono_now() - t}, {"exit", job->describe()}},
                  "");
      break;
    }
    if (job->poll()) {
      // Read what the ranks wrote before they went, then judge the exit status.
      for (int i = 0; i < 10 && listener_->connections() > 0; i++) {
        for (const Incoming& in : listener_->poll(20)) {
          const double t = mono_now();
          if (in.closed) {
            on_close(in.conn, t);
          } else if (in.message) {
            for (const Finding& f : r.mon->on_message(in.conn, *in.message, t))
              if (f.failure() && !health) fail_with(f, t);
          }
        }
      }
      if (pending_close && !r.failure) {
        if (job->exit_code() != 0) {
          fail_with(pending_close->first, pending_close->second);
        } else {
          const Finding& f = pending_close->first;
          log_->write(attempt, "warning", finding_json(f),
                      fmt::format("rank {} closed its connection without a bye at step {}, but "
                                  "the job exited 0: taken as completed",
                                  f.rank, f.step));
        }
      }
      if (!r.failure && job->exit_code() != 0 && !health) {
        Finding f;
        f.cause = job->signal()                        ? kCauseDied
                  : job->exit_code() == kExitBadConfig ? kCauseBadConfig
                  : job->exit_code() == kExitNumerics  ? kCauseNumerics
                  : job->exit_code() == kExitWatchdog  ? kCauseCollective
                                                       : kCauseExit;
        f.code = job->exit_code();
        f.step = r.mon->max_step();
        f.detect_s = 0;
        f.message = "the launcher exited: " + job->describe();
        fail_with(f, mono_now());
      }
      if (r.failure && !health) log_failure();
      break;
    }
    if (!health && o_.progress_every > 0 && now - last_print >= o_.progress_every) {
      last_print = now;
      fmt::print(stderr,
                 "supervise: [attempt {}] step {} (checkpoint {}), {} failure(s) so far, last "
                 "event: {}\n",
                 attempt, r.mon->max_step(),
                 std::max(newest_checkpoint_, r.mon->newest_checkpoint()), failures_.size(),
                 last_event_);
    }
    (void)now0;
  }
  r.code = job->exit_code();
  r.exit = job->describe();
  listener_->close_all();
  return r;
}

bool Supervisor::exclude(const std::vector<RankView>& bad, const std::map<int, RankView>& all,
                         const std::string& why, int attempt, int* code) {
  std::vector<std::string> hosts;
  json ranks = json::array();
  for (const auto& b : bad) {
    ranks.push_back({{"rank", b.rank}, {"host", b.host}});
    if (!b.host.empty() && std::find(hosts.begin(), hosts.end(), b.host) == hosts.end())
      hosts.push_back(b.host);
  }
  const int world = world_ > 0 ? world_ : int(all.size());
  bool by_host = false;
  LaunchCommand c = with_excluded_hosts(cmd_, hosts, &by_host);
  int removed = int(bad.size());
  if (by_host && !hosts.empty()) {
    removed = 0;
    for (const auto& [k, v] : all)
      if (std::find(hosts.begin(), hosts.end(), v.host) != hosts.end()) removed++;
  }
  const int nw = world - removed;
  std::string problem;
  if (nw < o_.min_ranks) {
    problem = fmt::format("{} rank(s) would remain, fewer than --min-ranks {}", nw, o_.min_ranks);
  } else if (config_) {
    try {
      config_->resolve_parallel(nw);
    } catch (const Error& e) {
      problem = fmt::format(
          "the global batch cannot be kept at {} ranks (the trainer keeps batch_size and "
          "derives micro-steps = batch_size / (micro_batch x dp)): {}",
          nw, e.what());
    }
  }
  if (problem.empty()) {
    try {
      c = with_world(c, nw);
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  if (!problem.empty()) {
    log_->write(attempt, "stop", {{"reason", why}, {"ranks", ranks}, {"message", problem}},
                fmt::format("cannot relaunch without {}: {}", ranks.dump(), problem));
    *code = finish(kExitHealth, "health", why + ": " + problem, attempt);
    return false;
  }
  cmd_ = c;
  world_ = nw;
  for (auto& r : ranks) {
    r["reason"] = why;
    excluded_.push_back(r);
  }
  log_->write(attempt, "exclude",
              {{"reason", why},
               {"ranks", ranks},
               {"hosts", hosts},
               {"world", nw},
               {"command", show_argv(cmd_.argv)}},
              fmt::format("excluding {} ({}): relaunching with {} ranks: {}", ranks.dump(), why, nw,
                          show_argv(cmd_.argv)));
  return true;
}

bool Supervisor::run_health(int attempt, int* code) {
  for (int round = 0; round < 16; round++) {
    const LaunchCommand h = health_command(cmd_, ckpt_dir_, o_.health_args);
    const double t = mono_now();
    JobRun r = run_job(h, attempt, true, {});
    std::vector<RankView> bad;
    json failed = json::array();
    std::set<int> reported;
    for (const auto& [k, v] : r.mon->ranks()) {
      bool ok = true;
      if (v.health.is_object()) {
        reported.insert(k);
        if (v.health.contains("ok") && v.health["ok"].is_boolean()) {
          ok = v.health["ok"].get<bool>();
        } else if (v.health.contains("checks") && v.health["checks"].is_array()) {
          for (const auto& c : v.health["checks"])
            for (const char* k : {"ok", "pass"})
              if (c.is_object() && c.contains(k) && c[k].is_boolean() && !c[k].get<bool>())
                ok = false;
        }
      } else if (r.code != 0 || r.failure) {
        ok = false;  // died or hung before reporting
      }
      if (v.closed && !v.bye) ok = false;
      if (!ok) {
        bad.push_back(v);
        failed.push_back(
            {{"rank", v.rank},
             {"host", v.host},
             {"checks", v.health.is_object() ? v.health.value("checks", json()) : json()}});
      }
    }
    const bool ok = !r.failure && r.code == 0 && bad.empty();
    log_->write(
        attempt, "health",
        {{"ok", ok},
         {"seconds", mono_now() - t},
         {"exit", r.exit},
         {"failed", failed},
         {"ranks", r.mon->ranks().size()},
         {"command", show_argv(h.argv)}},
        ok ? "" : fmt::format("health checks failed ({}): {}", r.exit, failed_checks(failed)));
    if (ok) return true;
    if (r.exec_failed || (r.code == kExitBadConfig && bad.empty())) {
      *code = finish(kExitBadConfig, "bad_config",
                     "the health command failed with its arguments (" + r.exit + ")", attempt);
      return false;
    }
    if (g_stop) {
      *code = finish(128 + g_stop, "interrupted", "signal", attempt);
      return false;
    }
    if (bad.empty()) {
      *code = finish(kExitHealth, "health",
                     "the health checks failed without naming a rank (" + r.exit + ")", attempt);
      return false;
    }
    if (!exclude(bad, r.mon->ranks(), "health", attempt, code)) return false;
  }
  *code = finish(kExitHealth, "health", "the health checks kept failing", attempt);
  return false;
}

int Supervisor::finish(int code, const std::string& result, const std::string& why, int attempt) {
  const double wall = mono_now() - t0_;
  json by_cause = json::object();
  std::vector<double> detect, recover, restore;
  json flist = json::array();
  int64_t lost = 0;
  for (const auto& f : failures_) {
    by_cause[f.f.cause] = by_cause.value(f.f.cause, 0) + 1;
    if (f.f.detect_s >= 0) detect.push_back(f.f.detect_s);
    if (f.recover_s >= 0) recover.push_back(f.recover_s);
    if (f.restore_s >= 0) restore.push_back(f.restore_s);
    lost += f.lost_steps;
    json j = finding_json(f.f);
    j["attempt"] = f.attempt;
    j["recover_s"] = f.recover_s;
    j["restore_s"] = f.restore_s;
    j["lost_steps"] = f.lost_steps;
    flist.push_back(j);
  }
  const double med = step_times_.median();
  double useful = 0;
  for (int64_t s = 1; s <= final_step_; s++) {
    auto it = step_s_.find(s);
    useful += it != step_s_.end() ? it->second : med;
  }
  json alist = json::array();
  for (const auto& a : attempts_)
    alist.push_back({{"attempt", a.attempt},
                     {"world", a.world},
                     {"start_step", a.start_step},
                     {"done", a.done},
                     {"checkpoint", a.checkpoint},
                     {"wall_s", a.wall_s},
                     {"exit", a.exit},
                     {"cause", a.cause ? json(*a.cause) : json()}});
  json rep = {{"result", result},
              {"exit_code", code},
              {"reason", why},
              {"attempts", attempts_.size()},
              {"restarts", attempts_.empty() ? 0 : int(attempts_.size()) - 1},
              {"wall_s", wall},
              {"final_step", final_step_},
              {"newest_checkpoint", newest_checkpoint_},
              {"failures", failures_.size()},
              {"by_cause", by_cause},
              {"injected_faults", injected_},
              {"detect_s", stats(detect)},
              {"recover_s", stats(recover)},
              {"restore_s", stats(restore)},
              {"lost_steps", lost},
              {"lost_s", double(lost) * med},
              {"median_step_s", med},
              {"useful_step_s", useful},
              {"goodput", wall > 0 ? useful / wall : 0.0},
              {"stragglers", stragglers_},
              {"excluded", excluded_},
              {"failure_list", flist},
              {"attempt_list", alist}};
  fs::create_directories(fs::path(report_path_).parent_path());
  write_file_atomic(report_path_, rep.dump(2) + "\n");
  log_->write(attempt, "stop", {{"result", result}, {"exit_code", code}, {"reason", why}}, "");
  std::string causes;
  for (auto& [k, v] : by_cause.items())
    causes += fmt::format("{}{} {}", causes.empty() ? "" : ", ", v.get<int>(), k);
  fmt::print(stderr,
             "supervise: {} (exit {}): {}\nsupervise: {} attempt(s), {} failure(s){}; final step "
             "{}; detect median {:.2f} s max {:.2f} s; recover median {:.2f} s; lost {} step(s); "
             "goodput {:.1f}%; report {}\n",
             result, code, why, attempts_.size(), failures_.size(),
             causes.empty() ? "" : " (" + causes + ")", final_step_,
             rep["detect_s"].value("median", 0.0), rep["detect_s"].value("max", 0.0),
             rep["recover_s"].value("median", 0.0), lost, 100 * rep["goodput"].get<double>(),
             report_path_);
  return code;
}

int Supervisor::run() {
  int no_progress = 0;
  int64_t& best_done = best_done_;
  int64_t& best_ckpt = best_ckpt_;
  std::optional<std::string> startup_failure;
  for (int attempt = 0;; attempt++) {
    if (o_.health && (attempt == 0 || !o_.health_first_only)) {
      int code = 0;
      if (!run_health(attempt, &code)) return code;
    }
    const LaunchCommand cmd = attempt == 0 ? cmd_ : with_resume_auto(cmd_);
    const std::vector<PlannedFault> faults =
        plan_.for_attempt(attempt, world_, best_ckpt, last_step_);
    json fj = json::array();
    for (const auto& f : faults) fj.push_back(f.spec());
    log_->write(attempt, "launch",
                {{"command", show_argv(cmd.argv)}, {"world", world_}, {"faults", fj}},
                fmt::format("launching{}: {}", faults.empty() ? "" : " with faults " + fj.dump(),
                            show_argv(cmd.argv)));
    const double launched = mono_now();
    JobRun r = run_job(cmd, attempt, false, faults);
    const AttemptMonitor& mon = *r.mon;
    if (world_ == 0) world_ = mon.world();
    for (const auto& [s, d] : mon.step_durations()) step_s_[s] = d;
    note_recovery(mon, attempt);
    // The previous failure's lost work: the steps done before it that this attempt does again.
    if (!failures_.empty() && failures_.back().attempt == attempt - 1 && !mon.ranks().empty())
      failures_.back().lost_steps = std::max<int64_t>(0, best_done - mon.start_step());
    const bool progressed = mon.max_done() > best_done || mon.newest_checkpoint() > best_ckpt;
    best_done = std::max(best_done, mon.max_done());
    best_ckpt = std::max(best_ckpt, mon.newest_checkpoint());
    final_step_ = best_done;
    newest_checkpoint_ = best_ckpt;
    AttemptRecord a;
    a.attempt = attempt;
    a.world = world_;
    a.start_step = mon.start_step();
    a.done = mon.max_done();
    a.checkpoint = mon.newest_checkpoint();
    a.wall_s = mono_now() - launched;
    a.exit = r.exit;
    if (r.failure) a.cause = r.failure->cause;
    attempts_.push_back(a);
    if (g_stop)
      return finish(128 + g_stop, "interrupted", fmt::format("signal {}", int(g_stop)), attempt);
    if (!r.failure) {
      final_step_ = mon.max_done();
      log_->write(attempt, "completed", {{"step", final_step_}}, "");
      return finish(kExitCompleted, "completed",
                    fmt::format("the job completed at step {}", final_step_), attempt);
    }
    const Finding& f = *r.failure;
    last_event_ = f.cause + " " + where_of(f);
    failures_.push_back({attempt, f, r.detected_at});
    if (f.cause == kCauseBadConfig)
      return finish(kExitBadConfig, "bad_config", fmt::format("{}: {}", where_of(f), f.message),
                    attempt);
    if (f.cause == kCauseNumerics) {
      if (numerics_steps_.count(f.step))
        return finish(kExitNumerics, "numerics",
                      fmt::format("step {} failed numerically again after a relaunch", f.step),
                      attempt);
      numerics_steps_.insert(f.step);
    }
    // The same failure before any rank computed, twice without injected faults: configuration.
    const bool at_startup = mon.first_compute_at() < 0;
    const std::string key = f.cause + ":" + std::to_string(f.code) + ":" + r.exit;
    if (at_startup && faults.empty()) {
      if (startup_failure == key)
        return finish(kExitBadConfig, "bad_config",
                      "the job failed twice at startup the same way (" + f.message + ")", attempt);
      startup_failure = key;
    } else {
      startup_failure.reset();
    }
    no_progress = attempt > 0 && !progressed ? no_progress + 1 : 0;
    if (no_progress >= o_.no_progress)
      return finish(kExitGaveUp, "gave_up",
                    fmt::format("{} consecutive relaunch(es) made no progress beyond step {} "
                                "(checkpoint {})",
                                no_progress, best_done, best_ckpt),
                    attempt);
    if (attempt >= o_.max_restarts)
      return finish(
          kExitGaveUp, "gave_up",
          fmt::format("the relaunch limit (--max-restarts {}) is reached", o_.max_restarts),
          attempt);
    if (o_.exclude_stragglers && !r.stragglers.empty()) {
      std::vector<RankView> slow;
      for (const auto& s : r.stragglers) slow.push_back(mon.ranks().at(s.rank));
      int code = 0;
      if (!exclude(slow, mon.ranks(), "straggler", attempt, &code)) return code;
    }
  }
}

}  // namespace

int supervise(const SupervisorOptions& options) {
  Supervisor s(options);
  g_stop = 0;
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int code = s.run();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return code;
}

}  // namespace zaya::ft
