#!/bin/bash
# The distributed issues' GPU checks in one device call of under 10 minutes, for sessions with
# little device time, from the repository root (carry .debs and build-pack; make the pack here with
# `TESTS=1 bash tools/device/prebuilt.sh` and `BASE_BUILD=... bash tools/device/ab_step.sh --pack`):
#     bash tools/device/short_call.sh
# 1. in the background: zaya with MPI and NCCL built on the device (build-mpi/, sm_90a);
# 2. tools/device/ab_step.sh on the prebuilt binaries: the GPU tests, greedy tokens and tiny losses
#    against the base tree (ROUNDS, default 0, speed rounds);
# 3. tools/device/cp_gpu.sh (32K at cp = 1 with recomputation; cp = 2 against cp = 1) and the
#    checkpoint benchmark of tools/device/ckpt_gpu.sh (snapshot in GPU and in host memory);
# 4. `zaya bench train --preset zaya1-base --layers 8 --batch 4 --seq 4096` plain and with --dp nccl
#    (one rank): the data-parallel machinery's share of the step.
# Results in $OUT: ab_stdout.txt, ab/summary.txt, ab/logs.tgz, dp_overhead.txt, mpi_build.log.
# For a call with less device time left (~5 minutes):
#     GPU_FILTER='OptimizerCuda.*:DataParallelCuda.*:CudaModel*:TrainCuda*' CP_BENCH=0 CP_SEQS=32768 \
#       bash tools/device/short_call.sh
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/short_out}"
mkdir -p "$OUT"
# shellcheck source=tools/device/deps.sh
source tools/device/deps.sh >/dev/null 2>&1
(cmake -S . -B build-mpi -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=ON -DZAYA_TESTS=OFF >/tmp/mpib.log 2>&1 &&
  ninja -C build-mpi -j10 zaya >>/tmp/mpib.log 2>&1
echo "build-mpi exit $?" >>/tmp/mpib.log
cp /tmp/mpib.log /tmp/mpib.done) &
CP_PLAIN=0 CP_BENCH="${CP_BENCH:-1}" CP_SEQS="${CP_SEQS:-4096 32768}" GPU_FILTER="${GPU_FILTER:-}" \
  CKPT_EXPORT=0 ZM=build-mpi/zaya WAIT_FOR=/tmp/mpib.done PREBUILT=build-pack/ab.tgz \
  BASE_TGZ=build-pack/base.tgz ROUNDS="${ROUNDS:-0}" EXTRA="tools/device/cp_gpu.sh tools/device/ckpt_gpu.sh" \
  OUT="$OUT/ab" bash tools/device/ab_step.sh >"$OUT/ab_stdout.txt" 2>&1
wait
cp /tmp/mpib.log "$OUT/mpi_build.log"
Z=build-mpi/zaya
dp="$OUT/dp_overhead.txt"
base=(bench train --preset zaya1-base --layers 8 --batch 4 --seq 4096 --steps 10 --warmup 3 --no-profile)
for v in plain nccl; do
  flags=()
  [ "$v" = nccl ] && flags=(--dp nccl)
  [ "$v" = nccl_no_overlap ] && flags=(--dp nccl --no-overlap)
  timeout -k 5 120 "$Z" "${base[@]}" "${flags[@]}" >"/tmp/dp_$v.log" 2>&1
  echo "$v: exit $? | $(grep -E "^# median|^tokens/s|data parallel|reduce-scatter" "/tmp/dp_$v.log" | tr '\n' ' ' | cut -c1-600)" | tee -a "$dp"
  grep -E "^step " "/tmp/dp_$v.log" | tail -3 >>"$dp"
done
exit 0
