#!/bin/bash
# The second device call of the distributed issues (after tools/device/short_call.sh), under 10
# minutes, from the repository root (carry .debs):
#     bash tools/device/dist_call.sh
# 1. zaya with MPI, CUDA and NCCL built on the device (build-mpi/, sm_90a; ~60 s on 16 cores,
#    incremental on a machine that is still warm);
# 2. tools/device/dp_check.sh (two ranks on one GPU over MPI against one; NCCL with one rank
#    against the plain step; the overhead of the data-parallel machinery);
# 3. tools/device/ft_gpu.sh (supervised CUDA runs with injected faults, the NCCL watchdog).
# Results in $OUT: dp_summary.txt, ft_summary.txt, logs.tgz (every log), build.log.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/dist_out}"
mkdir -p "$OUT"
# shellcheck source=tools/device/deps.sh
source tools/device/deps.sh >/dev/null 2>&1
{ cmake -S . -B build-mpi -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=ON -DZAYA_TESTS=OFF &&
    ninja -C build-mpi -j14 zaya; } >"$OUT/build.log" 2>&1
echo "build-mpi exit $?" | tee -a "$OUT/build.log"
logs="$(mktemp -d)/logs"
mkdir -p "$logs"
export Z=build-mpi/zaya
OUT="$OUT" LOGS="$logs/dp" timeout -k 5 240 bash tools/device/dp_check.sh >"$logs/dp_stdout.txt" 2>&1
echo "dp_check exit $?" | tee -a "$OUT/dp_summary.txt"
OUT="$OUT" LOGS="$logs/ft" timeout -k 5 270 bash tools/device/ft_gpu.sh >"$logs/ft_stdout.txt" 2>&1
echo "ft_gpu exit $?" | tee -a "$OUT/ft_summary.txt"
tar -czf "$OUT/logs.tgz" -C "$(dirname "$logs")" logs 2>/dev/null
exit 0
