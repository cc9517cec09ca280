#!/bin/bash
# Decode A/B in one device call (3–6 minutes), for the lead to run on the H200 from the repository
# root (carry .debs, and the base tree if one is named, with the call):
#     BASE=path/to/other/tree bash tools/device/decode_ab.sh
# 1. builds `zaya` from this tree ("new": default configuration, sm_90a, Ninja; with the GPU tests
#    when TESTS=1, which then run: `ctest -L gpu`), from $BASE if set ("base": another source tree,
#    e.g. a `git archive` of the commit before the change), and with -DZAYA_DECODE_TRACE=ON when
#    TRACE=1 ("trace");
# 2. times `zaya bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64` with the new
#    and base binaries, alternating, ROUNDS (3) times each: the change's effect on the step, with
#    the GPU's drift shared by both sides;
# 3. with the new binary: the ablation (the step without each op class); with the trace binary: the same run with --trace (the
#    graph step kernel by kernel).
# 4. with SASS=1: the decode kernels' SASS from the new binary (cuobjdump), sass_decode.txt.gz.
# 5. with NCU=1: Nsight Compute's warp stall reasons of the decode kernels (each kernel alone, with
#    caches flushed and not), and of whole decode graphs (kernels overlapping as they run):
#    ncu_stalls_{flush,warm}.csv.gz, ncu_graph.csv.gz, summarised by tools/ncu_decode_stalls.py.
# Results in $OUT (default ./decode_ab_out): summary.txt, bench_infer_new.json and logs.tgz (every
# log).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/decode_ab_out}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
# Every log goes into one archive at the end ($OUT/logs.tgz): the device tool returns few files.
LOGS="$OUT/logs"
mkdir -p "$LOGS"
trap 'tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"' EXIT
note() { echo "$*" | tee -a "$summary"; }
note "# decode_ab on $(hostname) at $(date -u +%FT%TZ), commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)${BASE:+, base $(cat "$BASE/COMMIT" 2>/dev/null || echo "$BASE")}"
if compgen -G ".debs/*.deb" >/dev/null; then
  # shellcheck source=tools/device/deps.sh
  source tools/device/deps.sh
fi
build() {  # build NAME SOURCE TRACE(ON|OFF) TESTS(ON|OFF)
  local t0=$SECONDS targets=zaya
  [ "$4" = ON ] && targets="zaya zaya_gpu_tests"
  # shellcheck disable=SC2086
  cmake -S "$2" -B "$root/build-ab-$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=OFF -DZAYA_TESTS="$4" -DZAYA_DECODE_TRACE="$3" \
    >"$LOGS/configure_$1.log" 2>&1 &&
    ninja -C "$root/build-ab-$1" -j16 $targets >"$LOGS/build_$1.log" 2>&1
  local rc=$?
  note "build $1 (decode trace $3, tests $4): exit $rc in $((SECONDS - t0)) s"
  return $rc
}
tests=OFF
[ "${TESTS:-0}" = 1 ] && tests=ON
build new . OFF "$tests" || exit 1
sides=(new)
if [ -n "${BASE:-}" ]; then
  build base "$BASE" OFF OFF && sides=(base new)
fi
[ "${TRACE:-0}" = 1 ] && build trace . ON OFF
if [ "$tests" = ON ]; then
  t0=$SECONDS
  ctest --test-dir build-ab-new -L gpu --output-on-failure --timeout 120 >"$LOGS/gpu_tests.log" 2>&1
  note "gpu tests: exit $? in $((SECONDS - t0)) s; $(grep -E "tests passed|tests failed" "$LOGS/gpu_tests.log")"
  grep -E "^\s+[0-9]+ - .*Failed|\*\*\*Failed" "$LOGS/gpu_tests.log" | head -20 | tee -a "$summary"
fi
args=(bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64)
step_ms() { grep "decode ms/step" "$1" | awk '{print $3}'; }
for ((r = 0; r < ${ROUNDS:-3}; r++)); do
  for v in "${sides[@]}"; do
    log="$LOGS/infer_${v}_$r.log"
    "build-ab-$v/zaya" "${args[@]}" >"$log" 2>&1
    note "round $r, $v: exit $? decode ms/step $(step_ms "$log")"
  done
done
# shellcheck disable=SC2086
build-ab-new/zaya "${args[@]}" --ablate --json "$OUT/bench_infer_new.json" \
  >"$LOGS/infer_variants.log" 2>&1
note "ablation: exit $?"
sed -n '/# decode step without/,$p' "$LOGS/infer_variants.log" | tee -a "$summary"
if [ -x build-ab-trace/zaya ]; then
  build-ab-trace/zaya "${args[@]}" --trace >"$LOGS/infer_trace.log" 2>&1
  note "traced run: exit $?"
  sed -n '/# decode trace/,$p' "$LOGS/infer_trace.log" | tee -a "$summary"
fi
if [ "${SASS:-0}" = 1 ]; then
  # The decode kernels' SASS (attention, router, GEMVs, experts, norms, conv/finish) and their
  # resource use, for reading code size and the instruction stream next to the step times.
  cuobjdump -sass build-ab-new/zaya 2>"$LOGS/sass.err" |
    awk '/Function : /{keep = ($0 ~ /decode_|gemv_|expert_|token_commit|kv_append/)} keep' |
    gzip -9 >"$OUT/sass_decode.txt.gz"
  cuobjdump -res-usage build-ab-new/zaya 2>>"$LOGS/sass.err" |
    grep -A1 -E "decode_|gemv_|expert_" >"$LOGS/res_usage.txt"
  note "sass: $(zcat "$OUT/sass_decode.txt.gz" | grep -c "Function : ") decode kernels in sass_decode.txt.gz"
fi
if [ "${NCU:-0}" = 1 ]; then
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  stall_metrics=gpu__time_duration.sum,smsp__inst_executed.sum
  for why in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard \
    math_pipe_throttle membar mio_throttle misc no_instruction not_selected selected \
    short_scoreboard sleeping tex_throttle wait; do
    stall_metrics+=",smsp__average_warps_issue_stalled_${why}_per_issue_active.ratio"
  done
  small=(bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 3 --warmup 1 --repeats 1)
  kernels='regex:decode_|expert_|gemv_|token_commit|advance|kv_append|argmax'
  for cc in all none; do
    t0=$SECONDS
    "$ncu_bin" --clock-control none --cache-control "$cc" --kernel-name-base function \
      --kernel-name "$kernels" --metrics "$stall_metrics" --csv build-ab-new/zaya "${small[@]}" \
      >"$LOGS/ncu_$cc.csv" 2>"$LOGS/ncu_$cc.err"
    rc=$?
    gzip -9c "$LOGS/ncu_$cc.csv" >"$OUT/ncu_stalls_$cc.csv.gz"
    note "ncu stalls, --cache-control $cc: exit $rc in $((SECONDS - t0)) s"
    python3 tools/ncu_decode_stalls.py "$LOGS/ncu_$cc.csv" 2>&1 | tee -a "$summary"
  done
  t0=$SECONDS
  "$ncu_bin" --clock-control none --graph-profiling graph --metrics "$stall_metrics" --csv \
    build-ab-new/zaya "${small[@]}" >"$LOGS/ncu_graph.csv" 2>"$LOGS/ncu_graph.err"
  rc=$?
  gzip -9c "$LOGS/ncu_graph.csv" >"$OUT/ncu_graph.csv.gz"
  note "ncu stalls of whole graphs: exit $rc in $((SECONDS - t0)) s"
  python3 tools/ncu_decode_stalls.py --each "$LOGS/ncu_graph.csv" 2>&1 | tail -5 | tee -a "$summary"
fi
note "total: $SECONDS s"
