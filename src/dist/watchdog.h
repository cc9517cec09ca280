// The in-rank watchdog: a thread that watches the section state of dist/heartbeat.h and ends the
// process when a collective has made no progress (the "collective" section has not changed) for
// longer than the timeout: it prints one line naming the rank, host, collective, step and the time
// waited, sends a "watchdog_abort" event and "bye" to the supervisor, runs the abort callbacks
// (the NCCL communicator registers ncclCommAbort there, so no kernel keeps waiting on a peer) and
// ends the whole job with kExitWatchdog through abort_all_ranks (MPI_Abort under mpirun), so no
// other rank is left waiting in the collective either.
//
// The timeout comes from ZAYA_COLLECTIVE_TIMEOUT (seconds; 0 or unset: off) or the run config
// ([fault_tolerance] collective_timeout; the environment wins). Not here: hangs outside
// collectives (the supervisor sees those from the beats), retrying a collective.
#pragma once
#include <functional>
#include <string>

namespace zaya::ft {

// ZAYA_COLLECTIVE_TIMEOUT in seconds (0 when unset); throws ConfigError (core/error.h) naming the
// variable for a value that is not a number >= 0.
double collective_timeout_from_env();

// Starts the watchdog once per process when timeout_s > 0 (later calls change nothing). `rank` and
// `host` name the process in its message. The check runs a few times per timeout, so the abort
// comes within about timeout_s × 1.1 + 0.1 s of the collective's start.
void start_watchdog(double timeout_s, int rank, const std::string& host);
bool watchdog_running();

// Callbacks the watchdog runs before ending the process (in registration order, each at most
// once). Returns an id for remove_watchdog_abort.
int on_watchdog_abort(std::function<void()> fn);
void remove_watchdog_abort(int id);

}  // namespace zaya::ft
