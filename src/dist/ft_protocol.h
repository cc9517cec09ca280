// The contract between `zaya supervise` (src/ft/) and the ranks of the job it runs (the trainer,
// `zaya health`): environment variables the supervisor sets, the exit codes both sides use, and the
// messages ranks send it. Header-only constants; the rank side is dist/heartbeat.*, the supervisor
// side ft/. docs/FAULT_TOLERANCE.md explains them for users.
//
// Transport: each rank opens one TCP connection to ZAYA_SUPERVISOR ("HOST:PORT", the supervisor's
// address as the ranks' nodes reach it) and writes newline-terminated JSON objects, one per message;
// the supervisor never writes back. A connection that closes without a "bye" message is a rank that
// died (on another node the supervisor cannot see the process). Without ZAYA_SUPERVISOR a rank sends
// nothing and behaves exactly as an unsupervised run.
//
// Every message has these fields:
//   "type":    "hello" | "beat" | "event" | "bye"
//   "rank", "world": the rank and world size (int), "host": its host name, "pid": its process id,
//   "attempt": ZAYA_SUPERVISOR_ATTEMPT (int, 0 for the first launch),
//   "t":       seconds since the Unix epoch (double, the rank's clock; the supervisor stamps its own
//              arrival time and uses that for timeouts)
// and, by type:
//   hello: "step" (the step the rank starts from: resumed step or 0), "kind" ("train" | "health")
//   beat:  "step" (the step in progress, 1-based; 0 before the first), "section" (one of kSections),
//          "step_s" (duration of the last completed step in seconds, or null), sent on every
//          section change (throttled to at most one per kBeatMinInterval per section change) and at
//          least every kBeatInterval while a section lasts; also "section_s" (seconds since the
//          section last changed, double) and, inside a collective, "op" ("all_reduce",
//          "reduce_scatter", "synchronize", ...). A collective that is part of a checkpoint save
//          is reported as section "checkpoint".
//   event: "event" (a short name: "nonfinite", "loss_spike", "checkpoint_saved", "fault_injected",
//          "watchdog_abort", "health", "error", "done"), "step", and free-form fields ("message",
//          "path", "checks" for health, ...)
//   bye:   "status" ("completed" | "error"), "step", "code" (the exit code the process will return)
// Event fields by event (rank side, dist/heartbeat.h): nonfinite/loss_spike: "loss", "grad_norm"
// (null when not finite), "message"; checkpoint_saved: "path", "checkpoint_step" (the step
// saved; "step" is the one in progress at the commit); fault_injected: "fault" (a kFaultKinds
// name), "spec" (the item as written), "section" (when given), "message"; watchdog_abort:
// "collective", "seconds", "timeout_s", "message"; health: "ok", "checks" (a list of {"name",
// "pass", "measured", "threshold", "unit", "at_least", "detail"}); error: "message", "code";
// done: "steps".
#pragma once

namespace zaya::ft {

// Environment the supervisor sets for the job it launches.
inline constexpr const char* kEnvAddress = "ZAYA_SUPERVISOR";         // "HOST:PORT"
inline constexpr const char* kEnvAttempt = "ZAYA_SUPERVISOR_ATTEMPT";  // "0", "1", ...
// Faults to inject in this attempt (docs/FAULT_TOLERANCE.md, dist/fault_inject.h): a list of
// "KIND@rank=R,step=S[,section=SEC][,arg=V]" separated by ';'. Off unless set.
inline constexpr const char* kEnvFaults = "ZAYA_FAULTS";
// The fault kinds of ZAYA_FAULTS (dist/fault_inject.h says what each does).
inline constexpr const char* kFaultKinds[] = {"kill", "exit",         "hang",     "error",
                                              "nan",  "slow", "corrupt_ckpt", "disk_full"};
// Seconds a collective may make no progress before the rank's watchdog aborts it (0: off).
inline constexpr const char* kEnvCollectiveTimeout = "ZAYA_COLLECTIVE_TIMEOUT";

// Exit codes, of `zaya train` under supervision and of `zaya supervise` itself.
inline constexpr int kExitCompleted = 0;
inline constexpr int kExitError = 1;          // any other failure (hardware, crash, I/O)
inline constexpr int kExitBadConfig = 2;      // the configuration or command line is wrong
inline constexpr int kExitNumerics = 3;       // non-finite loss/gradients or a loss spike
inline constexpr int kExitGaveUp = 4;         // supervise: relaunch limit or no progress
inline constexpr int kExitWatchdog = 5;       // a rank's watchdog aborted a hung collective
inline constexpr int kExitHealth = 6;         // supervise: health checks left too few ranks
                                              // (`zaya health`: a check failed on some rank)

// Where a rank is. "collective" covers the data-parallel step's reduce-scatter/all-gather and the
// trainer's small all-reduces; "checkpoint" the blocking part of a save (and restore on resume).
inline constexpr const char* kSections[] = {"startup", "data",      "forward",   "backward",
                                            "collective", "optimizer", "eval", "checkpoint",
                                            "shutdown"};

inline constexpr double kBeatInterval = 1.0;        // seconds between beats within one section
inline constexpr double kBeatMinInterval = 0.05;    // at most this often on section changes

// An optional beat field the supervisor reads when present (added with the supervisor): "busy_s",
// the last completed step's time outside collectives (data, compute). It tells a straggler apart
// when every rank's step_s is the same (data parallelism waits for the slowest); without it the
// supervisor times a step from its first beat to its first "collective" beat.
inline constexpr const char* kBeatBusyField = "busy_s";

}  // namespace zaya::ft
