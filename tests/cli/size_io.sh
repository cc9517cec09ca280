#!/usr/bin/env bash
# `zaya size io`: the storage formulas with ZAYA1's figures (G = s = P = 4096, b = 4, t = 2.5 s:
# 6,553.6·σ IOPS; break-even 0.234·σ s at 70,000 IOPS), exit 3 when the storage is too slow, and
# named errors for bad values.
# usage: bash size_io.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
args=(--global-batch 4096 --seq 4096 --bytes-per-token 4 --page 4096 --step-time 2.5 --iops 70000)

"$ZAYA" size io "${args[@]}" --json "$T/a.json" > "$T/a.out" || { cat "$T/a.out"; fail "io σ=1"; }
"$ZAYA" size io "${args[@]}" --scatter 4 --json "$T/b.json" > "$T/b.out" || fail "io σ=4"
grep -q "required IOPS *6553.6" "$T/a.out" || { cat "$T/a.out"; fail "expected 6553.6 IOPS"; }
python3 - "$T/a.json" "$T/b.json" <<'PYEOF'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
assert a["schema"] == "zaya.size_io/1" and a["result"] == "pass"
assert abs(a["required_iops"] - 6553.6) < 1e-9, a
assert abs(a["break_even_step_s"] - 0.234) < 0.0005, a
assert abs(b["required_iops"] - 4 * 6553.6) < 1e-9, b
assert abs(b["break_even_step_s"] - 4 * 16384 / 70000) < 1e-12, b
PYEOF

# 70,000 IOPS cannot feed a 0.1 s step (163,840 IOPS needed): exit 3.
set +e
"$ZAYA" size io --global-batch 4096 --seq 4096 --bytes-per-token 4 --page 4096 --step-time 0.1 \
  --iops 70000 > "$T/c.out" 2>&1
rc=$?
set -e
[ $rc -eq 3 ] || { cat "$T/c.out"; fail "expected exit 3, got $rc"; }
grep -q "result: fail" "$T/c.out" || fail "no failure reported"

set +e
"$ZAYA" size io "${args[@]}" --scatter 0.5 > "$T/d.out" 2>&1; rc=$?
set -e
[ $rc -eq 1 ] && grep -q -- "--scatter must be at least 1" "$T/d.out" || { cat "$T/d.out"; fail "bad scatter"; }
set +e
"$ZAYA" size io --global-batch 4096 --seq 4096 > "$T/e.out" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] && grep -q -- "--bytes-per-token is required" "$T/e.out" || { cat "$T/e.out"; fail "missing flag"; }
echo "ok"
