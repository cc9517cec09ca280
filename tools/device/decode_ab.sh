#!/bin/bash
# Decode A/B in one device call (about 3 minutes), for the lead to run on the H200 from the
# repository root (carry .debs with the call):
#     bash tools/device/decode_ab.sh
# 1. builds `zaya` twice: the default configuration and one with -DZAYA_DECODE_TRACE=ON (two build
#    folders, sm_90a, Ninja);
# 2. times `zaya bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64` with each
#    binary, alternating, ROUNDS (2) times each: what compiling the trace in costs the step;
# 3. with the traced binary: the same run with --trace (the graph step kernel by kernel) and the
#    decode variants of $VARIANTS (default "--attn-stage 0,1 --fold-qkv-norm 0,1 --router-stage 1,0
#    --router-spread 0,1").
# Results in $OUT (default ./decode_ab_out): summary.txt and every log.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/decode_ab_out}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
note "# decode_ab on $(hostname) at $(date -u +%FT%TZ), commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
if compgen -G ".debs/*.deb" >/dev/null; then
  # shellcheck source=tools/device/deps.sh
  source tools/device/deps.sh
fi
build() {  # build DIR TRACE(ON|OFF)
  local t0=$SECONDS
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=OFF -DZAYA_TESTS=OFF -DZAYA_DECODE_TRACE="$2" \
    >"$OUT/configure_$2.log" 2>&1 &&
    ninja -C "$1" -j16 zaya >"$OUT/build_$2.log" 2>&1
  local rc=$?
  note "build (decode trace $2): exit $rc in $((SECONDS - t0)) s"
  return $rc
}
build build-ab-plain OFF || exit 1
build build-ab-trace ON || exit 1
args=(bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64)
step_ms() { grep "decode ms/step" "$1" | awk '{print $3}'; }
for ((r = 0; r < ${ROUNDS:-2}; r++)); do
  for v in plain trace; do
    log="$OUT/infer_${v}_$r.log"
    "build-ab-$v/zaya" "${args[@]}" >"$log" 2>&1
    note "round $r, $v build: exit $? decode ms/step $(step_ms "$log")"
  done
done
# shellcheck disable=SC2086
build-ab-trace/zaya "${args[@]}" --trace ${VARIANTS---attn-stage 0,1 --fold-qkv-norm 0,1 --router-stage 1,0 --router-spread 0,1} \
  >"$OUT/infer_trace.log" 2>&1
note "traced run and variants: exit $?"
sed -n '/# decode variants/,$p' "$OUT/infer_trace.log" | tee -a "$summary"
