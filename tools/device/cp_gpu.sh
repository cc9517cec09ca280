#!/bin/bash
# The 32K context phase on one GPU (issue: context parallelism), sourced as tools/device/ab_step.sh's
# EXTRA (which defines Z, LOGS and note()) or standalone from the repository root:
#     Z=build/zaya bash tools/device/cp_gpu.sh          (about 2 minutes on an H100)
# 1. `zaya bench train --preset zaya1-base --layers 8 --batch 1 --seq 32768`, with activation
#    recomputation and without: tokens/s, model TFLOP/s and the device memory of the 32K step at
#    cp = 1.
cp_gpu_main() {
  local Z_="${Z:-build/zaya}" root
  root="$(pwd)"
  local out="${OUT:-$root/cp_out}"
  mkdir -p "$out"
  local logs="${LOGS:-$out/cp_logs}"
  mkdir -p "$logs"
  if ! declare -F note >/dev/null; then note() { echo "$*" | tee -a "$out/cp_summary.txt"; }; fi
  local name flags log
  for name in recompute plain; do
    flags=()
    [ "$name" = recompute ] && flags=(--recompute)
    log="$logs/bench_32k_$name.log"
    timeout -k 5 240 "$Z_" bench train --preset zaya1-base --layers 8 --batch 1 --seq 32768 \
      --steps 4 --warmup 2 --no-profile "${flags[@]}" --json "$logs/bench_32k_$name.json" \
      >"$log" 2>&1
    note "bench train 32K cp=1 ($name): exit $? | $(grep -iE "^(tokens/s|model TFLOP|step|memory|device memory|arena|peak)" "$log" | tr '\n' ' ' | cut -c1-400)"
  done
}
cp_gpu_main
