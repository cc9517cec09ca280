#!/usr/bin/env bash
# Every command and subcommand answers --help with its usage on stdout and exit 0. The commands
# are the ones `zaya --help` lists, and each command's subcommands the ones its own --help lists
# (under a "Subcommands:" heading, or after a "usage: ... SUB" line), so a new one is covered
# without touching this file.
# usage: bash help_all.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The names listed in a help text: indented "  name  summary" lines after the list's heading.
listed() {
  awk '/^(commands|Subcommands|SUBCOMMANDS):/ || /^usage: .* SUB / { on = 1; next }
       on && /^  [a-z][a-z0-9_-]*  / { print $1; next }
       on { on = 0 }' "$1"
}

checked=0
walk() {  # walk WORDS...: `zaya WORDS --help`, then each subcommand it lists
  local name="zaya $*" rc=0
  "$ZAYA" "$@" --help > "$T/out" 2> "$T/err" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$T/out" "$T/err"; fail "$name --help exited $rc"; }
  [ -s "$T/out" ] || { cat "$T/err"; fail "$name --help printed no usage"; }
  grep -q -- "--help\|usage\|Usage" "$T/out" || { cat "$T/out"; fail "$name --help: no usage"; }
  ! grep -q "caught in your main" "$T/out" "$T/err" || fail "$name --help: CLI11's internal message"
  echo "ok   $name --help"
  checked=$((checked + 1))
  local subs
  subs=$(listed "$T/out")
  for s in $subs; do walk "$@" "$s"; done
}

"$ZAYA" --help > "$T/top" || fail "zaya --help exited non-zero"
commands=$(listed "$T/top")
[ -n "$commands" ] || { cat "$T/top"; fail "zaya --help lists no commands"; }
for c in $commands; do walk "$c"; done
# The ones the issue named must be among them, with their subcommands.
for want in train generate eval tokenize version "data prepare" "size check" "bench infer"; do
  set -- $want
  "$ZAYA" "$@" --help > /dev/null || fail "zaya $want --help"
done
[ "$checked" -ge 20 ] || fail "only $checked commands and subcommands found"
echo "help: $checked commands and subcommands ok"
