#!/bin/bash
# Source this on the GPU machine before configuring: that machine reaches no package registry, so
# the Debian -dev packages zaya builds against (fmt, nlohmann-json, CLI11, toml++, xxhash,
# GoogleTest) travel with the device call in .debs/ (fetched here with `bash tools/device/deps.sh
# --download`) and are unpacked into a private prefix instead of being installed.
#     source tools/device/deps.sh        # on the device: unpack .debs/ into /tmp/deps, export paths
#     bash tools/device/deps.sh --download  # here: apt-get download the packages into .debs/
ZAYA_DEPS_PACKAGES="googletest libcli11-dev libfmt-dev libfmt9 libgmock-dev libgtest-dev
  libtomlplusplus-dev libtomlplusplus3 libxxhash-dev libxxhash0 nlohmann-json3-dev"
_zaya_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ "${1:-}" = "--download" ]; then
  mkdir -p "$_zaya_root/.debs" && cd "$_zaya_root/.debs" && apt-get download $ZAYA_DEPS_PACKAGES
  return 0 2>/dev/null || exit 0
fi
ZAYA_DEPS=/tmp/deps
mkdir -p "$ZAYA_DEPS"
for deb in "$_zaya_root"/.debs/*.deb; do
  [ -e "$deb" ] || { echo "deps.sh: no .debs/*.deb (carry .debs with the device call)" >&2; break; }
  dpkg -x "$deb" "$ZAYA_DEPS"
done
_multi=$ZAYA_DEPS/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH="$ZAYA_DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$_multi/pkgconfig:$ZAYA_DEPS/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$ZAYA_DEPS"
export LD_LIBRARY_PATH="$_multi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPATH="$ZAYA_DEPS/usr/include${CPATH:+:$CPATH}"
