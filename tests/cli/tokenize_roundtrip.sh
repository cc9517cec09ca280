#!/usr/bin/env bash
# `zaya tokenize` against the Hugging Face `tokenizers` fixture (tests/fixtures/tokenizer): encode
# and decode of reference texts through arguments, files and stdin (with --input - or piped alone),
# the three output formats, and errors that name the bad input (empty input included) and leave no
# output file behind.
#   bash tests/cli/tokenize_roundtrip.sh ZAYA_BINARY SOURCE_DIR
set -euo pipefail
ZAYA="$1"
SRC="$2"
FIX="$SRC/tests/fixtures/tokenizer"
TOK="$FIX/mini_gemma.json"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fails=0
check() {  # name, expected, got
  if [[ "$2" == "$3" ]]; then
    echo "ok   $1"
  else
    echo "FAIL $1"
    echo "  expected: $2"
    echo "  got:      $3"
    fails=$((fails + 1))
  fi
}

# Reference cases: text, ids, ids with special tokens, decoding (written out by Python's json).
python3 - "$FIX/expected_mini_gemma.json" "$TMP" <<'EOF'
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
for i in (1, 2, 3, 6, 9, 10):
    c = cases[i]
    open(f"{sys.argv[2]}/text{i}", "w", encoding="utf-8", newline="").write(c["text"])
    open(f"{sys.argv[2]}/ids{i}", "w").write(" ".join(map(str, c["ids"])))
    open(f"{sys.argv[2]}/idsbos{i}", "w").write(" ".join(map(str, c["ids_with_special"])))
    open(f"{sys.argv[2]}/decoded{i}", "w", encoding="utf-8", newline="").write(c["decoded"])
EOF

for i in 1 2 3 6 9 10; do
  check "encode file $i" "$(cat "$TMP/ids$i")" "$("$ZAYA" tokenize --tokenizer "$TOK" --input "$TMP/text$i")"
  check "encode stdin +special $i" "$(cat "$TMP/idsbos$i")" \
    "$("$ZAYA" tokenize --tokenizer "$TOK" --add-special --input - < "$TMP/text$i")"
  "$ZAYA" tokenize --tokenizer "$TOK" --decode --input "$TMP/ids$i" --output "$TMP/out$i"
  check "decode $i" "$(cat "$TMP/decoded$i" | od -An -tx1)" "$(od -An -tx1 < "$TMP/out$i")"
done
for i in 1 2 3; do
  check "encode piped stdin $i" "$(cat "$TMP/ids$i")" "$("$ZAYA" tokenize --tokenizer "$TOK" < "$TMP/text$i")"
  "$ZAYA" tokenize --tokenizer "$TOK" --decode --output "$TMP/piped$i" < "$TMP/ids$i"
  check "decode piped stdin $i" "$(od -An -tx1 < "$TMP/decoded$i")" "$(od -An -tx1 < "$TMP/piped$i")"
done
check "echo | tokenize" "$("$ZAYA" tokenize --tokenizer "$TOK" --input - <<< "Hello world")" \
  "$(echo "Hello world" | "$ZAYA" tokenize --tokenizer "$TOK")"
check "arguments before stdin" "$(cat "$TMP/ids1")" \
  "$(echo "ignored" | "$ZAYA" tokenize --tokenizer "$TOK" Hello, 'world!')"
# A terminal on stdin and no text: an error, not a wait or an empty encoding.
check "terminal stdin" "refused" "$(python3 - "$ZAYA" "$TOK" <<'EOF'
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "tokenize", "--tokenizer", sys.argv[2]])
out = b""
while True:
    try:
        d = os.read(fd, 4096)
    except OSError:
        break
    if not d:
        break
    out += d
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print("refused" if code != 0 and b"no input" in out else f"exit {code}: {out!r}")
EOF
)"
check "encode args" "$(cat "$TMP/ids1")" "$("$ZAYA" tokenize --tokenizer "$TOK" Hello, 'world!')"
check "directory spec" "$(cat "$TMP/ids1")" \
  "$(mkdir -p "$TMP/dir" && cp "$TOK" "$TMP/dir/tokenizer.json" && "$ZAYA" tokenize --tokenizer "$TMP/dir" 'Hello, world!')"
check "bytes tokenizer" "257 104 105" "$("$ZAYA" tokenize --tokenizer bytes --add-special hi)"
check "decode commas" "Hello, world!" "$("$ZAYA" tokenize --tokenizer "$TOK" --decode "$(tr ' ' ',' < "$TMP/ids1")")"

# json and pieces formats carry the same ids; the pieces of a text that needs no byte fallback (each
# byte token alone decodes to U+FFFD) concatenate back to the text.
"$ZAYA" tokenize --tokenizer "$TOK" --format json --input "$TMP/text2" > "$TMP/j"
"$ZAYA" tokenize --tokenizer "$TOK" --format pieces --input "$TMP/text2" > "$TMP/p"
check "json + pieces formats" "ok" "$(python3 - "$TMP" <<'EOF'
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/j"))
ids = list(map(int, open(f"{d}/ids2").read().split()))
rows = [l.split("\t", 1) for l in open(f"{d}/p", encoding="utf-8").read().splitlines()]
ok = j["ids"] == ids and [int(r[0]) for r in rows] == ids and \
     [json.loads(r[1]) for r in rows] == j["pieces"] and \
     "".join(j["pieces"]) == open(f"{d}/text2", encoding="utf-8").read()
print("ok" if ok else f"mismatch: {j} {rows}")
EOF
)"

# Errors: non-zero exit, a message naming the culprit, no output file.
expect_error() {  # name, message fragment, command...
  local name="$1" frag="$2"
  shift 2
  local rc=0
  "$@" > "$TMP/stdout" 2> "$TMP/stderr" || rc=$?
  if [[ $rc -ne 0 ]] && grep -qF -- "$frag" "$TMP/stderr"; then
    echo "ok   $name"
  else
    echo "FAIL $name (exit $rc): $(cat "$TMP/stderr")"
    fails=$((fails + 1))
  fi
}
expect_error "bad id" "item 2 is '7x'" "$ZAYA" tokenize --tokenizer "$TOK" --decode 1 2 7x --output "$TMP/bad"
check "no output after error" "absent" "$([[ -e "$TMP/bad" ]] && echo present || echo absent)"
expect_error "unknown id" "token id 999999" "$ZAYA" tokenize --tokenizer "$TOK" --decode 999999
expect_error "missing tokenizer" "$TMP/nope.json" "$ZAYA" tokenize --tokenizer "$TMP/nope.json" hi
expect_error "missing input" "$TMP/nope.txt" "$ZAYA" tokenize --tokenizer "$TOK" --input "$TMP/nope.txt"
: > "$TMP/empty"
expect_error "empty stdin" "empty input (stdin)" "$ZAYA" tokenize --tokenizer "$TOK" < "$TMP/empty"
expect_error "empty --input -" "empty input (stdin)" "$ZAYA" tokenize --tokenizer "$TOK" --input - < "$TMP/empty"
expect_error "empty file" "empty input ('$TMP/empty')" "$ZAYA" tokenize --tokenizer "$TOK" --input "$TMP/empty"
expect_error "empty argument" "empty input (the arguments)" "$ZAYA" tokenize --tokenizer "$TOK" ''
expect_error "empty decode" "empty input (stdin)" "$ZAYA" tokenize --tokenizer "$TOK" --decode < "$TMP/empty"
printf '{"model": {"type": "Unigram"}}' > "$TMP/unigram.json"
expect_error "unsupported model" "model.type" "$ZAYA" tokenize --tokenizer "$TMP/unigram.json" hi

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all tokenize checks passed"
