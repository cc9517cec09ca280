#!/usr/bin/env bash
# `zaya eval` picks its decoder at run time: --device cpu is the default (the same output to the
# digit), windows (--seq) score each window alone, and an unknown device or empty input is refused.
# The GPU side is tests/cli/device_cuda_without_gpu.sh (refusal) and tests/gpu (scores).
# usage: bash eval_device.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
M="$SRC/tests/fixtures/parity/cfg_a"
echo "189 19 95 353 16 272 7 3 99 41 5" > "$T/ids"

default=$("$ZAYA" eval --model "$M" --ids-file "$T/ids")
cpu=$("$ZAYA" eval --model "$M" --ids-file "$T/ids" --device cpu)
[ "$default" = "$cpu" ] || fail "--device cpu differs from the default: $cpu vs $default"
python3 - "$default" <<'PY' || fail "unexpected eval output: $default"
import json, math, sys
r = json.loads(sys.argv[1])
assert r["tokens"] == 11 and r["scored"] == 10, r
assert math.isfinite(r["loss"]) and r["loss"] > 0 and abs(r["perplexity"] - math.exp(r["loss"])) < 1e-3 * r["perplexity"], r
PY
# Windows of 4: 4 + 4 + 3 tokens, 3 + 3 + 2 positions scored.
win=$("$ZAYA" eval --model "$M" --ids-file "$T/ids" --seq 4 --device cpu)
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["scored"] == 8, r' "$win" \
  || fail "--seq 4: $win"

if "$ZAYA" eval --model "$M" --ids-file "$T/ids" --device tpu > "$T/out" 2> "$T/err"; then
  fail "--device tpu accepted"
fi
grep -q "device" "$T/err" || { cat "$T/err"; fail "--device tpu: no reason given"; }
echo "7" > "$T/one"
if "$ZAYA" eval --model "$M" --ids-file "$T/one" > "$T/out" 2> "$T/err"; then
  fail "a single token accepted"
fi
grep -q "at least 2 tokens" "$T/err" || { cat "$T/err"; fail "one token: no reason given"; }
"$ZAYA" eval --help | grep -q -- "--device" || fail "eval --help does not list --device"
echo "eval: ok"
