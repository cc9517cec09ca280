#!/bin/bash
# `zaya ckpt` on the checkpoints of a 4-rank CPU training run (mpirun -np 4, ZeRO-1, experts split
# between ranks):
#  - inspect: text and --json (step, world, save id, the manifest's files and sizes, the model's
#    parameters against the shard headers, each state tensor's pieces and ranks), and a root (each
#    checkpoint's status, then the newest);
#  - verify: exit 0 on the checkpoint; exit 1 naming the file after one flipped byte, a truncated
#    shard, a deleted rank file; on a root, exit 1 when one checkpoint is bad;
#  - export-hf: fp32 and bf16 exports load with `zaya eval`: the fp32 one gives the checkpoint's
#    loss exactly, the bf16 one holds the round-to-nearest-even bf16 of every fp32 weight
#    (checked here in Python, independently of zaya) and a loss close to it; config.json's dtype;
#  - reshard 4 -> 3 and 4 -> 1: `inspect --digest` equal to the source's for every name, each
#    output verifies, and a 3-rank run resumed from the reshaped checkpoint trains bit for bit
#    like one resumed from the original;
#  - refusals (bad --ranks, an existing --out, not a checkpoint, an output inside the input)
#    name the field or file, exit non-zero and leave nothing behind.
# Usage: bash ckpt_tools.sh <zaya-binary> <source-dir>   (skips, exit 0, without MPI)
set -u
zaya="$1"
src="$2"
# shellcheck source=tests/cli/lib/tiny_run.sh
source "$src/tests/cli/lib/tiny_run.sh"
mpi_script_setup
mpi() { timeout 300 mpirun -np "$1" --oversubscribe "${@:2}"; }
start=$SECONDS

tiny_run_data "$T/ds" "$src" || fail "data prepare"
# 4 steps (2 at seq_len 24, 2 at 32) of 12 sequences, a checkpoint every 2: 4, 3 and 1 ranks all
# divide the global batch, 5 does not.
tiny_run_toml "$T/ds" 4 2 2 > "$T/run.toml"
mpi 4 "$zaya" train --config "$T/run.toml" --out "$T/run" --quiet > "$T/train.log" 2>&1 \
  || { tail -20 "$T/train.log"; fail "4-rank training"; }
CK="$T/run/checkpoints/step-00000004"
[ -f "$CK/manifest.json" ] || fail "no checkpoint at step 4"
echo "4-rank training: $((SECONDS - start)) s"

# --- inspect ---------------------------------------------------------------------------------
"$zaya" ckpt inspect "$CK" > "$T/inspect.txt" 2>&1 || { cat "$T/inspect.txt"; fail "inspect"; }
grep -q "step 4, 1344 tokens, phase 1" "$T/inspect.txt" || { cat "$T/inspect.txt"; fail "inspect: step/tokens"; }
grep -q "written by 4 ranks" "$T/inspect.txt" || fail "inspect: world"
grep -q "^state: .* in 4 files (written by 4 ranks)" "$T/inspect.txt" || fail "inspect: state files"
grep -q "^model: 4 layers" "$T/inspect.txt" || fail "inspect: model"
"$zaya" ckpt inspect "$CK" --json > "$T/inspect.json" || fail "inspect --json"
python3 - "$CK" "$T/inspect.json" <<'PY' || fail "inspect --json fields"
import json, os, struct, sys
ck, path = sys.argv[1], sys.argv[2]
j = json.load(open(path))
man = json.load(open(f"{ck}/manifest.json"))
tr = json.load(open(f"{ck}/trainer.json"))
assert j["step"] == 4 == tr["step"] and j["world"] == 4 and j["tokens"] == tr["tokens"], j
assert j["save_id"] == tr["save_id"] == man["extra"]["save_id"] != "", j["save_id"]
assert [(f["path"], f["size"]) for f in j["files"]] == [(f["path"], f["size"]) for f in man["files"]]
for f in j["files"]:
    assert os.path.getsize(f"{ck}/{f['path']}") == f["size"], f
# Parameters and shards against the shard headers themselves.
idx = json.load(open(f"{ck}/model/model.safetensors.index.json"))
params, per_file = 0, {}
for fname in sorted(set(idx["weight_map"].values())):
    with open(f"{ck}/model/{fname}", "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
    hdr.pop("__metadata__", None)
    per_file[f"model/{fname}"] = len(hdr)
    for t in hdr.values():
        k = 1
        for d in t["shape"]: k *= d
        params += k
m = j["model"]
assert m["layers"] == 4 and m["params"] == params and m["weight_bytes"] == 4 * params, (m, params)
assert {s["file"]: s["tensors"] for s in m["shards"]} == per_file, (m["shards"], per_file)
st = j["state"]
assert st["world"] == 4 and st["files"] == [f"state/rank-{r:05d}-of-00004.safetensors" for r in range(4)], st["files"]
split = [t for t in st["tensors"] if t["pieces"] > 1]
assert split, "no state tensor split between ranks (the CPU plan splits the experts)"
for t in st["tensors"]:
    assert set(t["ranks"]) <= {0, 1, 2, 3} and len(t["ranks"]) <= t["pieces"], t
    if t["name"].startswith("balance."): assert t["ranks"] == [0] and t["pieces"] == 1, t
assert {r for t in split for r in t["ranks"]} == {0, 1, 2, 3}
print(f"inspect --json: {len(st['tensors'])} state tensors, {len(split)} split, {params} parameters")
PY
"$zaya" ckpt inspect "$T/run" > "$T/root.txt" 2>&1 || { cat "$T/root.txt"; fail "inspect on a run directory"; }
grep -q "step-00000002  valid" "$T/root.txt" && grep -q "step-00000004  valid" "$T/root.txt" \
  || { cat "$T/root.txt"; fail "inspect root: statuses"; }
grep -q "^newest valid: .*step-00000004" "$T/root.txt" || fail "inspect root: newest"

# --- verify ----------------------------------------------------------------------------------
"$zaya" ckpt verify "$CK" > "$T/verify.txt" 2>&1 || { cat "$T/verify.txt"; fail "verify of a good checkpoint"; }
grep -q "valid" "$T/verify.txt" || fail "verify: no verdict"
corrupt() {  # corrupt NAME FILE ACTION: verify must exit 1 and name FILE
  local d="$T/$1/step-00000004" rc=0
  mkdir -p "$T/$1" && cp -r "$CK" "$d"
  case "$3" in
    flip) python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=1; open(p,'wb').write(b)" "$d/$2" ;;
    truncate) truncate -s -5 "$d/$2" ;;
    delete) rm "$d/$2" ;;
  esac
  "$zaya" ckpt verify "$d" > "$T/$1.txt" 2>&1 || rc=$?
  [ "$rc" = 1 ] || { cat "$T/$1.txt"; fail "verify after $3 of $2 exited $rc, expected 1"; }
  grep -q "INVALID" "$T/$1.txt" && grep -q "$2" "$T/$1.txt" || { cat "$T/$1.txt"; fail "verify after $3: $2 not named"; }
}
corrupt flipped state/rank-00002-of-00004.safetensors flip
corrupt truncated model/model-00001-of-00004.safetensors truncate
corrupt deleted state/rank-00003-of-00004.safetensors delete
cp -r "$T/run/checkpoints" "$T/root2"
truncate -s -1 "$T/root2/step-00000002/trainer.json"
rc=0; "$zaya" ckpt verify "$T/root2" > "$T/root2.txt" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$T/root2.txt"; fail "verify of a root with one bad checkpoint exited $rc"; }
grep -q "1 of 2 checkpoints valid; --resume auto would take .*step-00000004" "$T/root2.txt" \
  || { cat "$T/root2.txt"; fail "verify root summary"; }

# --- export-hf -------------------------------------------------------------------------------
"$zaya" ckpt export-hf "$CK" --out "$T/hf32" --dtype fp32 > "$T/exp32.txt" 2>&1 || { cat "$T/exp32.txt"; fail "export fp32"; }
"$zaya" ckpt export-hf "$CK" --out "$T/hf16" --max-shard-mb 1 > "$T/exp16.txt" 2>&1 || { cat "$T/exp16.txt"; fail "export bf16"; }
[ -f "$T/hf16/model.safetensors.index.json" ] || fail "export bf16: no index of its 1 MiB shards"
[ -f "$T/hf16/tokenizer.txt" ] || fail "export: the run's byte tokenizer was not exported"
head -c 3000 "$src/README.md" > "$T/eval.txt"
ev() { "$zaya" eval --model "$1" --text-file "$T/eval.txt" --seq 64 | python3 -c "import json,sys; print(json.load(sys.stdin)['loss'])"; }
l_ck=$(ev "$CK/model") && l32=$(ev "$T/hf32") && l16=$(ev "$T/hf16") || fail "zaya eval"
[ "$l_ck" = "$l32" ] || fail "eval: fp32 export $l32, checkpoint $l_ck"
python3 - "$CK/model" "$T/hf32" "$T/hf16" "$l_ck" "$l16" <<'PY' || fail "export contents"
import array, json, struct, sys
ck, hf32, hf16, l_ck, l16 = sys.argv[1:6]
def tensors(d):
    try: files = sorted(set(json.load(open(f"{d}/model.safetensors.index.json"))["weight_map"].values()))
    except FileNotFoundError: files = ["model.safetensors"]
    out = {}
    for f in files:
        b = open(f"{d}/{f}", "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
        for name, t in h.items():
            s, e = t["data_offsets"]
            out[name] = (t["dtype"], b[8 + n + s:8 + n + e])
    return out
a, b32, b16 = tensors(ck), tensors(hf32), tensors(hf16)
assert set(a) == set(b32) == set(b16), "tensor names differ"
assert json.load(open(f"{hf32}/config.json"))["dtype"] == "float32"
assert json.load(open(f"{hf16}/config.json"))["dtype"] == "bfloat16"
n = 0
for name, (dt, raw) in a.items():
    assert dt == "F32" and b32[name] == ("F32", raw), name
    dt16, raw16 = b16[name]
    if name.endswith("balancing_biases"):
        assert (dt16, raw16) == ("F32", raw), name
        continue
    assert dt16 == "BF16", (name, dt16)
    u, h = array.array("I", raw), array.array("H", raw16)
    assert len(u) == len(h)
    for x, y in zip(u, h):
        if (x & 0x7fffffff) > 0x7f800000: want = (x >> 16) | 0x40
        else: want = ((x + 0x7fff + ((x >> 16) & 1)) >> 16) & 0xffff
        assert y == want, (name, hex(x), hex(y), hex(want))
    n += len(u)
assert abs(float(l16) - float(l_ck)) < 0.02, (l16, l_ck)
print(f"export: {len(a)} tensors, {n} bf16 values rounded to nearest even; loss fp32 {l_ck}, bf16 {l16}")
PY

# --- reshard ---------------------------------------------------------------------------------
"$zaya" ckpt reshard "$CK" --ranks 3 --out "$T/r3" > "$T/r3.log" 2>&1 || { cat "$T/r3.log"; fail "reshard 4 -> 3"; }
"$zaya" ckpt reshard "$CK" --ranks 1 --out "$T/r1" > "$T/r1.log" 2>&1 || { cat "$T/r1.log"; fail "reshard 4 -> 1"; }
for d in "$CK" "$T/r3" "$T/r1"; do
  "$zaya" ckpt inspect "$d" --digest --json > "$d.digest.json" || fail "inspect --digest $d"
done
for m in 3 1; do
  "$zaya" ckpt verify "$T/r$m" > "$T/v$m.txt" 2>&1 || { cat "$T/v$m.txt"; fail "verify of the 4 -> $m checkpoint"; }
done
python3 - "$CK.digest.json" "$T/r3.digest.json" "$T/r1.digest.json" <<'PY' || fail "reshard digests"
import json, sys
src, r3, r1 = (json.load(open(p)) for p in sys.argv[1:4])
d = src["digests"]
assert len(d) == len(src["state"]["tensors"]) + src["model"]["tensors"] > 50, len(d)
assert len(set(d.values())) > len(d) // 2, "digests look constant"
for j, m in ((r3, 3), (r1, 1)):
    assert j["world"] == m and j["state"]["world"] == m and len(j["state"]["files"]) == m, j["state"]["files"]
    assert j["step"] == src["step"] and j["save_id"] != src["save_id"]
    assert j["manifest_extra"]["resharded_from"] == {"world": 4, "save_id": src["save_id"]}
    diff = [k for k in d if j["digests"].get(k) != d[k]]
    assert not diff and set(j["digests"]) == set(d), diff[:5]
print(f"reshard: {len(d)} digests identical at 4, 3 and 1 ranks")
PY
# Resumed at 3 ranks: from the reshaped checkpoint as from the original, bit for bit.
mpi 3 "$zaya" train --config "$T/run.toml" --steps 6 --out "$T/res_src" --resume "$CK" --quiet > "$T/res_src.log" 2>&1 \
  || { tail -20 "$T/res_src.log"; fail "resume from the original at 3 ranks"; }
mpi 3 "$zaya" train --config "$T/run.toml" --steps 6 --out "$T/res_r3" --resume "$T/r3" --quiet > "$T/res_r3.log" 2>&1 \
  || { tail -20 "$T/res_r3.log"; fail "resume from the reshaped checkpoint at 3 ranks"; }
[ "$(wc -l < "$T/res_src/metrics.jsonl")" = 2 ] || fail "the resumed runs did not train 2 steps"
python3 - "$T/res_src/metrics.jsonl" "$T/res_r3/metrics.jsonl" <<'PY' || fail "resume from the reshaped checkpoint differs"
import json, sys
a, b = ([(j["step"], j["loss"], j["grad_norm"]) for j in map(json.loads, open(p))] for p in sys.argv[1:3])
assert a == b and len(a) == 2, (a, b)
PY

# --- refusals --------------------------------------------------------------------------------
refused() {  # refused NEEDLE ARGS...: exits non-zero, stderr holds NEEDLE
  local needle="$1" rc=0; shift
  "$zaya" ckpt "$@" > "$T/refused.txt" 2>&1 || rc=$?
  [ "$rc" != 0 ] || { cat "$T/refused.txt"; fail "zaya ckpt $* was accepted"; }
  grep -qF -- "$needle" "$T/refused.txt" || { cat "$T/refused.txt"; fail "zaya ckpt $*: no '$needle' in the message"; }
}
refused "--ranks 0" reshard "$CK" --ranks 0 --out "$T/x0"
refused "phase.0.batch_size = 12" reshard "$CK" --ranks 5 --out "$T/x5"
refused "--force" reshard "$CK" --ranks 3 --out "$T/r3"
refused "--force" export-hf "$CK" --out "$T/hf32"
refused "input" export-hf "$CK" --out "$CK/model" --force
refused "not a checkpoint" inspect "$T/hf32"
refused "no such directory" verify "$T/absent"
refused "expected at least 1" export-hf "$CK" --out "$T/x6" --max-shard-mb 0
for x in x0 x5 x6; do [ ! -e "$T/$x" ] || fail "a refused command left $T/$x"; done
! ls -a "$T" "$T/run" | grep -q '^\.tmp-' || fail "staging directories left behind"
"$zaya" ckpt verify "$T/r3" > /dev/null || fail "the refused --force-less reshard damaged $T/r3"
echo "ckpt tools: ok ($((SECONDS - start)) s)"
