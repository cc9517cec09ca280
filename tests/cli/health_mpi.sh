#!/bin/bash
# `zaya health` (bench/health.h): one process and under `mpirun -np 2`, passing on this machine
# with the default thresholds (each rank's table row, the all-reduce across both ranks, JSON), and
# failing with an impossible GEMM threshold: status 6, one line per failed check naming the rank,
# host, check, measurement and threshold; an unwritable --dir fails its check. Each run is quick.
# Usage: bash health_mpi.sh <zaya-binary> <source-dir>   (the MPI part skips without MPI)
set -u
zaya="$1"
src="$2"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
unset ZAYA_SUPERVISOR ZAYA_FAULTS ZAYA_COLLECTIVE_TIMEOUT

# One process: passes, and --json is the zaya.health/1 document.
t0=$(date +%s.%N)
"$zaya" health --dir "$T/ck" --min-free-gb 0.001 --json > "$T/one.json" 2> "$T/one.err" ||
  { cat "$T/one.json" "$T/one.err"; fail "health on one process failed"; }
t1=$(date +%s.%N)
python3 - "$T/one.json" <<'PY' || fail "one-process JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["schema"] == "zaya.health/1" and d["ok"], d
r = d["ranks"]
assert len(r) == 1 and r[0]["rank"] == 0, r
names = [c["name"] for c in r[0]["checks"]]
assert names == ["gemm", "memory", "all_reduce", "checkpoint_dir", "free_space"], names
assert all(c["pass"] for c in r[0]["checks"]), r
g = r[0]["checks"][0]
assert g["measured"] > g["threshold"] > 0 and g["unit"] == "GFLOP/s", g
PY
echo "one process: passed in $(python3 -c "print(f'{$t1 - $t0:.2f}')") s"
# A --dir that cannot be created: its check fails, status 6.
touch "$T/file"
"$zaya" health --dir "$T/file/sub" > "$T/nodir.out" 2> "$T/nodir.err"
rc=$?
[ $rc -eq 6 ] || { cat "$T/nodir.out" "$T/nodir.err"; fail "an unwritable --dir: status $rc, expected 6"; }
grep -q "rank 0 on .*: checkpoint_dir failed: " "$T/nodir.err" || { cat "$T/nodir.err"; fail "no checkpoint_dir line"; }

if ! "$zaya" version | grep -q "mpi: yes" || ! command -v mpirun > /dev/null; then
  echo "PASS (MPI part skipped: no MPI)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
mpi() { timeout 60 mpirun -np 2 --oversubscribe "$@"; }

t0=$SECONDS
mpi "$zaya" health --dir "$T/ck" --min-free-gb 0.001 > "$T/two.out" 2> "$T/two.err" ||
  { cat "$T/two.out" "$T/two.err"; fail "health under mpirun -np 2 failed"; }
for r in 0 1; do
  for c in gemm memory all_reduce checkpoint_dir free_space; do
    grep -Eq "^$r +[^ ]+ +$c .* yes " "$T/two.out" || { cat "$T/two.out"; fail "rank $r: no passing $c row"; }
  done
done
grep -q "over 2 ranks (mpi)" "$T/two.out" || { cat "$T/two.out"; fail "the all-reduce did not span both ranks"; }
[ "$(grep -c 'gemm' "$T/two.out")" = 2 ] || { cat "$T/two.out"; fail "the table is not printed once (by rank 0)"; }
echo "mpirun -np 2: passed in $((SECONDS - t0)) s"

# An impossible GEMM threshold: status 6 from the job, a line per rank.
mpi "$zaya" health --dir "$T/ck" --min-free-gb 0.001 --min-gemm-gflops 1e12 > "$T/bad.out" 2> "$T/bad.err"
rc=$?
[ $rc -eq 6 ] || { cat "$T/bad.out" "$T/bad.err"; fail "an impossible threshold: status $rc, expected 6"; }
for r in 0 1; do
  grep -Eq "zaya health: rank $r on [^ ]+: gemm failed: measured [0-9.e+]+ GFLOP/s, threshold >= 1e\+12 GFLOP/s" "$T/bad.err" ||
    { cat "$T/bad.err"; fail "rank $r: no failure line naming the check, measurement and threshold"; }
done
[ "$(grep -c 'failed' "$T/bad.err")" = 2 ] || { cat "$T/bad.err"; fail "other checks failed too"; }
echo "PASS"
