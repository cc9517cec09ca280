#!/usr/bin/env bash
# `zaya train --model.init=DIR` (continued pretraining) from the command line. The data are 100
# identical lines of 15 bytes (documents of exactly seq_len = 16 tokens with the EOS), so every
# packed row is the same 17 tokens whatever the shuffle; the step-1 loss in metrics.jsonl (computed
# before the first update) must then be `zaya eval`'s loss of the init checkpoint on that row: in
# one process and under `mpirun -np 2` (each rank loads the weights; a rank on other weights would
# move the averaged loss). A missing directory, a directory without config.json, and a model.config
# that disagrees with the checkpoint's shapes exit non-zero naming model.init and the problem; the
# first two before anything is written.
# usage: bash train_init.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
M="$SRC/tests/fixtures/parity/cfg_a"
LINE="continued zaya!"

for _ in $(seq 100); do echo "$LINE"; done > "$T/lines.txt"
"$ZAYA" data prepare --input "$T/lines.txt" --text-split line --output-prefix "$T/ds" \
  --tokenizer bytes > "$T/prep.log" 2>&1 || { cat "$T/prep.log"; fail "data prepare"; }
# The row: the line's bytes, the EOS (258), the next document's first byte.
python3 -c 'import sys; b = sys.argv[1].encode(); print(" ".join(map(str, list(b) + [258, b[0]])))' \
  "$LINE" > "$T/row.ids"
cat > "$T/run.toml" <<EOT
[model]
init = "$M"
[data]
tokenizer = "bytes"
[[data.blend]]
prefix = "$T/ds"
[eval]
every = 0
[checkpoint]
every = 0
[train]
micro_batch = 1
grad_accum = 2
seq_len = 16
steps = 2
EOT

want=$("$ZAYA" eval --model "$M" --ids-file "$T/row.ids")
check_step1() {  # check_step1 OUT: metrics' step-1 loss equals the eval loss
  python3 - "$1/metrics.jsonl" "$want" <<'PY' || fail "$1: step-1 loss is not the init checkpoint's"
import json, sys
first = json.loads(open(sys.argv[1]).readline())
want = json.loads(sys.argv[2])["loss"]
assert first["step"] == 1, first
assert abs(first["loss"] - want) <= 1e-6 * want, (first["loss"], want)
PY
}

"$ZAYA" train --config "$T/run.toml" --out "$T/one" --quiet > "$T/one.out" 2> "$T/one.log" \
  || { tail -20 "$T/one.log"; fail "train with model.init"; }
grep -q "model.init: starting from the weights of $M" "$T/one.log" || fail "no model.init log line"
grep -q "model: 3 layers, D=64, 4 experts" "$T/one.log" || fail "not the checkpoint's architecture"
check_step1 "$T/one"

if "$ZAYA" version | grep -q "mpi: yes" && command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  timeout 300 mpirun -np 2 --oversubscribe "$ZAYA" train --config "$T/run.toml" \
    --train.grad_accum=1 --out "$T/two" --quiet > "$T/two.out" 2> "$T/two.log" \
    || { tail -20 "$T/two.log"; fail "mpirun -np 2 train with model.init"; }
  grep -q "parallel: 2 ranks" "$T/two.log" || fail "-np 2 did not run data-parallel"
  check_step1 "$T/two"
else
  echo "SKIP: the mpirun -np 2 part (no MPI)"
fi

expect_error() {  # expect_error NAME PATTERN ARGS...: zaya train fails, stderr matches PATTERN
  local name=$1 pattern=$2
  shift 2
  if "$ZAYA" train --config "$T/run.toml" --out "$T/$name" --quiet "$@" > /dev/null \
    2> "$T/$name.err"; then
    fail "$name: accepted"
  fi
  grep -qF -- "$pattern" "$T/$name.err" || { cat "$T/$name.err"; fail "$name: no clear reason"; }
}
expect_error nodir "model.init = \"$T/nowhere\" is not a directory" --model.init="$T/nowhere"
[ ! -e "$T/nodir" ] || fail "a missing model.init was found only after work had started"
mkdir "$T/empty"
expect_error nocfg "model.init = \"$T/empty\" has no config.json" --model.init="$T/empty"
[ ! -e "$T/nocfg" ] || fail "a model.init without config.json was found only after work started"
expect_error conflict "hidden_size = " --model.config=tiny
grep -qF "64 in the checkpoint" "$T/conflict.err" || { cat "$T/conflict.err"; fail "conflict: no values"; }
grep -qF "model.init = \"$M\"" "$T/conflict.err" || fail "conflict: model.init not named"
echo "train init: ok"
