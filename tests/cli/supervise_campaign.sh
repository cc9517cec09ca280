#!/bin/bash
# `zaya supervise` against real ranks: `mpirun -np 2 zaya train` on CPU, the tiny run of
# tests/cli/lib/tiny_run.sh with a checkpoint every step.
#  - a campaign of 24 planned failures, at least 20 of which must fire (kill at a step and inside
#    a section, SIGKILL from the supervisor, exit with a code, an error, hangs in data, forward,
#    backward, optimizer and inside a collective, NaN once, corrupted checkpoints), completes, and
#    its final weights are bit-identical to the uninterrupted run's;
#  - every hang is detected within 10 s and, outside collectives, the hung rank is named;
#  - a slow rank is flagged as a straggler;
#  - a hang in a collective caught by the ranks' own watchdog (exit 5) is recovered from;
#  - a NaN at the same step again after the relaunch stops with the numerics code (3);
#  - a relaunch loop without progress stops with the give-up code (4).
# Prints the campaign's counts and its detection and recovery times.
# Usage: bash supervise_campaign.sh <zaya-binary> <source-dir>   (skips, exit 0, without MPI)
set -u
zaya="$1"
src="$2"
# shellcheck source=tests/cli/lib/tiny_run.sh
source "$src/tests/cli/lib/tiny_run.sh"
mpi_script_setup
"$zaya" health --help > /dev/null 2>&1 ||
  { echo "SKIP: this zaya has no 'zaya health' (the ranks' side of the supervisor protocol)"; exit 0; }
tiny_run_data "$T/ds" "$src" || fail "data prepare"
steps=36
tiny_run_toml "$T/ds" "$steps" 4 1 > "$T/run.toml"   # a checkpoint every step
job() {  # job NAME ARGS...: the launch command of a run into $T/NAME
  local name="$1"
  shift
  echo mpirun -np 2 --oversubscribe "$zaya" train --config "$T/run.toml" --out "$T/$name" --quiet "$@"
}
# The supervisor's settings for the tests. The campaign: health checks before the first launch, a
# hang is 3 s without progress (the steps take about 0.4 s here).
sup=(--ckpt-timeout 20 --startup-timeout 60 --grace 2
     --progress-every 0 --max-restarts 40)

start=$SECONDS
# shellcheck disable=SC2046
timeout 300 $(job ref) > "$T/ref.log" 2>&1 || { tail -20 "$T/ref.log"; fail "the uninterrupted run"; }
echo "uninterrupted run: $((SECONDS - start)) s"

# One fault per attempt, each a step or two after the newest checkpoint the supervisor saw
# (step=+N); one whose checkpoint committed unseen just before a teardown does not fire.
cat > "$T/plan.txt" <<'PLAN'
kill@rank=1,step=+2
hang@rank=0,step=+2,section=forward
exit@rank=1,step=+1,arg=1
hang@rank=1,step=+2,section=collective
sigkill@rank=0,step=+2
nan@rank=0,step=+2
kill@rank=0,step=+1,section=backward
hang@rank=1,step=+1,section=data
corrupt_ckpt@rank=0,step=+1
exit@rank=0,step=+2,arg=1
hang@rank=0,step=+2,section=collective
kill@rank=1,step=+1,section=optimizer
error@rank=1,step=+2
hang@rank=1,step=+1,section=backward
sigkill@rank=1,step=+1
kill@rank=0,step=+2,section=collective
exit@rank=1,step=+2,arg=7
hang@rank=0,step=+1,section=optimizer
corrupt_ckpt@rank=1,step=+1
kill@rank=1,step=+2
hang@rank=1,step=+2,section=forward
exit@rank=0,step=+1,arg=1
kill@rank=0,step=+2,section=forward
hang@rank=0,step=+2,section=backward
PLAN
t0=$SECONDS
# shellcheck disable=SC2046
timeout 600 "$zaya" supervise "${sup[@]}" --health first --hang-min 3 --no-progress 30 --faults "$T/plan.txt" -- $(job c) \
  > "$T/c.log" 2>&1
rc=$?
grep "^supervise:" "$T/c.log" | tail -60
[ "$rc" = 0 ] || fail "the campaign ended with exit $rc"
echo "campaign: $((SECONDS - t0)) s"
cmp -s "$T/ref/model/model.safetensors" "$T/c/model/model.safetensors" ||
  fail "the campaign's final weights differ from the uninterrupted run's"
python3 - "$T/c/supervisor" <<'PY' || fail "the campaign's events and report"
import json, sys
d = sys.argv[1]
ev = [json.loads(l) for l in open(f"{d}/events.jsonl")]
rep = json.load(open(f"{d}/report.json"))
faults = {e["attempt"]: e["faults"] for e in ev if e["event"] == "launch"}
fails = [e for e in ev if e["event"] == "failure"]
assert rep["result"] == "completed" and rep["failures"] == len(fails), rep
assert len(fails) >= 20, f"only {len(fails)} failures"
assert rep["injected_faults"] >= 20, rep["injected_faults"]
causes = rep["by_cause"]
for c in ["died", "exit", "hang", "numerics"]:
    assert causes.get(c, 0) >= 1, f"no failure of cause {c}: {causes}"
hangs = 0
for f in fails:
    spec = faults[f["attempt"]][0]
    kind, rest = spec.split("@")
    fr = dict(kv.split("=") for kv in rest.split(","))
    if kind == "hang":
        hangs += 1
        assert f["cause"] in ("hang", "collective_hang"), (spec, f)
        assert f["detect_s"] <= 10, (spec, f)
        if fr.get("section") != "collective":
            assert f["rank"] == int(fr["rank"]), f"{spec}: the hang was blamed on rank {f['rank']}"
    if kind == "nan":
        assert f["cause"] == "numerics", (spec, f)
assert hangs >= 6, hangs
rec = [f["recover_s"] for f in rep["failure_list"] if f["recover_s"] >= 0]
assert len(rec) >= 20, rec
det = rep["detect_s"]
print(f"campaign: {len(fails)} failures {json.dumps(causes, sort_keys=True)}, {rep['attempts']} attempts,"
      f" {rep['injected_faults']} faults injected; detect median {det['median']:.2f} s max {det['max']:.2f} s;"
      f" hang detection max {max(f['detect_s'] for f in fails if f['cause'] == 'hang'):.2f} s;"
      f" recover median {rep['recover_s']['median']:.2f} s max {rep['recover_s']['max']:.2f} s;"
      f" restore median {rep['restore_s']['median']:.2f} s; lost {rep['lost_steps']} steps;"
      f" goodput {100 * rep['goodput']:.1f}%; wall {rep['wall_s']:.0f} s")
PY

# A slow rank: rank 1 sleeps 0.5 s in every step from step 2 on.
t0=$SECONDS
# shellcheck disable=SC2046
timeout 300 "$zaya" supervise "${sup[@]}" --health off --straggler-window 3 --straggler-windows 2 \
  --hang-min 10 --faults "0:slow@rank=1,step=2,arg=0.5" -- $(job s --steps 10) > "$T/s.log" 2>&1 ||
  { tail -20 "$T/s.log"; fail "the run with a slow rank"; }
grep "straggler:" "$T/s.log" || fail "the slow rank was not flagged"
python3 -c "
import json, sys
r = json.load(open('$T/s/supervisor/report.json'))
assert [s['rank'] for s in r['stragglers']] == [1], r['stragglers']
" || fail "the straggler is not rank 1"
echo "straggler run: $((SECONDS - t0)) s"

# A hang inside a collective caught by the ranks' own watchdog (2 s, long before the supervisor's
# 30 s): the job ends with the watchdog's exit code, the supervisor records a collective hang from
# the rank's watchdog_abort event, resumes from the checkpoint, and the run completes.
t0=$SECONDS
# shellcheck disable=SC2046
ZAYA_COLLECTIVE_TIMEOUT=2 timeout 300 "$zaya" supervise "${sup[@]}" --health off --hang-min 30 \
  --faults "0:hang@rank=1,step=3,section=collective" -- $(job w --steps 6) > "$T/w.log" 2>&1 ||
  { tail -20 "$T/w.log"; fail "the run whose watchdog fired"; }
python3 - "$T/w/supervisor/report.json" <<'PY' || { tail -20 "$T/w.log"; fail "the watchdog run's report"; }
import json, sys
r = json.load(open(sys.argv[1]))
f = r["failure_list"]
assert r["result"] == "completed" and len(f) == 1, r
assert f[0]["cause"] == "collective_hang", f
assert 0 <= f[0]["detect_s"] <= 8, f
print(f"watchdog under supervision: collective hang detected in {f[0]['detect_s']:.2f} s, "
      f"recovered in {f[0]['recover_s']:.2f} s")
PY
echo "watchdog run: $((SECONDS - t0)) s"

# NaN at step 3, and again at step 3 after the relaunch: the numerics code.
# shellcheck disable=SC2046
timeout 300 "$zaya" supervise "${sup[@]}" --health off \
  --hang-min 3 --faults "0:nan@rank=1,step=3 1:nan@rank=1,step=3" -- $(job n --steps 6) > "$T/n.log" 2>&1
rc=$?
grep "^supervise:" "$T/n.log" | tail -3
[ "$rc" = 3 ] || fail "a repeating NaN ended with exit $rc, expected 3"

# Killed at the first step after every resume: no progress, the give-up code.
# shellcheck disable=SC2046
timeout 300 "$zaya" supervise "${sup[@]}" --health off --hang-min 3 --no-progress 2 \
  --faults "0:kill@rank=0,step=+1 1:kill@rank=0,step=+1 2:kill@rank=0,step=+1 3:kill@rank=0,step=+1" \
  -- $(job p --steps 6) > "$T/p.log" 2>&1
rc=$?
grep "^supervise:" "$T/p.log" | tail -3
[ "$rc" = 4 ] || fail "a relaunch loop without progress ended with exit $rc, expected 4"
echo "total: $((SECONDS - start)) s"
echo "supervise_campaign: ok"
