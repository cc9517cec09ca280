#!/bin/bash
# `zaya bench infer` argument checks that need no GPU: bad --attn-chunks, --router-clusters,
# --router-spread, --norm-early, --oproj-early and --copy-gbs values are refused with a message naming the
# option, and --write-config writes the benchmarked shape's config.json.
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
refused "--attn-chunks: 17 is not a multiple of 16" --attn-chunks 0,17
refused "--attn-chunks" --attn-chunks 512
refused "--router-clusters" --router-clusters 0,3
refused "--router-spread" --router-spread 2
refused "--norm-early" --norm-early 0,2
refused "--oproj-early" --oproj-early 3
refused "--copy-gbs" --copy-gbs -1
if "$zaya" version | grep -q "cuda: yes" && ! "$zaya" version | grep -q "decode trace"; then
  # A build without -DZAYA_DECODE_TRACE=ON (the default, as in CI) refuses --trace up front, naming
  # the option to configure.
  refused "-DZAYA_DECODE_TRACE=ON" --trace
fi
if ! "$zaya" version | grep -q "cuda: yes"; then
  echo "PASS (argument checks; --write-config needs the CUDA build)"
  exit 0
fi
"$zaya" bench infer --preset zaya1-base --layers 2 --attn-chunks 0,64 --attn-pipes 1,4 --router-clusters 0,8 --fuse-norms 1,0 --router-stage 1,0 --router-spread 0,1 --attn-stage 0,1 --fold-qkv-norm 0,1 --norm-early 0,1 --oproj-early 0,1 --gemv-stage-x 0,1 --attn-cluster 0,1 --router-regs 0,1 --fused-ends 0,1 --fuse-cca 0,1 --fuse-experts 0,1 --attn-exact 0,1 --evict-first 0,1 --lm-head-l2 0,8 --router-norm 0,1 --expert-stage-x 0,1 --router-stage-x 0,1 --router-down-in-norm 0,1 --qkv-norm-gemv 0,1 --lm-head-stage-x 0,1 --lm-head-no-l1 0,1 --ablate \
  --write-config "$tmp/cfg.json" >/dev/null || fail "--write-config exited non-zero"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['num_hidden_layers']==2, c" \
  "$tmp/cfg.json" || fail "config.json does not hold the 2-layer shape"
echo "PASS"
