#!/usr/bin/env bash
# Runs one fuzz target of tests/fuzz/ (or all of them, one after another) for SECONDS each:
#   tools/fuzz.sh TARGET|all SECONDS [extra libFuzzer flags]
# e.g. tools/fuzz.sh fuzz_tokenizer 600. Builds build-fuzz/ first (clang, libFuzzer, ASan + UBSan,
# CUDA off), seeds build-fuzz/corpus/TARGET from tests/fuzz/make_seeds.py and keeps what libFuzzer
# adds there between runs. One worker: the runs are meant to share a machine. A finding is written
# to build-fuzz/findings/ and makes this script exit non-zero; docs/ROBUSTNESS.md says what to do.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,8p' "$0"; exit 2; }
target=$1 seconds=$2
shift 2
B=${ZAYA_FUZZ_BUILD:-build-fuzz}
if [ ! -f "$B/build.ninja" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZAYA_FUZZ=ON -DZAYA_CUDA=OFF \
    -DZAYA_MPI=OFF -DZAYA_TESTS=OFF -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
fi
# ninja reports a failed build on standard output: keep it out of the way unless the build fails.
ninja -C "$B" zaya_fuzz >"$B/ninja.log" 2>&1 || { tail -40 "$B/ninja.log" >&2; echo "fuzz.sh: the build of $B failed" >&2; exit 1; }
python3 tests/fuzz/make_seeds.py "$B/seeds"
if [ "$target" = all ]; then
  targets=$(cd tests/fuzz && ls fuzz_*.cpp | sed 's/\.cpp$//')
else
  targets=$target
fi
mkdir -p "$B/findings"
status=0
for t in $targets; do
  [ -x "$B/$t" ] || { echo "fuzz.sh: no target $t (have: $(cd tests/fuzz && ls fuzz_*.cpp | sed 's/\.cpp$//' | tr '\n' ' '))" >&2; exit 2; }
  mkdir -p "$B/corpus/$t"
  echo "fuzz.sh: $t for ${seconds}s"
  # -malloc_limit_mb: one allocation over 1 GiB is a finding (unbounded allocation from a small file).
  if ! "$B/$t" "$B/corpus/$t" "$B/seeds/$t" -max_total_time="$seconds" -workers=1 -jobs=1 \
      -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=1024 -max_len=16384 -print_final_stats=1 \
      -artifact_prefix="$B/findings/$t-" "$@" 2>"$B/$t.log"; then
    status=1
    echo "fuzz.sh: $t FOUND something: see $B/$t.log and $B/findings/" >&2
  fi
  grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" \
    "$B/$t.log" | sed "s/^/  /" || true
  grep -E "^#[0-9]+" "$B/$t.log" | tail -1 | sed "s/^/  last: /" || true
done
exit $status
