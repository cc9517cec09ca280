#!/usr/bin/env bash
# `--device cuda` where no GPU can be used (the CI machine: a CUDA build without a device, or a
# build without CUDA): generate, eval, train and the GPU benchmarks stop before any output or work
# with a message that says so, and exit non-zero. Skipped (passes) when a GPU is usable.
# usage: bash device_cuda_without_gpu.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is usable here: nothing to check"
  exit 0
fi
expect_refusal() {  # NAME CMD...: non-zero exit, a reason on stderr, nothing on stdout
  local name=$1
  shift
  if "$@" >"$T/$name.out" 2>"$T/$name.err"; then fail "$name succeeded without a GPU"; fi
  grep -Eq "no CUDA device|built without CUDA" "$T/$name.err" || {
    cat "$T/$name.err"
    fail "$name: no reason given"
  }
  [ ! -s "$T/$name.out" ] || { cat "$T/$name.out"; fail "$name printed output before failing"; }
}
expect_refusal generate "$ZAYA" generate --model "$SRC/tests/fixtures/parity/cfg_a" --ids "1 2 3" \
  -n 3 --device cuda
echo "1 2 3 4 5 6" > "$T/ids"
expect_refusal eval "$ZAYA" eval --model "$SRC/tests/fixtures/parity/cfg_a" --ids-file "$T/ids" \
  --device cuda
expect_refusal infer "$ZAYA" bench infer --preset tiny
expect_refusal bench_train "$ZAYA" bench train --preset tiny --layers 1 --batch 1 --seq 16
expect_refusal train "$ZAYA" train --device cuda --steps 1 --out "$T/run"
[ ! -e "$T/run/checkpoints" ] || fail "train left a checkpoint directory"
echo "ok"
