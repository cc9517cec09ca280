#!/usr/bin/env bash
# `zaya data prepare / brown / inspect` end to end: text and JSONL inputs tokenized with the byte
# tokenizer, read back by the independent Python reader (tests/data/megatron_idx.py) and compared
# with the bytes of each document plus EOS; identical output for 1 and 3 workers; a malformed
# JSONL line fails naming file:line and leaves no output; the Brown converter on a small fixture.
# usage: bash data_prepare.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
SRC=$2
PY="$SRC/tests/data/megatron_idx.py"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

printf 'first document\nstill the first\n' > "$T/a.txt"
printf '{"text": "jsonl one"}\n\n{"text": "J\\u00e9 two", "id": 5}\n{"text": ""}\n' > "$T/b.jsonl"

"$ZAYA" data prepare --input "$T/a.txt" "$T/b.jsonl" --output-prefix "$T/out/ds" \
  --tokenizer bytes --workers 1 > "$T/log1" 2>&1 || { cat "$T/log1"; fail "prepare failed"; }
grep -q "3 documents" "$T/log1" || { cat "$T/log1"; fail "expected 3 documents"; }
grep -q "unigram entropy" "$T/log1" || fail "no entropy reported"

python3 - "$PY" "$T/out/ds" <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
got = m.read(sys.argv[2])
EOS = 258
docs = [b"first document\nstill the first\n", b"jsonl one", "J\u00e9 two".encode()]
want = [list(d) + [EOS] for d in docs]
assert got["dtype"] == 8, got["dtype"]          # uint16 for the 259-token byte vocabulary
assert got["sequences"] == want, (got["sequences"], want)
assert got["document_indices"] == [0, 1, 2, 3], got["document_indices"]
PYEOF

# Worker count does not change a byte of the output.
"$ZAYA" data prepare --input "$T/a.txt" "$T/b.jsonl" --output-prefix "$T/out/ds3" \
  --tokenizer bytes --workers 3 > /dev/null 2>&1 || fail "prepare with 3 workers failed"
cmp "$T/out/ds.bin" "$T/out/ds3.bin" || fail ".bin differs between 1 and 3 workers"
cmp "$T/out/ds.idx" "$T/out/ds3.idx" || fail ".idx differs between 1 and 3 workers"

# Paragraph split, int32 storage, no EOS.
printf 'p one\n\n\np two\nline\n' > "$T/c.txt"
"$ZAYA" data prepare --input "$T/c.txt" --text-split paragraph --dtype uint32 --no-append-eos \
  --output-prefix "$T/para" --tokenizer bytes > /dev/null 2>&1 || fail "paragraph prepare failed"
python3 - "$PY" "$T/para" <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
got = m.read(sys.argv[2])
assert got["dtype"] == 4, got["dtype"]
assert got["sequences"] == [list(b"p one"), list(b"p two\nline")], got["sequences"]
PYEOF

# Malformed JSONL: error names file:line, exit non-zero, no output left behind.
printf '{"text": "ok"}\n{"text": broken}\n' > "$T/bad.jsonl"
if "$ZAYA" data prepare --input "$T/bad.jsonl" --output-prefix "$T/bad" --tokenizer bytes \
  > "$T/err" 2>&1; then fail "malformed JSONL accepted"; fi
grep -q "bad.jsonl:2: invalid JSON" "$T/err" || { cat "$T/err"; fail "error does not name bad.jsonl:2"; }
ls "$T" | grep -q '^bad\.\(bin\|idx\)' && fail "partial output left behind"
printf '{"txt": "x"}\n' > "$T/nokey.jsonl"
if "$ZAYA" data prepare --input "$T/nokey.jsonl" --output-prefix "$T/nk" --tokenizer bytes \
  > "$T/err" 2>&1; then fail "missing key accepted"; fi
grep -q 'nokey.jsonl:1: JSON object has no field "text"' "$T/err" || { cat "$T/err"; fail "missing-key message"; }

# inspect: vocabulary check failure names the file and position.
"$ZAYA" data inspect --prefix "$T/out/ds" --vocab-size 259 > /dev/null || fail "inspect failed"
if "$ZAYA" data inspect --prefix "$T/out/ds" --vocab-size 200 > "$T/err" 2>&1; then
  fail "inspect accepted ids >= vocab"; fi
grep -q "ds.bin: token id 258 at position 31 >= vocab_size 200" "$T/err" || { cat "$T/err"; fail "vocab message"; }

# Brown: tags stripped, punctuation rejoined, one JSONL document per file.
mkdir "$T/brown"
printf '\n\n\tThe/at jury/nn said/vbd ,/, ``/`` yes/rb ./. '"''"'/'"''"'\n' > "$T/brown/ca01"
printf '\n\n\tIt/pps rained/vbd ./.\n' > "$T/brown/cb02"
"$ZAYA" data brown --dir "$T/brown" --out "$T/brown.jsonl" > /dev/null || fail "brown failed"
python3 - "$T/brown.jsonl" <<'PYEOF'
import json, sys
docs = [json.loads(l)["text"] for l in open(sys.argv[1])]
assert docs == ['The jury said, "yes."', "It rained."], docs
PYEOF
"$ZAYA" data prepare --brown "$T/brown" --output-prefix "$T/br" --tokenizer bytes > /dev/null \
  || fail "prepare --brown failed"
if "$ZAYA" data brown --dir "$T" --out "$T/x.txt" > "$T/err" 2>&1; then fail "empty brown dir accepted"; fi
grep -q "no Brown corpus files" "$T/err" || fail "brown dir message"
echo PASS
