#!/usr/bin/env bash
# Disk full while training: a run that cannot write its next checkpoint stops with an error that
# names the file it could not write, leaves no half-written checkpoint directory (nor staging
# leftovers) behind, and the previous checkpoint stays byte-for-byte intact: its manifest still
# verifies and `--resume auto` continues from it to the end.
# The full disk is simulated with RLIMIT_FSIZE (`ulimit -f`): writes past the limit fail with EFBIG
# the way they fail with ENOSPC on a full file system (a short write, then an error). SIGXFSZ is
# ignored in that subshell so that write() returns the error instead of killing the process.
# usage: bash train_disk_full.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Training data: text the repository itself contains, as bytes.
"$ZAYA" data prepare --input "$SRC/README.md" "$SRC/docs/TRAINING.md" --output-prefix "$T/ds" \
  --tokenizer bytes > "$T/prep.log" 2>&1 || { cat "$T/prep.log"; fail "data prepare failed"; }
cat > "$T/run.toml" <<EOF
[model]
config = "tiny"
[data]
tokenizer = "bytes"
[[data.blend]]
prefix = "$T/ds"
[eval]
every = 0
[checkpoint]
every = 2
keep_last = 3
[schedule]
warmup_steps = 1
[train]
micro_batch = 2
seq_len = 32
steps = 4
log_every = 1
EOF
OUT="$T/out"
CK="$OUT/checkpoints"

# 1. Two steps and their checkpoint, with room to spare.
"$ZAYA" train --config "$T/run.toml" --out "$OUT" --steps 2 --quiet > "$T/run1.log" 2>&1 ||
  { cat "$T/run1.log"; fail "first run failed"; }
[ -d "$CK/step-00000002" ] || fail "no checkpoint step-00000002 after the first run"
(cd "$CK/step-00000002" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$T/before.sha"

# 2. Resume with a 1 MiB file-size limit: the model's weights (about 4.5 MB) cannot be written, so
#    the step-4 checkpoint fails part-way through its first large file.
set +e
(
  trap '' XFSZ
  ulimit -f 1024
  exec "$ZAYA" train --config "$T/run.toml" --out "$OUT" --resume auto --quiet
) > "$T/run2.log" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || { cat "$T/run2.log"; fail "training with a full disk exited 0"; }
[ "$rc" -lt 128 ] || { cat "$T/run2.log"; fail "training was killed by a signal ($rc) instead of reporting the error"; }
grep -q "error:" "$T/run2.log" || { cat "$T/run2.log"; fail "no error message"; }
grep -q "File too large" "$T/run2.log" || { cat "$T/run2.log"; fail "the error does not give the cause"; }
grep -q "checkpoint $CK/step-00000004 was not saved" "$T/run2.log" ||
  { cat "$T/run2.log"; fail "the error does not say which checkpoint failed"; }
grep -q "writing $CK/.*model.*\.safetensors" "$T/run2.log" ||
  { cat "$T/run2.log"; fail "the error does not name the file that could not be written"; }

# Nothing half-written is visible: the checkpoint directory holds exactly the old checkpoint, and
# no staging directory or temporary file is left anywhere under the output directory.
left=$(ls -A "$CK")
[ "$left" = "step-00000002" ] || fail "checkpoints/ holds '$left' after the failed save"
stray=$(find "$OUT" -name '.tmp*' -o -name '*.tmp.*')
[ -z "$stray" ] || fail "staging leftovers after the failed save: $stray"

# The previous checkpoint is untouched and still verifies.
(cd "$CK/step-00000002" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$T/after.sha"
cmp -s "$T/before.sha" "$T/after.sha" || { diff "$T/before.sha" "$T/after.sha"; fail "step-00000002 changed"; }

# 3. With room again, `--resume auto` picks step 2 (nothing skipped) and finishes the run.
"$ZAYA" train --config "$T/run.toml" --out "$OUT" --resume auto --quiet > "$T/run3.log" 2>&1 ||
  { cat "$T/run3.log"; fail "resuming after the failed save failed"; }
grep -q "resuming from $CK/step-00000002" "$T/run3.log" || { cat "$T/run3.log"; fail "did not resume from step-00000002"; }
grep -q "skipping" "$T/run3.log" && { cat "$T/run3.log"; fail "a checkpoint was skipped"; }
[ -d "$CK/step-00000004" ] || fail "no step-00000004 after the resumed run"
echo "ok"
