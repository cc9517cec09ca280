// Fault injection for tests and drills, off unless ZAYA_FAULTS is set (dist/ft_protocol.h has the
// grammar: "KIND@rank=R,step=S[,section=SEC][,arg=V]" items separated by ';'). Each fault acts
// once, on its rank only, and sends a "fault_injected" event before it acts:
//   kill          SIGKILL itself at the start of step S (with section=SEC: on entering SEC in S)
//   exit          exit with code arg (default 1) at that point, without a word to the supervisor
//   hang          block forever at that point; section=collective blocks inside the next
//                 collective of step S (so the other ranks wait in it too and the watchdog fires)
//   error         raise a zaya::Error at the start of step S (the rank's ordinary error path;
//                 ZAYA_TEST_FAIL_AT=R:S is this fault)
//   nan           poison this rank's gradients of step S (the trainer asks poison_gradients), so
//                 the all-reduced gradient norm is non-finite on every rank
//   slow          sleep arg seconds in every step from S on (a straggler)
//   corrupt_ckpt  after the first checkpoint of a step >= S is committed, flip bytes in one of its
//                 data files, then exit with kExitError as if the node died
//   disk_full     the next checkpoint file write from step S on fails as ENOSPC would
// Not here: random fault schedules (the supervisor writes the list), faults in other processes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/heartbeat.h"

namespace zaya::ft {

// In the order of kFaultKinds (dist/ft_protocol.h).
enum class FaultKind { Kill, Exit, Hang, Error, NaN, Slow, CorruptCkpt, DiskFull };
const char* fault_kind_name(FaultKind k);

struct Fault {
  FaultKind kind = FaultKind::Kill;
  int rank = 0;
  int64_t step = 1;
  std::optional<SectionId> section;  // kill, exit, hang: where in the step (unset: its start)
  double arg = 0;                    // exit: the code; slow: seconds per step
  std::string text;                  // the item as written, for messages
};

// Parses a fault list. Throws zaya::Error naming `where`, the item and what was expected.
std::vector<Fault> parse_faults(const std::string& spec, const std::string& where = kEnvFaults);

// Reads ZAYA_FAULTS (and ZAYA_TEST_FAIL_AT) once per process and arms this rank's faults; a
// malformed list is a ConfigError (core/error.h). Returns how many faults this rank has.
size_t install_faults(int rank);
// Installs `faults` (this rank's subset) directly: for tests.
void install_faults(const std::vector<Fault>& faults, int rank);

// The trainer's questions, each false/no-op without a matching fault:
// whether to poison this rank's gradients of `step` (nan);
bool poison_gradients(int64_t step);
// after the checkpoint of `step` was committed at `dir` (corrupt_ckpt: may not return);
void after_checkpoint_commit(int64_t step, const std::string& dir);
// the checkpoint writer's: whether this write must fail with ENOSPC (disk_full; consumes it).
bool take_disk_full();

}  // namespace zaya::ft
