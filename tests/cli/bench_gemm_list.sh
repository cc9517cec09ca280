#!/bin/bash
# `zaya bench gemm --list` needs no GPU: the shapes of a ZAYA preset's training step, and the
# errors for bad ranges. Usage: bash bench_gemm_list.sh <zaya-binary> <source-dir>
set -u
zaya="$1"
fail() { echo "FAIL: $*"; exit 1; }
out="$("$zaya" bench gemm --model zaya1-8b --tokens 4096 --list)" || fail "--list exited non-zero"
echo "$out" | grep -q "^experts.gate_up.fwd .* 16 " || fail "no grouped expert GEMM listed: $out"
echo "$out" | grep -q "^lm_head.fwd" || fail "no lm_head GEMM"
out="$("$zaya" bench gemm --m 256:1024:x2 --n 512 --k 128,256 --list)" || fail "range --list"
[ "$(echo "$out" | grep -c '^sweep ')" = 6 ] || fail "expected 3x1x2 shapes: $out"
out="$("$zaya" bench gemm --m 256 --n 512 --list 2>&1)"
[ $? -ne 0 ] || fail "--m/--n without --k accepted"
echo "$out" | grep -q -- "--k" || fail "message does not mention --k: $out"
out="$("$zaya" bench gemm --m 1024:256:x2 --n 1 --k 1 --list 2>&1)"
[ $? -ne 0 ] || fail "descending range accepted"
out="$("$zaya" bench gemm --model no-such-preset --list 2>&1)"
[ $? -ne 0 ] || fail "unknown model accepted"
out="$("$zaya" bench gemm --m 256 --n 256 --k 256 --cuda-graph fp8,int8 --list 2>&1)"
[ $? -ne 0 ] || fail "--cuda-graph int8 accepted"
echo "$out" | grep -q -- "--cuda-graph.*int8" || fail "message does not name --cuda-graph: $out"
"$zaya" bench gemm --m 256 --n 256 --k 256 --cuda-graph bf16,fp8 --list >/dev/null ||
  fail "--cuda-graph bf16,fp8 rejected"
out="$("$zaya" bench nosuch 2>&1)"
[ $? -ne 0 ] || fail "unknown sub-command accepted"
echo "PASS"
