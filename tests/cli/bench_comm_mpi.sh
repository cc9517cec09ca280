#!/bin/bash
# `zaya bench comm --backend mpi` under mpirun with 2 and 3 ranks (3: odd counts exercise the
# rounding of per-rank blocks), every op, in- and out-of-place, float and bfloat16, over a small
# size range: the JSON must list every op with zero wrong elements and consistent bandwidths.
# Also: bad arguments fail with a clear message and write no output file.
# Usage: bash bench_comm_mpi.sh <zaya-binary> <source-dir>   (skips, exit 0, without MPI)
set -u
zaya="$1"
if ! "$zaya" version | grep -q "mpi: yes"; then
  echo "SKIP: zaya built without MPI"
  exit 0
fi
if ! command -v mpirun >/dev/null; then
  echo "SKIP: no mpirun"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for np in 2 3; do
  json="$tmp/comm$np.json"
  if ! mpirun -np "$np" --oversubscribe "$zaya" bench comm --backend mpi -b 8 -e 64K -f 4 \
      --ops all --dtype float,bfloat16 --inplace both -n 3 -w 1 --sweep-ranks \
      --json "$json" --csv "$tmp/comm$np.csv" --svg "$tmp/comm$np.svg" >"$tmp/out$np.txt" 2>&1; then
    cat "$tmp/out$np.txt"
    fail "mpirun -np $np bench comm exited non-zero"
  fi
  python3 - "$json" "$np" <<'PY' || fail "JSON check for -np $np"
import json, sys
doc = json.load(open(sys.argv[1]))
np_ = int(sys.argv[2])
rows = doc["results"]
assert doc["schema"] == "zaya.bench.comm/1" and doc["world_size"] == np_, doc
ops = {r["name"] for r in rows}
want = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "sendrecv"}
assert ops == want, ops
bad = [r for r in rows if r["wrong"] != 0]
assert not bad, bad[:3]
factor = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
          "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
          "broadcast": lambda n: 1.0, "sendrecv": lambda n: 1.0}
for r in rows:
    assert r["time_us"] > 0, r
    alg = r["size"] / (r["time_us"] * 1e-6) / 1e9
    assert abs(r["algbw"] - alg) <= 1e-6 * alg + 1e-12, r
    assert abs(r["busbw"] - alg * factor[r["name"]](r["ranks"])) <= 1e-6 * alg + 1e-12, r
assert any(r["inplace"] for r in rows) and any(not r["inplace"] for r in rows)
assert {r["dtype"] for r in rows} == {"float", "bfloat16"}
ranks = {r["ranks"] for r in rows}
assert ranks == ({2, 3} if np_ == 3 else {2}), ranks   # --sweep-ranks adds first-2 on 3 ranks
print(f"ok: -np {np_}: {len(rows)} rows, 0 wrong")
PY
  head -1 "$tmp/comm$np.csv" | grep -q "^name,group,ranks," || fail "CSV header"
  grep -q "<svg" "$tmp/comm$np.svg" || fail "SVG not written"
  grep -q "all_reduce" "$tmp/out$np.txt" || fail "no table on stdout"
done

# Bad arguments: non-zero exit, a message naming the flag, no output written.
out="$(mpirun -np 2 --oversubscribe "$zaya" bench comm --backend mpi -e 12Q --json "$tmp/bad.json" 2>&1)"
[ $? -ne 0 ] || fail "bad -e accepted"
echo "$out" | grep -q -- "-e/--maxbytes" || fail "message does not name -e/--maxbytes: $out"
[ ! -e "$tmp/bad.json" ] || fail "output written despite bad arguments"
out="$("$zaya" bench comm --ops all_reduce,allgather 2>&1)"
[ $? -ne 0 ] || fail "bad --ops accepted"
echo "$out" | grep -q "allgather" || fail "message does not name the bad op: $out"
out="$("$zaya" bench comm --json /nonexistent-dir/x.json 2>&1)"
[ $? -ne 0 ] || fail "unwritable --json accepted"
echo "$out" | grep -q -- "--json" || fail "message does not name --json: $out"
echo "PASS"
