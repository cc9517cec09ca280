#!/bin/bash
# Builds here (no GPU needed) the binaries that a device call runs as they are, so that the call
# spends no time compiling (the device's own build of the CUDA sources takes 2–3 minutes of its
# budget; a run of `zaya bench infer` then takes ~15 s):
#     bash tools/device/prebuilt.sh                     # build-dev/zaya (sm_90a, no MPI)
#     TESTS=1 bash tools/device/prebuilt.sh             # and build-dev/zaya_gpu_tests
#     BUILD=build-trace TRACE=1 bash tools/device/prebuilt.sh   # a decode-trace build beside it
# then on the device, with carry [".debs", "build-dev/zaya"] (and the other binaries):
#     source tools/device/deps.sh >/dev/null && build-dev/zaya bench infer ...
# or, for the usual set of measurements in one call (tests, bandwidth, 8 and 40 layers, trace):
#     bash tools/device/prebuilt_run.sh --pack   # here; then carry [".debs", "build-pack"] and run
#     bash tools/device/prebuilt_run.sh          # on the device (INFER_ARGS="..." for bench infer flags)
# The binaries need the device's CUDA 13 runtime and cuBLAS (/usr/local/cuda/lib, their run path)
# and the fmt, toml++ and xxhash shared libraries that deps.sh unpacks from .debs (fetch them
# with `bash tools/device/deps.sh --download`); NCCL and MPI stay out of them. The GPU tests find
# their fixtures under the source path compiled into them (this checkout's): on the device, link
# the copied tree there first, e.g. `mkdir -p "$(dirname SRC)" && ln -sfn "$PWD" SRC` with SRC
# the path this script prints.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${BUILD:-build-dev}"
tests=OFF targets=zaya
[ "${TESTS:-0}" = 1 ] && tests=ON targets="zaya zaya_gpu_tests"
trace=OFF
[ "${TRACE:-0}" = 1 ] && trace=ON
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=OFF -DZAYA_TESTS="$tests" \
  -DZAYA_DECODE_TRACE="$trace" ${ZAYA_CMAKE_ARGS:-} >/dev/null
# shellcheck disable=SC2086
ninja -C "$build" $targets
git rev-parse --short HEAD >COMMIT 2>/dev/null || true
echo "prebuilt: $(cat COMMIT 2>/dev/null) in $build; source path compiled in: $PWD"
ls -la "$build"/zaya
[ "$tests" = ON ] && ls -la "$build"/zaya_gpu_tests
exit 0
