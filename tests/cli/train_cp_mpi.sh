#!/bin/bash
# Context parallelism under mpirun (CPU ranks over MPI): every sequence cut into 2·cp chunks, rank
# i of a group holding chunks i and 2cp−1−i, against the one-process run of the same global batch
# (12 sequences per step, two phases at seq_len 24 and 32):
#  - the forward/backward unit checks under -np 2, 3, 4 (zaya_tests ContextParallelMpi.*: loss
#    and every parameter gradient against one process, one-token documents at chunk boundaries,
#    a detached halo caught, bad sequence lengths refused);
#  - training with cp = 2 (-np 2), dp 2 × cp 2 (-np 4), cp = 4 (-np 4), and cp = 2 in the second
#    phase only (-np 2: dp 2 then dp 1): per-step losses and final weights within fp32
#    reduction-order noise of one process (bounds below); two cp = 2 runs bit-identical;
#  - bad input: cp not dividing the world size, seq_len not divisible by 2·cp.
# Usage: bash train_cp_mpi.sh <zaya-binary> <source-dir>   (skips, exit 0, without MPI)
set -u
zaya="$1"
src="$2"
tests_bin="$(dirname "$zaya")/zaya_tests"
# shellcheck source=tests/cli/lib/tiny_run.sh
source "$src/tests/cli/lib/tiny_run.sh"
mpi_script_setup
mpi() { timeout 300 mpirun -np "$1" --oversubscribe "${@:2}"; }

if [ -x "$tests_bin" ]; then
  for np in 2 3 4; do
    mpi "$np" "$tests_bin" --gtest_filter='ContextParallelMpi.*' > "$T/unit$np.log" 2>&1 ||
      { tail -30 "$T/unit$np.log"; fail "ContextParallelMpi under -np $np"; }
    grep -q "PASSED.*3 tests" "$T/unit$np.log" || { cat "$T/unit$np.log"; fail "unit -np $np ran no tests"; }
    grep "context parallel" "$T/unit$np.log" | sort -u
  done
fi

tiny_run_data "$T/ds" "$src" || fail "data prepare"
tiny_run_toml "$T/ds" 20 10 0 cpu > "$T/run.toml"
run() {  # run NAME NP [overrides...]: trains into $T/NAME (NP = 0: no launcher)
  local name="$1" np="$2" cmd=("$zaya" train --config "$T/run.toml" --out "$T/$1" --quiet "${@:3}")
  if [ "$np" = 0 ]; then "${cmd[@]}" > "$T/$name.log" 2>&1
  else mpi "$np" "${cmd[@]}" > "$T/$name.log" 2>&1; fi || { tail -30 "$T/$name.log"; fail "$name"; }
}
start=$SECONDS
run ref 0
run cp2 2 --parallel.cp=2
run cp2b 2 --parallel.cp=2
run dp2cp2 4 --parallel.cp=2
run cp4 4 --parallel.cp=4
run phasecp 2 --phase.1.cp=2
echo "six training runs: $((SECONDS - start)) s"

python3 - "$T" "$src" <<'PY' || fail "equivalence"
import json, sys
T = sys.argv[1]
sys.path.insert(0, sys.argv[2] + "/tests/cli/lib")
from run_files import losses as run_losses, weights as run_weights
def losses(n):
    return run_losses(f"{T}/{n}")
def weights(n):
    return run_weights(f"{T}/{n}")
ref, wref = losses("ref"), weights("ref")
assert len(ref) == 20
def dl(n):
    m = losses(n)
    assert len(m) == 20, n
    assert all(a["tokens"] == b["tokens"] for a, b in zip(ref, m)), (n, "token counts differ")
    return max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, m))
def dw(n):
    w = weights(n); worst = 0.0
    for k, v in wref.items():
        worst = max(worst, max(abs(x - y) for x, y in zip(v, w[k])))
    return worst
a, b = losses("cp2"), losses("cp2b")
assert [x["loss"] for x in a] == [x["loss"] for x in b], "two cp = 2 runs differ"
assert open(f"{T}/cp2/model/model.safetensors", "rb").read() == \
       open(f"{T}/cp2b/model/model.safetensors", "rb").read(), "two cp = 2 runs' weights differ"
for n in ["cp2", "dp2cp2", "cp4", "phasecp"]:
    print(f"{n}: max relative |loss - one process| = {dl(n):.3e}, "
          f"max |weight - one process| = {dw(n):.3e}")
    assert dl(n) <= 1e-6, (n, dl(n))
    assert dw(n) <= 1e-5, (n, dw(n))
PY

# Bad input, each refused with the field named.
mpi 2 "$zaya" train --config "$T/run.toml" --out "$T/bad1" --quiet --parallel.cp=4 > "$T/bad1.log" 2>&1 &&
  fail "cp = 4 on 2 ranks was accepted"
grep -q "parallel.cp = 4 does not divide the world size 2" "$T/bad1.log" || { cat "$T/bad1.log"; fail "bad1 message"; }
"$zaya" train --config "$T/run.toml" --out "$T/bad2" --quiet --parallel.cp=5 > "$T/bad2.log" 2>&1 &&
  fail "seq_len 24 with cp = 5 was accepted"
grep -q "phase.0.seq_len = 24 is not divisible by 2·cp = 10" "$T/bad2.log" || { cat "$T/bad2.log"; fail "bad2 message"; }
[ ! -e "$T/bad2/checkpoints" ] || fail "a refused run left checkpoints"
echo "OK: context parallelism"
