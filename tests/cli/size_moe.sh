#!/usr/bin/env bash
# `zaya size moe` and `zaya size propose` for ZAYA1's budget (8.3B total, 0.76B active): the sweep
# table, JSON and SVG Pareto plot with ZAYA1's 16 × 2048 top-1 marked as the reference; proposals
# within budget; bad budgets rejected with named flags.
# usage: bash size_moe.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$ZAYA" size moe --total 8.3B --active 0.76B --hardware mi300x --experts 8,16,32,64 --top-k 1,2,4 \
  --svg "$T/moe.svg" --json "$T/moe.json" > "$T/moe.out" 2>&1 || { cat "$T/moe.out"; fail "moe"; }
grep -q "E16 I2048 k1" "$T/moe.out" || { cat "$T/moe.out"; fail "ZAYA1 point missing"; }
grep -q "<svg" "$T/moe.svg" || fail "no SVG written"
grep -q "reference E16×2048 top-1" "$T/moe.svg" || fail "reference not in the plot"
python3 - "$T/moe.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "zaya.size_moe/1"
cs = j["candidates"]
ref = [c for c in cs if c["reference"]]
assert len(ref) == 1 and ref[0]["num_experts"] == 16 and ref[0]["moe_intermediate_size"] == 2048
for c in cs:
    assert abs(c["params_total"] - 8.3e9) <= 0.1 * 8.3e9, c
    assert abs(c["params_active"] - 0.76e9) <= 0.1 * 0.76e9, c
    assert c["train_tokens_per_s_per_gpu"] > 0 and c["decode_ms_per_token"] > 0
assert any(c["pareto"] for c in cs)
t = [c["train_tokens_per_s_per_gpu"] for c in cs]
assert t == sorted(t, reverse=True)
PYEOF

"$ZAYA" size propose --total 8.3B --active 0.76B --hardware h200 --top 3 --json "$T/p.json" \
  > "$T/p.out" 2>&1 || { cat "$T/p.out"; fail "propose"; }
python3 - "$T/p.json" <<'PYEOF'
import json, sys
cs = json.load(open(sys.argv[1]))["candidates"]
assert 1 <= len(cs) <= 3, len(cs)
for c in cs:
    assert c["fails"] == 0 and c["within_budget"], c
    assert c["moe_intermediate_size"] % 128 == 0
PYEOF

expect_error() {
  local code=$1 msg=$2; shift 2
  set +e
  "$ZAYA" size "$@" > "$T/err.out" 2>&1
  local rc=$?
  set -e
  [ $rc -eq "$code" ] || { cat "$T/err.out"; fail "size $* exited $rc, expected $code"; }
  grep -qF -- "$msg" "$T/err.out" || { cat "$T/err.out"; fail "size $*: no '$msg'"; }
}
expect_error 1 "--total: '8.3Q' has an unknown suffix" moe --total 8.3Q --active 1B --hardware h200
expect_error 1 "--active (9e+09) must not exceed --total (8.3e+09)" moe --total 8.3B --active 9B --hardware h200
expect_error 1 "no candidate within" propose --total 50M --active 45M --hardware h200
expect_error 1 "unknown hardware 'v100'" propose --total 8.3B --active 0.76B --hardware v100
echo "ok"
