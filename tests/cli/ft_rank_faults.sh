#!/bin/bash
# Injected faults in a data-parallel run under `mpirun -np 2` (dist/fault_inject.h), each against
# the rank-side behaviour the supervisor relies on:
#  - a hang inside a collective on rank 1, with ZAYA_COLLECTIVE_TIMEOUT=3: the in-rank watchdog
#    ends the whole job within 10 s with exit code 5, naming the rank, the collective and the step;
#  - NaN gradients on rank 1 at step 3 with fault_tolerance.nonfinite = "restart" (and "auto"
#    under a supervisor address): every rank exits 3 before the update; --resume auto then
#    finishes with weights bit-identical to an uninterrupted run;
#  - disk full on rank 1 from step 3: the step-4 checkpoint fails through the ordinary error path
#    (ENOSPC named), nothing half-written is left, and --resume auto continues from step 2 to the
#    same final weights;
#  - a corrupted checkpoint (rank 0 flips bytes in step 4's data after its commit and dies):
#    --resume auto skips it, resumes from step 2 and reaches the same final weights;
#  - the loss-spike rule stops the run (exit 3) at the step where the loss jumps;
#  - a bad [fault_tolerance] value is a configuration error: exit code 2.
# Usage: bash ft_rank_faults.sh <zaya-binary> <source-dir>   (skips, exit 0, without MPI)
set -u
zaya="$1"
src="$2"
# shellcheck source=tests/cli/lib/tiny_run.sh
source "$src/tests/cli/lib/tiny_run.sh"
mpi_script_setup
unset ZAYA_SUPERVISOR ZAYA_FAULTS ZAYA_COLLECTIVE_TIMEOUT ZAYA_TEST_FAIL_AT
tiny_run_data "$T/ds" "$src" || fail "data prepare"
tiny_run_toml "$T/ds" 6 3 2 > "$T/run.toml"
mpi() { timeout 120 mpirun -np 2 --oversubscribe "$@"; }
train() {  # train NAME [flags...]: trains into $T/NAME, output in $T/NAME.log; returns the status
  local name="$1"
  shift
  mpi "$zaya" train --config "$T/run.toml" --out "$T/$name" --quiet "$@" > "$T/$name.log" 2>&1
}
same_weights() {  # same_weights NAME: its final weights are the reference's, bit for bit
  cmp -s "$T/ref/model/model.safetensors" "$T/$1/model/model.safetensors" ||
    fail "$1: the final weights differ from the uninterrupted run"
}
resumes_to_the_end() {  # resumes_to_the_end NAME: --resume auto picks step 2 and matches the reference
  train "$1" --resume auto || { tail -20 "$T/$1.log"; fail "$1: resuming"; }
  grep -q "resuming from $T/$1/checkpoints/step-00000002" "$T/$1.log" ||
    { cat "$T/$1.log"; fail "$1: did not resume from step 2"; }
  same_weights "$1"
}
start=$SECONDS
train ref || { tail -20 "$T/ref.log"; fail "the reference run"; }
ref_took=$((SECONDS - start))  # a whole run on this machine now (start-up included)

# 1. A hang inside a collective: the watchdog ends the job.
t0=$SECONDS
ZAYA_COLLECTIVE_TIMEOUT=3 ZAYA_FAULTS="hang@rank=1,step=3,section=collective" train hang
rc=$?
took=$((SECONDS - t0))
[ $rc -eq 5 ] || { cat "$T/hang.log"; fail "hang: exit status $rc, expected 5 (watchdog)"; }
# The hang begins mid-run: the job must end within the timeout and a few seconds of teardown
# after what a whole run takes here (a loaded CI machine starts slowly).
[ $took -le $((ref_took + 8)) ] ||
  { cat "$T/hang.log"; fail "hang: the job took $took s to end (a whole run takes $ref_took s; expected <= $((ref_took + 8)))"; }
grep -q "rank 1: injected fault hang@rank=1,step=3,section=collective" "$T/hang.log" ||
  { cat "$T/hang.log"; fail "hang: no fault_injected line from rank 1"; }
grep -Eq "rank [01] on .*: watchdog: [a-z_]+ of step 3 made no progress for [3-9]\.[0-9] s" "$T/hang.log" ||
  { cat "$T/hang.log"; fail "hang: no watchdog line naming the rank, collective and step"; }
echo "hang in a collective: job ended with status 5 after $took s"

# 2. NaN gradients on one rank: every rank stops with 3 before the update; resuming finishes.
ZAYA_FAULTS="nan@rank=1,step=3" train nan --fault_tolerance.nonfinite=restart
rc=$?
[ $rc -eq 3 ] || { cat "$T/nan.log"; fail "nan: exit status $rc, expected 3"; }
for r in 0 1; do
  grep -q "rank $r of 2 .*step 3: non-finite loss .* or grad norm nan: stopping without the update" "$T/nan.log" ||
    { cat "$T/nan.log"; fail "nan: rank $r did not report the non-finite step"; }
done
grep -q "ending the whole job" "$T/nan.log" && { cat "$T/nan.log"; fail "nan: the job was aborted instead of every rank agreeing"; }
python3 -c "import json,sys; s=[json.loads(l)['step'] for l in open(sys.argv[1])]; sys.exit(0 if s == [1, 2] else 1)" \
  "$T/nan/metrics.jsonl" || { cat "$T/nan/metrics.jsonl"; fail "nan: metrics hold a step past 2"; }
[ ! -e "$T/nan/checkpoints/step-00000004" ] || fail "nan: a checkpoint past the non-finite step"
resumes_to_the_end nan
# Supervised (an address, even one nobody listens at), "auto" means restart.
ZAYA_SUPERVISOR=127.0.0.1:9 ZAYA_FAULTS="nan@rank=0,step=2" train nan_auto
rc=$?
[ $rc -eq 3 ] || { cat "$T/nan_auto.log"; fail "nan under a supervisor address: exit status $rc, expected 3"; }
grep -q "the supervisor at 127.0.0.1:9 cannot be reached" "$T/nan_auto.log" ||
  { cat "$T/nan_auto.log"; fail "no warning about the unreachable supervisor"; }
echo "nan: every rank exited 3 before the update; the resumed run matches bit for bit"

# 3. Disk full on rank 1 from step 3: the step-4 checkpoint fails, step 2 stays.
ZAYA_FAULTS="disk_full@rank=1,step=3" train disk
rc=$?
[ $rc -ne 0 ] || fail "disk_full: exit status 0"
grep -q "checkpoint $T/disk/checkpoints/step-00000004 was not saved .*rank 1 .*No space left on device" "$T/disk.log" ||
  { cat "$T/disk.log"; fail "disk_full: the error does not name the checkpoint, the rank and ENOSPC"; }
left=$(ls -A "$T/disk/checkpoints")
[ "$left" = "step-00000002" ] || fail "disk_full: checkpoints/ holds '$left'"
resumes_to_the_end disk
echo "disk_full: the save failed cleanly; the resumed run matches bit for bit"

# 4. A checkpoint corrupted after its commit, its writer dead: resume skips it.
ZAYA_FAULTS="corrupt_ckpt@rank=0,step=4" train corrupt
rc=$?
[ $rc -ne 0 ] || fail "corrupt_ckpt: exit status 0"
grep -q "rank 0: injected fault corrupt_ckpt@rank=0,step=4: flipping 16 bytes" "$T/corrupt.log" ||
  { cat "$T/corrupt.log"; fail "corrupt_ckpt: no fault line"; }
[ -d "$T/corrupt/checkpoints/step-00000004" ] || fail "corrupt_ckpt: step 4 was not committed first"
resumes_to_the_end corrupt
grep -q "skipping.*step-00000004" "$T/corrupt.log" || { cat "$T/corrupt.log"; fail "corrupt_ckpt: the corrupt checkpoint was not skipped"; }
echo "corrupt_ckpt: resumed from step 2; the final weights match bit for bit"

# 5. The loss-spike rule (1.2 × the mean of the last 2 steps): at a learning rate high enough for
#    the loss to jump, it stops the run (exit 3) at the first step the rule picks out of the same
#    run's losses without it, before that step's metrics line.
hot=(--optim.lr=0.1 --optim.min_lr=0)
train hot "${hot[@]}" || { tail -20 "$T/hot.log"; fail "the run at a high learning rate"; }
spike=$(python3 -c "
import json, sys
l = [json.loads(x)['loss'] for x in open(sys.argv[1])]
print(next((i + 1 for i in range(2, len(l)) if l[i] > 1.2 * (l[i - 1] + l[i - 2]) / 2), 0))" "$T/hot/metrics.jsonl")
[ "$spike" -gt 0 ] || { cat "$T/hot/metrics.jsonl"; fail "loss spike: the premise fails (no jump in loss at lr 0.1)"; }
train spike "${hot[@]}" --fault_tolerance.nonfinite=restart --fault_tolerance.loss_spike=1.2 \
  --fault_tolerance.loss_spike_window=2
rc=$?
[ $rc -eq 3 ] || { cat "$T/spike.log"; fail "loss spike at step $spike: exit status $rc, expected 3"; }
grep -q "step $spike: loss .* exceeds 1.2 × the mean .* of the last 2 steps: stopping without the update" "$T/spike.log" ||
  { cat "$T/spike.log"; fail "loss spike: no message naming step $spike"; }
[ "$(wc -l < "$T/spike/metrics.jsonl")" -eq $((spike - 1)) ] || fail "loss spike: metrics past step $((spike - 1))"
echo "loss spike: stopped at step $spike with status 3"

# 6. A bad [fault_tolerance] value: a configuration error, status 2.
"$zaya" train --config "$T/run.toml" --out "$T/badcfg" --fault_tolerance.nonfinite=maybe > "$T/badcfg.log" 2>&1
rc=$?
[ $rc -eq 2 ] || { cat "$T/badcfg.log"; fail "a bad fault_tolerance.nonfinite: exit status $rc, expected 2"; }
grep -q 'fault_tolerance.nonfinite = "maybe" is invalid' "$T/badcfg.log" || { cat "$T/badcfg.log"; fail "no message"; }
echo "PASS ($((SECONDS - start)) s)"
