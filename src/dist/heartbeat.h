// The rank side of the supervisor protocol (dist/ft_protocol.h): where this process is (the step in
// progress and the section: data, forward, collective, ...), kept by RAII section guards, and a
// process-wide reporter that, when ZAYA_SUPERVISOR is set, sends the supervisor hello, beats,
// events and bye as newline-delimited JSON over one TCP connection.
//
// Sending never blocks the caller: messages go into a bounded queue that a background thread
// writes (socket writes time out after a few seconds there). A supervisor that cannot be reached
// or goes away is reported once on stderr; the thread tries to reconnect every few seconds and
// training carries on (beats in between are dropped, events are kept up to a bound). Without
// ZAYA_SUPERVISOR nothing is started or sent and a section guard is a few relaxed atomic stores,
// so the guards may sit around every collective. The section state is read by the in-rank
// watchdog (dist/watchdog.h) whether or not a supervisor listens.
//
// Not here: the supervisor (ft/), decisions taken from the messages, fault injection
// (dist/fault_inject.h, which hooks into section entry through set_section_hook).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/ft_protocol.h"

namespace zaya::ft {

// The sections of kSections, in that order.
enum SectionId : int {
  kStartup = 0,
  kData,
  kForward,
  kBackward,
  kCollective,
  kOptimizer,
  kEval,
  kCheckpoint,
  kShutdown,
  kSectionCount
};
static_assert(sizeof(kSections) / sizeof(kSections[0]) == kSectionCount);
const char* section_name(SectionId s);
// The section called `name` (one of kSections); throws zaya::Error naming `what` otherwise.
SectionId section_from_name(const std::string& name, const std::string& what);

// Marks a section from construction to destruction and restores the enclosing one afterwards (the
// time spent in it restarts then: "no progress" is measured from the last change). Collectives
// inside a checkpoint section are reported as "checkpoint" and left alone by the watchdog: a
// commit waits there for the slowest rank's writes, which the supervisor times separately. `op`
// names the operation for messages ("all_reduce", "reduce_scatter", ...; a string literal).
// Entering a section runs the section hook (fault injection), which may not return (kill, hang).
class SectionGuard {
 public:
  explicit SectionGuard(SectionId s, const char* op = nullptr);
  ~SectionGuard();
  SectionGuard(const SectionGuard&) = delete;
  SectionGuard& operator=(const SectionGuard&) = delete;

 private:
  SectionId prev_;
  const char* prev_op_;
};
[[nodiscard]] inline SectionGuard section(SectionId s, const char* op = nullptr) {
  return SectionGuard(s, op);
}

// Where this process is now.
struct Where {
  SectionId section = kStartup;
  const char* op = nullptr;    // the operation inside the section, when its guard named one
  int64_t step = 0;            // in progress (1-based; 0 before the first)
  double seconds = 0;          // since the section last changed
  bool in_checkpoint = false;  // inside a checkpoint section (a collective of the commit)
};
Where where_now();

// The step now in progress (1-based), at its start; runs the section hook for step-level faults.
void set_step(int64_t step);
int64_t current_step();
// The duration of the step just completed: beats carry it as step_s from now on.
void step_finished(double seconds);

// Called on every section entry, once the section is current (and by set_step, with the current
// section and step_start set); fault injection installs it. nullptr removes it. A hook that throws
// may do so only from set_step (a guard's constructor must not throw once the section switched).
using SectionHook = void (*)(SectionId entered, int64_t step, bool step_start);
void set_section_hook(SectionHook hook);

// Who this process is, for the messages.
struct RankIdentity {
  int rank = 0, world = 1;
  std::string host;
  std::string kind = "train";  // "train" | "health"
  int64_t start_step = 0;      // the step the rank starts from (resumed step or 0)
};

// Whether ZAYA_SUPERVISOR is set.
bool supervised();
// ZAYA_SUPERVISOR_ATTEMPT (0 when unset); throws zaya::Error for a value that is not an integer.
int attempt();
// Starts the reporter once per process (later calls change nothing): with ZAYA_SUPERVISOR set,
// connects in the background and sends hello. Throws zaya::Error only for a malformed address.
void start_reporting(const RankIdentity& id);
// An "event" message (type, step and the common fields are added; `fields` must be an object).
// Does nothing unless reporting was started.
void send_event(const std::string& event, const nlohmann::json& fields = nlohmann::json::object());
// Sends "bye" with the status ("completed" | "error") and the exit code the process will return,
// waits up to `timeout_s` for the queue to be written, and stops the background thread. Once per
// process; later messages are dropped.
void finish_reporting(const std::string& status, int code, double timeout_s = 2.0);
// Waits up to `timeout_s` until every queued message was written (or dropped); whether it was.
bool flush_reporting(double timeout_s);

// The message text as sent (one JSON object; the reporter appends the newline). For tests and the
// reporter itself: `type` and its fields; the common fields come from `id` and the clock.
nlohmann::json make_message(const std::string& type, const RankIdentity& id,
                            const nlohmann::json& fields);

}  // namespace zaya::ft
