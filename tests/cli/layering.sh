#!/usr/bin/env bash
# The include layering of src/ (tools/check_layers.py): the tree passes, and the checker does fail on
# a folder that includes one above it, one beside it, or an include without a folder.
# usage: bash layering.sh <zaya-binary> <source-dir>
set -euo pipefail
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
CHECK=(python3 "$SRC/tools/check_layers.py")

"${CHECK[@]}" "$SRC/src" || fail "src/ breaks the layering"

mk() {  # mk FILE LINE: a two-folder tree whose FILE holds LINE
  rm -rf "$T/src"; mkdir -p "$T/src/core" "$T/src/model" "$T/src/optim"
  echo '#pragma once' > "$T/src/core/a.h"
  echo '#include "core/a.h"' > "$T/src/model/m.h"
  echo '#pragma once' > "$T/src/optim/o.h"
  echo "$2" >> "$T/src/$1"
}
mk model/m.h '#include "core/a.h"'
"${CHECK[@]}" "$T/src" > /dev/null || fail "a downward include was refused"
for c in 'core/a.h|#include "model/m.h"|a level above' 'model/m.h|#include "optim/o.h"|the same level' \
         'model/m.h|#include "a.h"|name a folder'; do
  IFS='|' read -r file line want <<< "$c"
  mk "$file" "$line"
  if "${CHECK[@]}" "$T/src" > "$T/out" 2>&1; then fail "not refused: $line in $file"; fi
  grep -q "$want" "$T/out" || { cat "$T/out"; fail "no '$want' for $line in $file"; }
  grep -q "$file:2" "$T/out" || { cat "$T/out"; fail "the violation's file:line is not named"; }
done
echo "layering: ok"
