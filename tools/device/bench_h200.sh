#!/bin/bash
# Characterizes one H200 machine with zaya's own benchmarks and a PyTorch peer (about 5 minutes),
# for the lead to run on the device machine from the repository root:
#     bash tools/device/bench_h200.sh
# Builds zaya with CUDA (sm_90a), runs `zaya bench mem`, `zaya bench gemm` (knee, wave sweep,
# ZAYA1-8B training-step GEMMs incl. grouped experts; bf16 and fp8), `zaya bench comm --backend
# nccl` on all visible GPUs when mpirun exists, then tools/bench_peer.py on the same shapes, and
# compares (target: our GEMM and copy figures within 2% of the peer's). Everything lands in
# $OUT/bench_h200.tgz (JSON, CSV, SVG, logs, profile) plus $OUT/summary.txt.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/bench_out}"
mkdir -p "$OUT"
W="$(mktemp -d)/bench_h200"
mkdir -p "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
summary="$W/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
finish() {
  cp "$summary" "$OUT/summary.txt" 2>/dev/null
  tar -C "$(dirname "$W")" -czf "$OUT/bench_h200.tgz" bench_h200
  echo "results: $OUT/bench_h200.tgz, $OUT/summary.txt"
}
trap finish EXIT

note "# zaya bench on $(hostname) at $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version \
  --format=csv >"$W/nvidia-smi.csv" 2>&1 && note "$(cat "$W/nvidia-smi.csv")"

# ---- build ----
jobs="$(nproc)"
if ! { cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_TESTS=OFF &&
       ninja -C build-h200 -j "$jobs" zaya; } >"$W/build.log" 2>&1; then
  note "BUILD FAILED (tail of build.log):"
  tail -30 "$W/build.log" | tee -a "$summary"
  exit 1
fi
Z="$root/build-h200/zaya"
note "$("$Z" version)"

# ---- zaya benchmarks ----
run() {  # run NAME CMD...: log to NAME.log, note the status
  local name="$1"; shift
  local t0=$SECONDS
  "$@" >"$W/$name.log" 2>&1
  local rc=$?
  note "$name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || tail -5 "$W/$name.log" | tee -a "$summary"
  return $rc
}
P="$W/hardware_profile.json"
run mem "$Z" bench mem -b 256K -e 4G -f 2 --json "$W/mem.json" --csv "$W/mem.csv" \
  --svg "$W/mem.svg" --profile "$P"
run gemm "$Z" bench gemm --dtype bf16,fp8 --knee --knee-max 16384 --waves 1024:8192:+256 \
  --wave-k 4096 --model zaya1-8b --tokens 8192 --json "$W/gemm.json" --csv "$W/gemm.csv" \
  --svg "$W/gemm.svg" --profile "$P"
ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
if command -v mpirun >/dev/null && [ "$ngpu" -ge 1 ]; then
  run comm_nccl mpirun -np "$ngpu" --oversubscribe "$Z" bench comm --backend nccl -b 8 -e 256M \
    -f 4 --ops all --dtype bfloat16 --inplace both -n 20 -w 5 --sweep-ranks \
    --json "$W/comm_nccl.json" --csv "$W/comm_nccl.csv" --svg "$W/comm_nccl.svg" --profile "$P"
else
  note "comm: skipped (no mpirun or no GPU)"
fi

# ---- peer ----
run peer python3 tools/bench_peer.py --gemm-json "$W/gemm.json" --out "$W/peer.json"

# ---- comparison ----
python3 - "$W" >>"$summary" 2>&1 <<'PY'
import json, os, sys
W = sys.argv[1]
def load(n):
    p = os.path.join(W, n)
    return json.load(open(p)) if os.path.exists(p) else None
gemm, mem, peer, prof = load("gemm.json"), load("mem.json"), load("peer.json"), load("hardware_profile.json")
if prof:
    print("\n## hardware profile")
    for k in ("device", "sm_count", "peak_tflops", "hbm_capacity_gib", "copy_bandwidth_gbs",
              "read_bandwidth_gbs", "h2d_pinned_gbs", "d2h_pinned_gbs", "knee_gflop"):
        print(f"{k:20} {json.dumps(prof.get(k))}")
if gemm:
    wrong = sum(r["wrong"] for r in gemm["results"])
    print(f"\n## gemm: {len(gemm['results'])} rows, {wrong} sampled outputs wrong")
if peer and "error" in peer:
    print("\npeer:", peer["error"])
if gemm and peer and "gemm" in peer:
    ours = {(r["m"], r["n"], r["k"], r["groups"], r["dtype"]): r for r in gemm["results"]
            if r["method"] in ("lt", "lt-batched")}
    print("\n## GEMM: zaya vs PyTorch (TFLOP/s; ratio = zaya/peer; target >= 0.98)")
    print(f"{'name':24} {'m':>6} {'n':>6} {'k':>6} {'grp':>4} {'dtype':>5} {'zaya':>8} {'torch':>8} {'ratio':>6}")
    ratios = {"bf16": [], "fp8": []}
    for p in peer["gemm"]:
        key = (p["m"], p["n"], p["k"], p["groups"], p["dtype"])
        o = ours.get(key)
        if not o or "tflops" not in p:
            continue
        ratio = o["tflops"] / p["tflops"] if p["tflops"] > 0 else 0
        if p["groups"] == 1 or p["dtype"] == "bf16":
            ratios[p["dtype"]].append((ratio, o["shape"] if "shape" in o else o["name"], key))
        print(f"{o['name']:24} {key[0]:>6} {key[1]:>6} {key[2]:>6} {key[3]:>4} {key[4]:>5} "
              f"{o['tflops']:8.1f} {p['tflops']:8.1f} {ratio:6.3f}{'' if ratio >= 0.98 else '  <'}")
    for dt, rs in ratios.items():
        if rs:
            big = [r for r, _, k in rs if 2 * k[0] * k[1] * k[2] * k[3] / 1e9 >= 50]
            print(f"{dt}: {len(rs)} shapes, median ratio {sorted(r for r, _, _ in rs)[len(rs) // 2]:.3f}, "
                  f"min {min(r for r, _, _ in rs):.3f}; shapes >= 50 GFLOP: "
                  f"{'min %.3f' % min(big) if big else 'none'}")
if mem and peer and "mem" in peer:
    print("\n## device copy: zaya vs PyTorch / cudaMemcpy (GB/s, read + write)")
    ours = {}
    for r in mem["results"]:
        ours.setdefault(r["name"], {})[r["size"]] = r["gbs"]
    for p in peer["mem"]:
        if p["size"] < (64 << 20):
            continue
        z_copy = ours.get("copy", {}).get(p["size"])
        z_mc = ours.get("memcpy_d2d", {}).get(p["size"])
        best = max(x for x in (z_copy, z_mc, 0) if x is not None)
        print(f"{p['name']:15} {p['size']:>12} peer {p['gbs']:8.1f}  zaya copy {z_copy or 0:8.1f}"
              f"  zaya memcpy {z_mc or 0:8.1f}  ratio {best / p['gbs']:.3f}")
PY
