#!/bin/bash
# Builds here (no GPU needed) the `zaya` binary that a device call runs as it is, so that the call
# spends no time compiling (the device's own build of the CUDA sources takes 2–3 minutes of its
# budget; a run of `zaya bench infer` with a few variants then takes ~15 s):
#     bash tools/device/prebuilt.sh          # here: build-dev/zaya (sm_90a, no MPI, no tests)
# then run on the device with carry [".debs", "build-dev/zaya"]:
#     source tools/device/deps.sh >/dev/null && build-dev/zaya bench infer ...
# The binary needs the device's CUDA 13 runtime and cuBLAS (/usr/local/cuda/lib, its run path) and
# the fmt, toml++ and xxhash shared libraries that deps.sh unpacks from .debs (fetch them with
# `bash tools/device/deps.sh --download`); NCCL and MPI stay out of it.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_MPI=OFF -DZAYA_TESTS=OFF ${ZAYA_CMAKE_ARGS:-} >/dev/null
ninja -C build-dev zaya
git rev-parse --short HEAD >COMMIT 2>/dev/null || true
ls -la build-dev/zaya
