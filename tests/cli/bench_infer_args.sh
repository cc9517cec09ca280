#!/bin/bash
# `zaya bench infer` argument checks that need no GPU: a bad --copy-gbs value and the removed
# decode variant flags are refused with a message naming the option, and --write-config writes the
# benchmarked shape's config.json.
# Usage: bash bench_infer_args.sh <zaya-binary> <source-dir>
set -u
zaya="$1"
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# refused PATTERN ARGS...: `zaya bench infer --layers 1 ARGS` must exit non-zero with a message
# holding PATTERN.
refused() {
  local pattern="$1" out
  shift
  out="$("$zaya" bench infer --layers 1 "$@" 2>&1)" && fail "$* accepted"
  echo "$out" | grep -q -- "$pattern" || fail "$*: message does not hold '$pattern': $out"
}
refused "--copy-gbs" --copy-gbs -1
# The decode variant flags were removed with the knobs behind them (docs/PERFORMANCE.md).
refused "--attn-chunks" --attn-chunks 0,16
refused "--fuse-norms" --fuse-norms 1,0
if "$zaya" version | grep -q "cuda: yes" && ! "$zaya" version | grep -q "decode trace"; then
  # A build without -DZAYA_DECODE_TRACE=ON (the default, as in CI) refuses --trace up front, naming
  # the option to configure.
  refused "-DZAYA_DECODE_TRACE=ON" --trace
fi
if ! "$zaya" version | grep -q "cuda: yes"; then
  echo "PASS (argument checks; --write-config needs the CUDA build)"
  exit 0
fi
"$zaya" bench infer --preset zaya1-base --layers 2 --ablate --write-config "$tmp/cfg.json" >/dev/null || fail "--write-config exited non-zero"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['num_hidden_layers']==2, c" \
  "$tmp/cfg.json" || fail "config.json does not hold the 2-layer shape"
echo "PASS"
