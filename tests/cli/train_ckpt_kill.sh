#!/bin/bash
# kill -9 of a random rank at a random moment of a data-parallel run that saves a checkpoint every
# step asynchronously (mpirun -np 2, CPU ranks), KILL_TRIALS times (default 20; seed KILL_SEED).
# The moment is drawn between the first save starting and the last save's commit, as timed on an
# uninterrupted run, so the kills hit the saves rather than the start-up:
#  - every committed checkpoint the killed run left verifies (`--resume auto` skips none);
#  - `--resume auto` continues from the newest one (or starts fresh when the kill came before the
#    first commit) and ends with the uninterrupted run's final weights and losses, bit for bit;
#  - an interrupted save leaves only its staging directory, which the resumed job removes.
# Prints how many kills landed with a save in flight (a staging directory left behind).
# Usage: bash train_ckpt_kill.sh <zaya-binary> <source-dir>   (skips, exit 0, without MPI)
set -u
zaya="$1"
src="$2"
# shellcheck source=tests/cli/lib/tiny_run.sh
source "$src/tests/cli/lib/tiny_run.sh"
mpi_script_setup
trap 'pkill -9 -f -- "--out $T/" 2>/dev/null; rm -rf "$T"' EXIT
tiny_run_data "$T/ds" "$src" || fail "data prepare"
tiny_run_toml "$T/ds" 10 4 1 > "$T/run.toml"   # a checkpoint every step
trials="${KILL_TRIALS:-20}"
RANDOM="${KILL_SEED:-2026}"
train() {  # train NAME ARGS... (foreground, -np 2)
  local name="$1"
  shift
  timeout 300 mpirun -np 2 --oversubscribe "$zaya" train --config "$T/run.toml" --out "$T/$name" \
    --quiet "$@"
}

now() { date +%s.%N; }
ckpt_started() {  # ckpt_started DIR: a save of DIR's run has begun (staging or committed)
  compgen -G "$1/checkpoints/step-*" > /dev/null || compgen -G "$1/checkpoints/.tmp-step-*" > /dev/null
}
# The uninterrupted run, timed from its first save starting to its last save's commit: the kills
# below land at random moments of that window, so they hit the asynchronous saves rather than the
# start-up or the teardown.
t0=$(now)
train ref > "$T/ref.log" 2>&1 &
rpid=$!
t_first="" t_last=""
while kill -0 "$rpid" 2>/dev/null; do
  [ -z "$t_first" ] && ckpt_started "$T/ref" && t_first=$(now)
  [ -z "$t_last" ] && [ -d "$T/ref/checkpoints/step-00000010" ] && t_last=$(now)
  sleep 0.01
done
wait "$rpid" || { tail -20 "$T/ref.log"; fail "the uninterrupted run"; }
t_end=$(now)
[ -n "$t_first" ] || fail "the uninterrupted run never started a checkpoint"
[ -n "$t_last" ] || t_last=$t_end
window=$(awk -v a="$t_first" -v b="$t_last" 'BEGIN { printf "%.3f", b - a }')
printf 'uninterrupted run: %.2f s, from its first save starting to its last commit %s s\n' \
  "$(awk -v a="$t0" -v b="$t_end" 'BEGIN { print b - a }')" "$window"

resumed=0 fresh=0 midsave=0 finished=0
for ((i = 1; i <= trials; i++)); do
  out="$T/k$i"
  timeout 300 mpirun -np 2 --oversubscribe "$zaya" train --config "$T/run.toml" --out "$out" \
    --quiet > "$T/k$i.log" 2>&1 &
  tpid=$!
  # Wait for the first save to start, then a random moment of the uninterrupted run's window.
  w=0
  while ! ckpt_started "$out" && kill -0 "$tpid" 2>/dev/null && [ $w -lt 6000 ]; do
    sleep 0.01
    w=$((w + 1))
  done
  sleep "$(awk -v r="$RANDOM" -v s="$window" 'BEGIN { printf "%.3f", s * (r % 1000) / 1000 }')"
  mp=$(pgrep -P "$tpid" | head -1)
  ranks=($( [ -n "$mp" ] && pgrep -P "$mp"))
  if [ ${#ranks[@]} -gt 0 ]; then
    victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
    kill -9 "$victim" 2>/dev/null
  fi
  wait "$tpid"
  rc=$?
  if [ "$rc" = 0 ]; then finished=$((finished + 1)); fi
  ls -a "$out/checkpoints" 2>/dev/null | grep -q '^\.tmp-step-' && midsave=$((midsave + 1))
  # Resume to the end.
  train "k$i" --resume auto > "$T/r$i.log" 2>&1 || { tail -20 "$T/r$i.log"; fail "trial $i: the resumed run"; }
  if grep -q "resume: skipping" "$T/r$i.log"; then
    grep "resume: skipping" "$T/r$i.log"
    fail "trial $i: the killed run left a committed checkpoint that does not verify"
  fi
  if grep -q "resuming from" "$T/r$i.log"; then resumed=$((resumed + 1)); else fresh=$((fresh + 1)); fi
  ls -a "$out/checkpoints" | grep -q '^\.tmp-step-' && fail "trial $i: a staging directory survived the resumed run"
  cmp -s "$T/ref/model/model.safetensors" "$out/model/model.safetensors" ||
    fail "trial $i: the final weights differ from the uninterrupted run's"
  python3 - "$T/ref/metrics.jsonl" "$out/metrics.jsonl" <<'PY' || fail "trial $i: losses differ"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert len(a) == 10 and a == b, (a, b)
PY
done
echo "kill trials: $trials (rc 0 before the kill: $finished); resumed from a checkpoint: $resumed," \
  "fresh: $fresh; a save in flight when killed: $midsave; every resumed run bit-identical"
# Kills land after the first save has begun, so most trials must resume from a checkpoint (a kill
# during the first save itself, before its commit, restarts fresh).
[ "$resumed" -ge $((trials / 2)) ] || fail "only $resumed of $trials trials resumed from a checkpoint"
[ $((trials - finished)) -ge $((trials / 2)) ] || fail "only $((trials - finished)) of $trials kills landed before the run ended"
echo "train_ckpt_kill: ok"
