#!/bin/bash
# One device call (under 10 minutes) for the checks the checkpoint, supervisor and context-
# parallel issues still need on a GPU, from the repository root (carry .debs):
#     bash tools/device/open_call.sh
# 1. zaya with MPI, CUDA and NCCL built on the device (build-mpi/, sm_90a);
# 2. tools/device/ckpt_gpu.sh's benchmark (CKPT_EXPORT=0): the loop's stall per save and the
#    writer's bandwidth, the snapshot in GPU and in page-locked host memory;
# 3. tools/device/cp_gpu.sh at 32K (CP_BENCH=0 CP_SEQS=32768): cp = 2 against cp = 1 on the bench
#    model, and the tiny preset trained with cp = 2 against one process;
# 4. the start-up of `zaya train` on the 8-layer ZAYA1-base (seq 1024, a checkpoint every step),
#    every stderr line stamped with the seconds since launch: where the time before step 1 goes.
# Each part gets what is left of a 570 s budget (DEADLINE_S). Results in $OUT: summary.txt,
# logs.tgz, build.log.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/open_out}"
mkdir -p "$OUT"
start=$SECONDS
deadline=$((start + ${DEADLINE_S:-570}))
left() { local l=$((deadline - SECONDS)); [ "$l" -gt "$1" ] && l=$1; echo $((l > 5 ? l : 5)); }
# shellcheck source=tools/device/deps.sh
source tools/device/deps.sh >/dev/null 2>&1
{ cmake -S . -B build-mpi -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=ON -DZAYA_TESTS=OFF &&
    ninja -C build-mpi -j14 zaya; } >"$OUT/build.log" 2>&1
build_rc=$?
export Z=build-mpi/zaya ZM=build-mpi/zaya
LOGS="$(mktemp -d)/logs"
export LOGS
mkdir -p "$LOGS"
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
note "# open_call at $(date -u +%FT%TZ): build exit $build_rc after $((SECONDS - start)) s; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0

# 2. Checkpoint benchmark.
t0=$SECONDS
(CKPT_EXPORT=0 CKPT_TIMEOUT=110; source tools/device/ckpt_gpu.sh) 2>&1 | tail -3 >"$LOGS/ckpt_stdout.txt"
note "ckpt bench: $((SECONDS - t0)) s"

# 3. Context parallelism at 32K.
t0=$SECONDS
CP_BENCH=0 CP_SEQS=32768 OUT="$OUT" timeout -k 5 "$(left 300)" bash tools/device/cp_gpu.sh \
  >"$LOGS/cp_stdout.txt" 2>&1
note "cp_gpu: exit $? after $((SECONDS - t0)) s"

# 4. Start-up of an 8-layer ZAYA1-base training run.
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
t0=$SECONDS
launch=$EPOCHREALTIME
timeout -k 5 "$(left 200)" mpirun --oversubscribe -np 1 -x NCCL_NVLS_ENABLE "$Z" train \
  --config "$T/base.toml" --out "$T/run" 2>&1 |
  while IFS= read -r line; do echo "$EPOCHREALTIME $line"; done |
  awk -v t0="$launch" '{ t = $1; $1 = ""; printf "%7.2f%s\n", t - t0, $0 }' >"$LOGS/probe_train.log"
note "train start-up probe ($((SECONDS - t0)) s): $(grep -E 'resolved config|checkpoints:|^ *[0-9.]+ step|checkpoint ' "$LOGS/probe_train.log" | cut -c1-100 | head -8 | tr '\n' '|')"
rm -rf "$T"
tar -czf "$OUT/logs.tgz" -C "$(dirname "$LOGS")" logs 2>/dev/null
exit 0
