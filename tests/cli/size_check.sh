#!/usr/bin/env bash
# `zaya size check` end to end: ZAYA1-base on MI300X and H200 (exit 0, JSON report with every rule,
# the ZAYA1 parameter counts and the 40 KiB/token KV cache), a failing rule exits 3 (one H100 cannot
# hold ZAYA1's training state), a measured profile is accepted, and bad input (unknown hardware,
# impossible configs, both --preset and --config, a bad global batch) exits non-zero with a message
# naming the value.
# usage: bash size_check.sh <zaya-binary> <source-dir>
set -euo pipefail
ZAYA=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for hw in mi300x h200; do
  "$ZAYA" size check --preset zaya1-base --hardware $hw --ranks 8 --micro-batch 4 --seq 4096 \
    --json "$T/$hw.json" > "$T/$hw.out" 2>&1 || { cat "$T/$hw.out"; fail "check on $hw exited $?"; }
  grep -q "^head_dim *pass" "$T/$hw.out" || { cat "$T/$hw.out"; fail "no head_dim row on $hw"; }
  python3 - "$T/$hw.json" "$hw" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1])); hw = sys.argv[2]
assert j["schema"] == "zaya.size_check/1", j["schema"]
ids = [r["id"] for r in j["rules"]]
for want in ["head_dim", "width.hidden", "width.attention_q", "width.attention_kv", "width.expert",
             "width.router", "vocab", "gemm.knee", "gemm.wave", "expert.tokens", "flops.split",
             "kv_cache", "memory", "collectives"]:
    assert want in ids, (want, ids)
for r in j["rules"]:
    assert r["status"] in ("pass", "warn", "fail"), r
    assert r["why"] and r["source"] and r["threshold"], r
assert j["result"] != "fail", j["result"]
assert j["params"]["total"] == 8303355728, j["params"]
assert j["params"]["active"] == 753608528, j["params"]
kv = [r for r in j["rules"] if r["id"] == "kv_cache"][0]
assert kv["numbers"]["kv_bytes_per_token"] == 40 * 1024
wave = [r for r in j["rules"] if r["id"] == "gemm.wave"][0]
want = {"mi300x": 64 / 304, "h200": 768 / 792}[hw]  # router_down on MI300X, qkv_proj on H200
assert abs(wave["numbers"]["worst"] - want) < 1e-9, wave["numbers"]["worst"]
t = j["training"]
assert abs(t["model_flops_per_token"] - 8745209856) < 1, t["model_flops_per_token"]
assert 0 < t["mfu"] < 1 and t["tokens_per_s"] > 0
assert j["hardware"]["topology"] == {"mi300x": "fully_connected", "h200": "switch"}[hw]
PYEOF
done

# A rule that fails: one H100 cannot hold ZAYA1's weights, gradients and optimizer states.
set +e
"$ZAYA" size check --preset zaya1-base --hardware h100 --ranks 1 --micro-batch 1 \
  --json "$T/h100.json" > "$T/h100.out" 2>&1
rc=$?
set -e
[ $rc -eq 3 ] || { cat "$T/h100.out"; fail "expected exit 3 for a failing rule, got $rc"; }
grep -q "^memory *fail" "$T/h100.out" || fail "memory rule did not fail"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['result']=='fail'" "$T/h100.json"

# A measured profile (with fallback to the built-in H200 for the fields it lacks).
"$ZAYA" size check --preset zaya1-base --hardware "$SRC/tests/sizing/h200_measured.json" \
  --json "$T/m.json" > "$T/m.out" 2>&1 || { cat "$T/m.out"; fail "measured profile rejected"; }
python3 - "$T/m.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
h = j["hardware"]
assert h["measured"] and h["peak_bf16_tflops"] == 790 and h["hbm_gib"] == 141, h
knee = [r for r in j["rules"] if r["id"] == "gemm.knee"][0]
assert knee["numbers"]["knee_gflop"] == 60, knee["numbers"]["knee_gflop"]
PYEOF

"$ZAYA" size check --preset tiny --hardware a100 --ranks 1 --micro-batch 1 --seq 256 \
  > "$T/tiny.out" 2>&1 || { cat "$T/tiny.out"; fail "tiny on a100"; }

# A config.json written by hand with ZAYA1.md §1's values gives the same counts as the preset.
cat > "$T/zaya1.json" <<'JSON'
{"model_type": "zaya", "vocab_size": 262272, "hidden_size": 2048, "num_hidden_layers": 40,
 "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "moe_intermediate_size": 2048,
 "num_experts": 16, "num_experts_per_tok": 1, "router_hidden_size": 256, "cca_time0": 2,
 "cca_time1": 2, "max_position_embeddings": 4096, "tie_word_embeddings": true}
JSON
"$ZAYA" size check --config "$T/zaya1.json" --hardware b200 --json "$T/cfg.json" > "$T/cfg.out" 2>&1 \
  || { cat "$T/cfg.out"; fail "check --config"; }
python3 - "$T/cfg.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["params"]["total"] == 8303355728 and j["params"]["active"] == 753608528, j["params"]
kv = [r for r in j["rules"] if r["id"] == "kv_cache"][0]
assert kv["numbers"]["context"] == 4096, kv["numbers"]
assert j["hardware"]["key"] == "b200" and j["hardware"]["compute_units"] == 148
PYEOF

# The built-in profiles, listed and printed.
"$ZAYA" size hardware > "$T/hw.out"
[ "$(wc -l < "$T/hw.out")" -eq 6 ] || { cat "$T/hw.out"; fail "expected 6 built-in profiles"; }
"$ZAYA" size hardware --hardware mi300x > "$T/hw.json"
python3 -c "
import json, sys
h = json.load(open(sys.argv[1]))
assert h['compute_units'] == 304 and h['topology'] == 'fully_connected' and h['links_per_gpu'] == 7, h
" "$T/hw.json"

expect_error() {  # expect_error <exit code> <message fragment> <args...>
  local code=$1 msg=$2; shift 2
  set +e
  "$ZAYA" size "$@" > "$T/err.out" 2>&1
  local rc=$?
  set -e
  [ $rc -eq "$code" ] || { cat "$T/err.out"; fail "size $* exited $rc, expected $code"; }
  grep -qF -- "$msg" "$T/err.out" || { cat "$T/err.out"; fail "size $*: no '$msg' in the message"; }
}
expect_error 1 "unknown hardware 'tpu'" check --preset zaya1-base --hardware tpu
expect_error 1 "known: mi300x, mi325x, h100, h200, b200, a100" check --preset zaya1-base --hardware tpu
expect_error 1 "unknown model preset 'zaya9'" check --preset zaya9 --hardware h200
expect_error 1 "give the model with --preset NAME or --config FILE" check --hardware h200
expect_error 2 "excludes" check --preset tiny --config x.json --hardware h200
expect_error 2 "--hardware is required" check --preset tiny
expect_error 1 "--global-batch 12 must be a positive multiple of" check --preset tiny --hardware h200 --ranks 8 --micro-batch 1 --global-batch 12
expect_error 1 "--micro-batch must be positive" check --preset tiny --hardware h200 --micro-batch 0
expect_error 1 "--optimizer must be muon or adamw" check --preset tiny --hardware h200 --optimizer sgd

cat > "$T/bad_heads.json" <<'JSON'
{"model_type": "zaya", "vocab_size": 384, "hidden_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 6, "num_key_value_heads": 4, "head_dim": 32}
JSON
expect_error 1 "num_attention_heads (6) must be a multiple of num_key_value_heads (4)" check --config "$T/bad_heads.json" --hardware h200
cat > "$T/zero.json" <<'JSON'
{"model_type": "zaya", "vocab_size": 384, "hidden_size": 0, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
JSON
expect_error 1 "hidden_size must be positive" check --config "$T/zero.json" --hardware h200
echo '{"schema": "zaya.hardware/1", "device": "Acme X1"}' > "$T/acme.json"
expect_error 1 "device 'Acme X1' is not a built-in profile" check --preset tiny --hardware "$T/acme.json"
echo "ok"
