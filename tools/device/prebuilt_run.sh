#!/bin/bash
# The measurements of a device call made with binaries built here (tools/device/prebuilt.sh),
# in one script, so that the call spends its time measuring rather than compiling:
#   here:    TESTS=1 bash tools/device/prebuilt.sh && BUILD=build-trace TRACE=1 bash tools/device/prebuilt.sh
#            bash tools/device/prebuilt_run.sh --pack     # build-pack/bins.tgz (gzip: the three
#                                                         # binaries exceed a call's 64 MiB as they are)
#   device:  carry [".debs", "build-pack"]; command: bash tools/device/prebuilt_run.sh
# On the device it unpacks the binaries, sources the -dev packages (deps.sh) and writes, packed
# into $OUT/raw.tgz (infer8.txt, trace.txt, peer8.json and gpu_tests.txt also as they are):
#   gpu.txt         the card and its clocks
#   mem.txt         `zaya bench mem --tests read,copy` at 2 and 4 GB (the roofline's bandwidth)
#   gpu_tests.txt   build-dev/zaya_gpu_tests (when it was packed)
#   infer8.txt/json `zaya bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64`
#                   with $INFER_ARGS (default none), the roofline over the copy bandwidth it measures
#   infer40.txt/json the whole 40-layer model (LAYERS40=0 skips it)
#   trace.txt       the trace build's `--trace` of the defaults (when it was packed)
#   peer8.txt/json  tools/bench_infer_peer.py, transformers' ZayaForCausalLM on the same card and
#                   the same 8-layer shape (PEER=0 skips it)
#   train.txt/json, train_peer.txt/json (TRAIN=1): `zaya bench train --preset zaya1-base --layers 8
#                   --batch 4 --seq 4096` and tools/bench_train_peer.py (torch.compile) on the same
#                   card, first, while the card is cool and its memory empty
# A summary of each goes to standard output (the call's output tail).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
if [ "${1:-}" = "--pack" ]; then
  mkdir -p build-pack
  files=()
  for f in build-dev/zaya build-dev/zaya_gpu_tests build-trace/zaya; do
    [ -x "$f" ] && files+=("$f")
  done
  [ -x build-dev/zaya ] || { echo "prebuilt_run.sh: no build-dev/zaya (run prebuilt.sh)" >&2; exit 1; }
  tar -czf build-pack/bins.tgz "${files[@]}"
  echo "$root" >build-pack/SOURCE_DIR  # the path compiled into the GPU tests (their fixtures)
  ls -la build-pack/bins.tgz
  echo "packed: ${files[*]}"
  exit 0
fi
FINAL="${OUT:-$root/prebuilt_out}"
OUT="$FINAL/raw"  # every result here; at the end one raw.tgz (a call brings back at most 8 files)
mkdir -p "$OUT"
[ -f build-pack/bins.tgz ] || { echo "prebuilt_run.sh: no build-pack/bins.tgz (carry it)" >&2; exit 1; }
tar -xzf build-pack/bins.tgz
# shellcheck disable=SC1091
source tools/device/deps.sh >/dev/null 2>&1
# The GPU tests find their fixtures under the source path compiled into them (recorded by --pack).
src="$(cat build-pack/SOURCE_DIR 2>/dev/null || true)"
if [ -n "$src" ] && [ "$src" != "$root" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"
fi
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${TRAIN:-0}" = 1 ]; then
  BT=(--preset zaya1-base --layers 8 --batch 4 --seq 4096 --steps 10 --warmup 3)
  timeout -k 5 200 build-dev/zaya bench train "${BT[@]}" --json "$OUT/train.json" >"$OUT/train.txt" 2>&1
  echo "train: exit $?"
  grep -E "^(tokens/s|model TFLOP|fwd\+bwd TFLOP|device memory)" "$OUT/train.txt"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout -k 5 300 python3 tools/bench_train_peer.py \
    "${BT[@]}" --compile --json "$OUT/train_peer.json" >"$OUT/train_peer.txt" 2>&1
  echo "train peer: exit $?"
  grep -E "^(tokens/s|model TFLOP|fwd\+bwd TFLOP|device memory)" "$OUT/train_peer.txt"
fi
build-dev/zaya bench mem --tests read,copy -b 2G -e 4G >"$OUT/mem.txt" 2>&1
grep -E "^(read|copy) " "$OUT/mem.txt"
if [ -x build-dev/zaya_gpu_tests ]; then
  build-dev/zaya_gpu_tests --gtest_brief=1 >"$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: exit $?"
  grep -E "FAILED|PASSED|SKIPPED" "$OUT/gpu_tests.txt" | head -20
fi
B="build-dev/zaya bench infer --preset zaya1-base --prompt 1024"
# shellcheck disable=SC2086
$B --layers 8 --decode 64 ${INFER_ARGS:-} --json "$OUT/infer8.json" >"$OUT/infer8.txt" 2>&1
echo "infer, 8 layers: exit $?"
grep -E "^(decode|copy|roofline|fraction|prefill tokens)" "$OUT/infer8.txt"
if [ "${PEER:-1}" = 1 ]; then
  $B --layers 8 --decode 64 --write-config "$OUT/peer8_config.json" >/dev/null 2>&1
  python3 tools/bench_infer_peer.py --config "$OUT/peer8_config.json" --batch 1 --prompt 1024 \
    --decode 64 --json "$OUT/peer8.json" >"$OUT/peer8.txt" 2>&1
  echo "peer, 8 layers: exit $?"
  grep -E "^(prefill_tokens|decode_ms|generate_ms|gpu)" "$OUT/peer8.txt"
fi
if [ "${LAYERS40:-1}" = 1 ]; then
  $B --layers 40 --decode 32 --json "$OUT/infer40.json" >"$OUT/infer40.txt" 2>&1
  echo "infer, 40 layers: exit $?"
  grep -E "^(decode ms|copy|roofline|fraction)" "$OUT/infer40.txt"
fi
if [ -x build-trace/zaya ]; then
  build-trace/zaya bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64 --trace \
    >"$OUT/trace.txt" 2>&1
  echo "trace: exit $?"
  grep -A30 "decode trace" "$OUT/trace.txt" | head -31
fi
tar -czf "$FINAL/raw.tgz" -C "$OUT" .
for f in infer8.txt trace.txt peer8.json gpu_tests.txt train.txt train_peer.txt; do  # also as they are
  [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL/"
done
rm -rf "$OUT"
exit 0
