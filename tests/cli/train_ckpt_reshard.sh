#!/bin/bash
# Sharded checkpoints reshaped between world sizes, under mpirun (CPU ranks, ZeRO-1 with expert
# and row slices, so the pieces of one tensor straddle rank files):
#  - a checkpoint saved at N = 4 (step 6 of 12) is loaded at M = 1, 2, 3, 4, and one saved by one
#    process at M = 3: re-saved right after loading, every weight and every optimizer/balancing
#    tensor equals the saved one bit for bit (assembled name by name from the rank files here, by
#    an independent reader), and the data cursor is the same;
#  - training continues from it to step 12: the per-step losses and the final weights match the
#    uninterrupted N = 4 run within fp32 reduction-order noise, bit for bit at M = 4;
#  - the global samples trained on (ZAYA_TRACE_SAMPLES) before and after the resume are exactly
#    the uninterrupted run's, step by step: none skipped, none twice.
# Usage: bash train_ckpt_reshard.sh <zaya-binary> <source-dir>   (skips, exit 0, without MPI)
set -u
zaya="$1"
src="$2"
# shellcheck source=tests/cli/lib/tiny_run.sh
source "$src/tests/cli/lib/tiny_run.sh"
mpi_script_setup
tiny_run_data "$T/ds" "$src" || fail "data prepare"
tiny_run_toml "$T/ds" 12 4 > "$T/run.toml"

run() {  # run NAME NP ARGS... : trains into $T/NAME with the sample trace
  local name="$1" np="$2"
  shift 2
  local cmd=("$zaya" train --config "$T/run.toml" --out "$T/$name" --quiet "$@")
  if [ "$np" = 0 ]; then ZAYA_TRACE_SAMPLES="$T/$name/trace" "${cmd[@]}"
  else timeout 300 mpirun -np "$np" --oversubscribe -x ZAYA_TRACE_SAMPLES="$T/$name/trace" "${cmd[@]}"
  fi > "$T/$name.log" 2>&1 || { tail -30 "$T/$name.log"; fail "$name"; }
}
start=$SECONDS
mkdir -p "$T/u4" "$T/a4" "$T/b1"
run u4 4                 # uninterrupted
run a4 4 --steps 6       # saves step 6 at N = 4
run b1 0 --steps 6       # saves step 6 in one process
for m in 1 2 3 4; do
  # Load at M and save again at once (the run is at its end): the state as loaded.
  cp -r "$T/a4" "$T/s$m"
  run "s$m" "$m" --steps 6 --resume auto
  grep -q "written by 4 ranks" "$T/s$m.log" || fail "s$m did not report the world that wrote it"
  # Continue to the end at M.
  cp -r "$T/a4" "$T/c$m" && rm -f "$T/c$m"/trace.rank*
  run "c$m" "$m" --resume auto
done
cp -r "$T/b1" "$T/s13" && run s13 3 --steps 6 --resume auto
cp -r "$T/b1" "$T/c13" && rm -f "$T/c13"/trace.rank* && run c13 3 --resume auto
echo "training runs: $((SECONDS - start)) s"
ls "$T/a4/checkpoints/step-00000006/state" | grep -c "rank-0000[0-3]-of-00004" | grep -qx 4 ||
  fail "the N = 4 checkpoint does not have 4 rank files"

python3 - "$T" <<'PY' || fail "reshaping"
import json, struct, sys, os
T = sys.argv[1]

def safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    data = b[8 + n:]
    return meta, {k: (v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}

def numel(s):
    p = 1
    for d in s:
        p *= d
    return p

def checkpoint(d):
    """Every tensor of a checkpoint, assembled from its pieces: name -> bytes (fp32, row-major)."""
    out = {}
    for f in sorted(os.listdir(f"{d}/model")):
        if f.endswith(".safetensors"):
            for k, (s, b) in safetensors(f"{d}/model/{f}")[1].items():
                assert k not in out, f"weight {k} in two shards"
                out["w:" + k] = b
    parts = {}
    for f in sorted(os.listdir(f"{d}/state")):
        meta, ts = safetensors(f"{d}/state/{f}")
        pieces = json.loads(meta["zaya.pieces"])
        for k, (s, b) in ts.items():
            g, off = pieces[k]["global_shape"], pieces[k]["offset"]
            # zaya slices by dim 0 only: the rest of the piece is whole.
            assert off[1:] == [0] * (len(g) - 1) and s[1:] == g[1:], (f, k, s, g, off)
            row = numel(g[1:]) * 4
            buf = parts.setdefault(k, (g, bytearray(numel(g) * 4), []))
            buf[1][off[0] * row:off[0] * row + len(b)] = b
            buf[2].append((off[0], s[0]))
    for k, (g, buf, spans) in parts.items():
        spans.sort()
        pos = 0
        for first, cnt in spans:
            assert first == pos, f"{d}: {k} pieces leave a gap or overlap at row {pos}"
            pos += cnt
        assert pos == (g[0] if g else 1), f"{d}: {k} covers {pos} of {g[0]} rows"
        out["s:" + k] = bytes(buf)
    return out

def trainer(d):
    return json.load(open(f"{d}/trainer.json"))

ck = lambda n: f"{T}/{n}/checkpoints/step-00000006"
saved4, saved1 = checkpoint(ck("a4")), checkpoint(ck("b1"))
assert trainer(ck("a4"))["world"] == 4 and trainer(ck("b1"))["world"] == 1
nstate = sum(k.startswith("s:") for k in saved4)
assert nstate > 10, f"only {nstate} state tensors"
for n, ref, rt in [("s1", saved4, "a4"), ("s2", saved4, "a4"), ("s3", saved4, "a4"),
                   ("s4", saved4, "a4"), ("s13", saved1, "b1")]:
    got = checkpoint(ck(n))
    assert got.keys() == ref.keys(), (n, sorted(set(got) ^ set(ref))[:5])
    bad = [k for k in ref if got[k] != ref[k]]
    assert not bad, f"{n}: {len(bad)} tensors differ after loading, e.g. {bad[:3]}"
    a, b = trainer(ck(n)), trainer(ck(rt))
    for f in ["step", "tokens", "phase", "optimizer_steps", "balancing_steps", "data_cursor"]:
        assert a[f] == b[f], (n, f, a[f], b[f])
    print(f"{n}: loaded at world {a['world']} from world {b['world']}: {len(ref)} tensors bit-identical")

def metrics(n):
    return {j["step"]: j for j in map(json.loads, open(f"{T}/{n}/metrics.jsonl"))}
def weights(n):
    return {k: v[1] for k, v in safetensors(f"{T}/{n}/model/model.safetensors")[1].items()}
def floats(b):
    return struct.unpack(f"<{len(b) // 4}f", b)
def trace(n):
    steps = {}
    for f in os.listdir(f"{T}/{n}"):
        if f.startswith("trace.rank"):
            for line in open(f"{T}/{n}/{f}"):
                p = line.split()
                steps.setdefault(int(p[0]), []).extend(p[1:])
    return steps

u = metrics("u4")
uw, ut = weights("u4"), trace("u4")
assert sorted(u) == list(range(1, 13)) and sorted(ut) == list(range(1, 13))
before4, before1 = trace("a4"), trace("b1")
for n, before in [("c1", before4), ("c2", before4), ("c3", before4), ("c4", before4),
                  ("c13", before1)]:
    m = metrics(n)
    assert sorted(m) == list(range(1, 13)), (n, sorted(m))
    dl = max(abs(m[s]["loss"] - u[s]["loss"]) for s in range(7, 13))
    w = weights(n)
    dw = max(max(abs(x - y) for x, y in zip(floats(w[k]), floats(uw[k]))) for k in uw)
    exact = n == "c4"
    if exact:
        assert all(m[s]["loss"] == u[s]["loss"] for s in range(1, 13)), f"{n}: losses not bit-identical"
        assert all(w[k] == uw[k] for k in uw), f"{n}: final weights not bit-identical"
    assert dl <= 1e-5 and dw <= 1e-4, f"{n}: loss diff {dl:.3e}, weight diff {dw:.3e}"
    # The samples: steps 1-6 from the first run, 7-12 from the resumed one, as uninterrupted.
    after = trace(n)
    assert sorted(after) == list(range(7, 13)), (n, sorted(after))
    for s in range(1, 13):
        got = sorted((before if s <= 6 else after)[s])
        assert got == sorted(ut[s]), f"{n}: step {s} trained on other samples"
    # Sample ids count from 0 in each phase's loader: the long phase is steps 5-12, across the
    # resume.
    long = [i for s in range(5, 7) for i in before[s]] + [i for s in range(7, 13) for i in after[s]]
    assert len(long) == len(set(long)) == 8 * 12, f"{n}: a sample of the long phase trained on twice"
    print(f"{n}: resumed, steps 7-12 loss diff {dl:.2e}, final weight diff {dw:.2e}"
          f"{' (bit-identical)' if exact else ''}; samples = uninterrupted run's, none twice")
PY
echo "train_ckpt_reshard: ok"
