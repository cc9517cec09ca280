#!/usr/bin/env python3
"""Compares zaya's benchmark results with their peers; prints the summary of bench_h200.sh.

GEMM: zaya's `lt`/`lt-batched` rows of one or more `zaya bench gemm --json` runs (rounds) against
the PyTorch peer's rounds (tools/bench_peer.py; one file per round or several rounds per file).
The rounds are put in time order (by their rows' t_start; files without timestamps: each peer file
goes between the zaya runs before and after it, as bench_h200.sh runs them: Z P Z P ... Z). Per
shape, every round that has rounds of the other side just before and after it gives one ratio
zaya/torch against the geometric mean of those two neighbours (Z P Z P Z: 3 ratios), so a drift
linear in time cancels and the rounds compared are ~25 s apart, instead of whichever round of
each side happened to be fastest (the old Z P P Z has no such triple: its neighbouring pairs of
different sides are used, 2). Printed per shape: the best-of figures
(zaya, its in-process cuBLAS row, torch, their ratio: the old protocol), the number of ratios, their
median ("paired") and the lowest and highest, zaya/cuBLAS in the same rounds (seconds
apart, the same harness: algorithm alone), the mean SM clock and power of each side over its rows
(NVML samples in the rows, or --smi, an `nvidia-smi -lms` CSV joined by the rows' t_start/t_end),
and the clock-normalised paired ratio (TFLOP/s per MHz; see below).
Verdict per shape from the median of these ("paired") ratios: `ok` (>= target), `below` (at least
two ratios, every one below the target: a real shortfall), `unresolved` (below in the median, but
ratios on both sides of the target: the noise exceeds the gap); `+clk` when the clock-normalised ratio reaches the target
while the raw one does not (the shortfall went with a lower clock for zaya's rows).
Normalised ratio caveats: throughput is proportional to the SM clock only for compute-bound
kernels at a steady clock (not for memory-bound shapes, nor when the clock moves within a row: the
samples are ~1 ms apart); and at the power limit the clock is partly the kernel's own doing (a
kernel that moves more data per FLOP draws more power and is clocked lower), so a lower clock for
zaya at equal temperature can be zaya's cost, not luck. The raw paired median is what is judged.
Target: median paired ratio >= 0.98 on every shape (fp8 expert groups are listed but not counted:
the peer runs them as a loop of _scaled_mm calls, PyTorch having no batched fp8 matmul; its fp8
rows replay CUDA graphs where capture works, counted in the line "peer rows replayed").

Memory: zaya's copy kernel and cudaMemcpy against torch's copy_ and cudaMemcpyAsync (>= 64 MiB).
Collectives: `zaya bench comm --backend nccl` all_reduce rows (group "world") against
tools/nccl_direct (same sizes, placements, dtype, iteration counts); ratio = zaya algbw / peer algbw.

Usage: bench_peer_compare.py --gemm Z0.json [Z1.json ...] --peer P0.json [P1.json ...]
         [--mem mem.json] [--smi gpu_smi.csv [--smi-start EPOCH]] [--profile hw.json]
         [--comm comm.json --nccl-direct nccl_direct.json [--label 1-GPU]]...
"""
import argparse
import json
import math
import os
import statistics
import sys

TARGET = 0.98
# The rows that missed the target in docs/bench/h200-2026-12-02 (bf16 unless noted).
PREVIOUSLY_FAILING = [
    (1280, 1280, 4096, 1, "bf16"), (1536, 1536, 4096, 1, "bf16"), (1792, 1792, 4096, 1, "bf16"),
    (2048, 2048, 4096, 1, "bf16"), (8192, 8192, 8192, 1, "bf16"), (8192, 2048, 262272, 1, "bf16"),
    (11648, 11648, 11648, 1, "fp8"),
]


def load(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def key_of(r):
    return (r["m"], r["n"], r["k"], r["groups"], r["dtype"])


def best_and_spread(values):
    vals = [v for v in values if v and v > 0]
    if not vals:
        return None, None
    return max(vals), (max(vals) / min(vals) - 1 if len(vals) > 1 else 0.0)


def parse_smi(path, start_epoch=None, gpu=None):
    """`nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu
    --format=csv,nounits -lms 100` (run with TZ=UTC) as sorted (time, mhz, watts, celsius).
    With start_epoch (the sampler's start, Unix seconds), a time-zone offset that TZ=UTC failed to
    remove (a whole number of quarter hours between the first sample and the start) is taken off.
    gpu: the `index` to keep (default: the lowest listed)."""
    import calendar
    import csv
    from datetime import datetime
    rows = []
    with open(path) as f:
        rd = csv.reader(f)
        cols = None
        for line in rd:
            line = [c.strip() for c in line]
            if not line or not line[0]:
                continue
            if cols is None or line[0].startswith("timestamp"):
                cols = {c.split(" [")[0].strip(): i for i, c in enumerate(line)}
                continue
            try:
                ts = datetime.strptime(line[cols["timestamp"]], "%Y/%m/%d %H:%M:%S.%f")
                t = calendar.timegm(ts.timetuple()) + ts.microsecond * 1e-6
                idx = int(line[cols["index"]]) if "index" in cols else 0
                val = lambda name: float(line[cols[name]]) if name in cols else 0.0
                rows.append((t, idx, val("clocks.sm"), val("power.draw"), val("temperature.gpu")))
            except (ValueError, KeyError, IndexError):
                continue  # "[N/A]", a torn last line
    if not rows:
        return []
    keep = min(r[1] for r in rows) if gpu is None else gpu
    rows = sorted((t, m, w, c) for t, i, m, w, c in rows if i == keep)
    if start_epoch and rows:
        off = round((rows[0][0] - start_epoch) / 900.0) * 900.0
        rows = [(t - off, m, w, c) for t, m, w, c in rows]
    return rows


def join_smi(row, smi):
    """The mean clock, power, temperature of the samples in the row's window (widened by 50 ms;
    the nearest sample within 150 ms when none falls inside), or None."""
    import bisect
    if not smi or not row.get("t_end"):
        return None
    times = [s[0] for s in smi]
    lo = bisect.bisect_left(times, row["t_start"] - 0.05)
    hi = bisect.bisect_right(times, row["t_end"] + 0.05)
    pick = smi[lo:hi]
    if not pick:
        mid = 0.5 * (row["t_start"] + row["t_end"])
        near = min(smi[max(0, lo - 1):lo + 1], key=lambda s: abs(s[0] - mid), default=None)
        if near is None or abs(near[0] - mid) > 0.15:
            return None
        pick = [near]
    n = len(pick)
    return {"n": n, "mhz": sum(s[1] for s in pick) / n, "w": sum(s[2] for s in pick) / n,
            "c": sum(s[3] for s in pick) / n, "src": "smi"}


def clock_of(row, smi):
    """A row's clock: its own NVML samples, else the nvidia-smi CSV's, else None."""
    if row.get("clock_samples"):
        return {"n": row["clock_samples"], "mhz": row["sm_clock_mhz"],
                "w": row.get("power_w", 0.0), "c": row.get("temp_c", 0.0),
                "why": row.get("clock_reasons", 0), "src": "nvml"}
    return join_smi(row, smi)


def gemm_rounds(gemms, peers):
    """Rounds in time order: dicts of side ("zaya"/"torch"), label and rows (key -> row)."""
    zaya, torch = [], []
    for i, g in enumerate(gemms):
        rows = {}
        for r in g["results"]:
            if r["method"] in ("lt", "lt-batched", "cublas"):
                rows.setdefault((key_of(r), r["method"] == "cublas"), r)
        zaya.append({"side": "zaya", "label": f"Z{i}", "rows": rows, "order": (2 * i, 0)})
    for i, p in enumerate(peers):
        rnds = p.get("gemm_rounds") or [p.get("gemm", [])]
        for j, rnd in enumerate(rnds):
            rows = {(key_of(r), False): r for r in rnd}
            label = f"P{i}" + (chr(ord("a") + j) if len(rnds) > 1 else "")
            torch.append({"side": "torch", "label": label, "rows": rows, "order": (2 * i + 1, j)})
    rounds = zaya + torch
    for r in rounds:
        ts = sorted(x["t_start"] for x in r["rows"].values() if x.get("t_start"))
        r["time"] = ts[len(ts) // 2] if ts else None
    if all(r["time"] is not None for r in rounds):
        rounds.sort(key=lambda r: r["time"])
    else:
        rounds.sort(key=lambda r: r["order"])
    return rounds


def bracketed(series, val):
    """zaya/torch ratios from a shape's time-ordered (side, tflops, clock) entries. Each round
    bracketed by two rounds of the other side (Z P Z, or P Z P) gives one ratio against the
    geometric mean of its two neighbours, which cancels a drift linear in time (the clock falling
    as the GPU warms); Z P Z P Z gives 3. Without such triples (the old Z P P Z), each two
    neighbouring rounds of different sides give one. val(entry) -> number or None (skipped)."""
    out = []
    for a, b, c in zip(series, series[1:], series[2:]):
        if a[0] == c[0] != b[0]:
            va, vb, vc = val(a), val(b), val(c)
            if va and vb and vc:
                outer = math.sqrt(va * vc)
                out.append(outer / vb if a[0] == "zaya" else vb / outer)
    if out or any(a[0] == c[0] != b[0] for a, b, c in zip(series, series[1:], series[2:])):
        return out
    for a, b in zip(series, series[1:]):
        if a[0] != b[0]:
            va, vb = val(a), val(b)
            if va and vb:
                out.append(va / vb if a[0] == "zaya" else vb / va)
    return out


def fmt_opt(v, spec, width):
    return format(v, spec) if v is not None else "-".rjust(width)


def gemm_section(gemms, peers, out, smi=None, miss_rows=None):
    """Appends the GEMM comparison to out; returns the number of counted shapes below TARGET and,
    with miss_rows, appends their (dtype, name, m, n, k, groups) to it."""
    rounds = gemm_rounds(gemms, peers)
    names, algo, errors, graphed, zgraphed, keys = {}, {}, {}, set(), set(), []
    for rd in rounds:
        for (k, cb), r in rd["rows"].items():
            if rd["side"] == "zaya" and not cb:
                if k not in names:
                    keys.append(k)
                names.setdefault(k, r["name"])
                algo.setdefault(k, []).append(f"{r.get('algo', '?')}/{r.get('candidates', '?')}")
                if r.get("launch") == "cuda-graph":
                    zgraphed.add(k)
            if rd["side"] == "torch":
                if "error" in r and "tflops" not in r:
                    errors[k] = r["error"]
                if r.get("launch") == "cuda-graph":
                    graphed.add(k)
    if not keys:  # zaya rows in their first run's order: the order both sides ran in
        return 0
    zruns = sum(rd["side"] == "zaya" for rd in rounds)
    truns = len(rounds) - zruns
    timed = all(rd["time"] is not None for rd in rounds)
    out.append(f"\n## GEMM: zaya vs PyTorch ({zruns} zaya and {truns} peer rounds in the order "
               f"{' '.join(rd['label'] for rd in rounds)}"
               f"{'' if timed else ' (assumed: some rows lack timestamps)'}; target >= {TARGET})")
    out.append("best: best-of ratio (old protocol); n: bracketed ratios (a round against the "
               "geometric mean of the other side's rounds before and after it; without such "
               "triples, neighbouring pairs); paired: their median, lo..hi the extremes; "
               "z/cb: zaya / cuBLAS-default in the same rounds (median); MHz, W: mean SM clock "
               "and power over each side's rows "
               "(z, t); norm: paired ratio of TFLOP/s per MHz (a secondary figure, see the "
               "script's docstring)")
    out.append(f"{'name':22} {'m':>6} {'n':>6} {'k':>6} {'grp':>3} {'dtype':>5} {'zaya':>7} "
               f"{'cublas':>7} {'torch':>7} {'best':>6} {'n':>2} {'paired':>6} {'lo':>6} "
               f"{'hi':>6} {'z/cb':>6} {'zMHz':>5} {'tMHz':>5} {'zW':>4} {'tW':>4} {'norm':>6}"
               f"  verdict  algo")
    stats = {}  # dtype -> list of per-shape dicts (counted shapes only)
    clock_src = set()
    for k in keys:
        series = []  # (side, tflops, clock) in time order
        cb_ratios, zs, cs, ts = [], [], [], []
        for rd in rounds:
            r = rd["rows"].get((k, False))
            if r is None or not r.get("tflops"):
                continue
            clk = clock_of(r, smi)
            if clk:
                clock_src.add(clk["src"])
            series.append((rd["side"], r["tflops"], clk))
            (zs if rd["side"] == "zaya" else ts).append(r["tflops"])
            c = rd["rows"].get((k, True)) if rd["side"] == "zaya" else None
            if c is not None and c.get("tflops"):
                cs.append(c["tflops"])
                cb_ratios.append(r["tflops"] / c["tflops"])
        z, _ = best_and_spread(zs)
        t, _ = best_and_spread(ts)
        c, _ = best_and_spread(cs)
        if z is None:
            continue
        if t is None:
            if k in errors:
                out.append(f"{names[k]:22} {k[0]:>6} {k[1]:>6} {k[2]:>6} {k[3]:>3} {k[4]:>5} "
                           f"{z:7.1f}  peer error: {errors[k][:60]}")
            continue
        pairs = bracketed(series, lambda x: x[1])
        norms = bracketed(series, lambda x: x[1] / x[2]["mhz"] if x[2] and x[2]["mhz"] else None)
        side_mean = lambda side, f: (statistics.mean(x[2][f] for x in series
                                                     if x[0] == side and x[2])
                                     if any(x[0] == side and x[2] for x in series) else None)
        zmhz, tmhz = side_mean("zaya", "mhz"), side_mean("torch", "mhz")
        zw, tw = side_mean("zaya", "w"), side_mean("torch", "w")
        best = z / t
        paired = statistics.median(pairs) if pairs else best
        norm = statistics.median(norms) if norms else None
        if paired >= TARGET:
            verdict = "ok"
        elif len(pairs) >= 2 and max(pairs) < TARGET:
            verdict = "below"
        else:
            verdict = "unresolved"
        if verdict != "ok" and norm is not None and norm >= TARGET:
            verdict += "+clk"
        counted = not (k[4] == "fp8" and k[3] > 1)
        if counted:
            stats.setdefault(k[4], []).append({"k": k, "best": best, "paired": paired,
                                               "verdict": verdict, "norm": norm})
        out.append(f"{names[k]:22} {k[0]:>6} {k[1]:>6} {k[2]:>6} {k[3]:>3} {k[4]:>5} {z:7.1f} "
                   f"{fmt_opt(c, '7.1f', 7)} {t:7.1f} {best:6.3f} {len(pairs):>2} {paired:6.3f} "
                   f"{fmt_opt(min(pairs) if pairs else None, '6.3f', 6)} "
                   f"{fmt_opt(max(pairs) if pairs else None, '6.3f', 6)} "
                   f"{fmt_opt(statistics.median(cb_ratios) if cb_ratios else None, '6.3f', 6)} "
                   f"{fmt_opt(zmhz, '5.0f', 5)} {fmt_opt(tmhz, '5.0f', 5)} "
                   f"{fmt_opt(zw, '4.0f', 4)} {fmt_opt(tw, '4.0f', 4)} "
                   f"{fmt_opt(norm, '6.3f', 6)}  {verdict if counted else '(not counted)':10} "
                   f"{','.join(algo[k])}{'' if paired >= TARGET or not counted else '  <'}")
    out.append("clock source: " + (", ".join(sorted(clock_src)) if clock_src else
                                   "none (no NVML samples in the rows and no --smi CSV)"))
    if graphed:
        out.append(f"peer rows replayed from CUDA graphs (direct calls synchronise the host): "
                   f"{len(graphed)} ({', '.join(sorted({k[4] for k in graphed}))})")
    if zgraphed:
        out.append(f"zaya rows replayed from CUDA graphs (--cuda-graph): {len(zgraphed)} "
                   f"({', '.join(sorted({k[4] for k in zgraphed}))})")
    if (graphed or zgraphed) and graphed != zgraphed:
        out.append(f"launch protocols differ (graph on one side only) on "
                   f"{len(graphed ^ zgraphed)} shapes")
    for dt, rs in stats.items():
        paired = [x["paired"] for x in rs]
        best = [x["best"] for x in rs]
        count = lambda v: sum(1 for x in rs if x["verdict"].startswith(v))
        clk = sum(1 for x in rs if x["verdict"].endswith("+clk"))
        out.append(f"{dt}: {len(rs)} shapes, median paired ratio {statistics.median(paired):.3f} "
                   f"(min {min(paired):.3f}); {count('below')} below (every pair), "
                   f"{count('unresolved')} unresolved, {clk} of these with the clock-normalised "
                   f"ratio >= {TARGET}; best-of: median {statistics.median(best):.3f}, "
                   f"{sum(1 for b in best if b < TARGET)} below {TARGET}")
    out.append("previously failing shapes (docs/bench/h200-2026-12-02), median paired ratio:")
    lookup = {x["k"]: x for rs in stats.values() for x in rs}
    for k in PREVIOUSLY_FAILING:
        x = lookup.get(k)
        out.append(f"  {k[0]}x{k[1]}x{k[2]} {k[4]}: "
                   + (f"{x['paired']:.3f} {x['verdict']}" if x else "not measured"))
    below = [x for rs in stats.values() for x in rs if x["paired"] < TARGET]
    if miss_rows is not None:
        miss_rows.extend((x["k"][4], names[x["k"]], *x["k"][:4]) for x in below)
    return len(below)


def mem_section(mem, peer, out):
    out.append("\n## device copy: zaya vs PyTorch / cudaMemcpy (GB/s, read + write)")
    ours = {}
    for r in mem["results"]:
        ours.setdefault(r["name"], {})[r["size"]] = r["gbs"]
    below = 0
    for p in peer["mem"]:
        if p["size"] < (64 << 20):
            continue
        z_copy = ours.get("copy", {}).get(p["size"])
        z_mc = ours.get("memcpy_d2d", {}).get(p["size"])
        best = max(x for x in (z_copy, z_mc, 0) if x is not None)
        ratio = best / p["gbs"]
        below += ratio < TARGET
        out.append(f"{p['name']:15} {p['size']:>12} peer {p['gbs']:8.1f}  zaya copy {z_copy or 0:8.1f}"
                   f"  zaya memcpy {z_mc or 0:8.1f}  ratio {ratio:.3f}{'' if ratio >= TARGET else '  <'}")
    return below


def comm_section(label, comm, direct, out):
    ranks = direct.get("ranks", 1)
    ours = {(r["size"], bool(r["inplace"])): r for r in comm["results"]
            if r["name"] == "all_reduce" and r.get("group", "world") == "world"
            and r["ranks"] == ranks and r.get("dtype") == direct["results"][0]["dtype"]}
    out.append(f"\n## all_reduce {label}: zaya bench comm --backend nccl vs nccl_direct "
               f"({ranks} GPU(s); time us, algbw and busbw GB/s; ratio = zaya/peer algbw)")
    out.append(f"{'size':>12} {'place':>5} {'zaya us':>9} {'peer us':>9} {'zaya algbw':>10} "
               f"{'peer algbw':>10} {'zaya busbw':>10} {'peer busbw':>10} {'ratio':>6} wrong")
    big = []
    for p in direct["results"]:
        o = ours.get((p["size"], bool(p["inplace"])))
        if not o:
            continue
        ratio = o["algbw"] / p["algbw"] if p["algbw"] > 0 else 0
        if p["size"] >= (1 << 20):
            big.append(ratio)
        out.append(f"{p['size']:>12} {'in' if p['inplace'] else 'out':>5} {o['time_us']:9.2f} "
                   f"{p['time_us']:9.2f} {o['algbw']:10.2f} {p['algbw']:10.2f} {o['busbw']:10.2f} "
                   f"{p['busbw']:10.2f} {ratio:6.3f} {o['wrong']}/{p['wrong']}"
                   f"{'' if ratio >= TARGET else '  <'}")
    if big:
        out.append(f"sizes >= 1 MiB: median ratio {statistics.median(big):.3f}, min {min(big):.3f}")
    return sum(1 for r in big if r < TARGET)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm", nargs="*", default=[], help="zaya bench gemm --json files (rounds)")
    ap.add_argument("--peer", nargs="*", default=[],
                    help="bench_peer.py outputs (rounds; the first with 'mem' gives the copies)")
    ap.add_argument("--smi", help="nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,"
                    "temperature.gpu --format=csv,nounits -lms N output, taken with TZ=UTC")
    ap.add_argument("--smi-start", type=float, help="Unix time at which --smi's sampler started")
    ap.add_argument("--smi-gpu", type=int, help="the nvidia-smi index to use (default: lowest)")
    ap.add_argument("--mem", help="zaya bench mem --json")
    ap.add_argument("--profile", help="the hardware profile")
    ap.add_argument("--comm", action="append", default=[], help="zaya bench comm --json")
    ap.add_argument("--nccl-direct", action="append", default=[], help="nccl_direct --json")
    ap.add_argument("--label", action="append", default=[], help="a name per --comm pair")
    ap.add_argument("--misses-out", help="write the GEMM shapes below target here, one per line "
                    "('dtype NAME=MxNxKxGROUPS')")
    a = ap.parse_args()
    out = []
    prof = load(a.profile)
    if prof:
        out.append("\n## hardware profile")
        for k in ("device", "sm_count", "peak_tflops", "measured_peak_tflops", "knee_gflop",
                  "knee_gflop_spec", "hbm_capacity_gib", "copy_bandwidth_gbs",
                  "read_bandwidth_gbs", "h2d_pinned_gbs", "d2h_pinned_gbs"):
            out.append(f"{k:20} {json.dumps(prof.get(k))}")
    gemms = [g for g in (load(p) for p in a.gemm) if g]
    peers = [p for p in (load(x) for x in a.peer) if p]
    peer = next((p for p in peers if "mem" in p), peers[0] if peers else None)
    smi = parse_smi(a.smi, a.smi_start, a.smi_gpu) if a.smi and os.path.exists(a.smi) else None
    if a.smi:
        out.append(f"\nnvidia-smi samples: {len(smi or [])} from {a.smi}")
    misses = 0
    for i, g in enumerate(gemms):
        wrong = sum(r["wrong"] for r in g["results"])
        out.append(f"\n## gemm run {i + 1}: {len(g['results'])} rows, {wrong} sampled outputs wrong"
                   f", workspace {g.get('workspace_bytes', 0) >> 20} MiB, autotune "
                   f"{g.get('autotune', '?')} + {g.get('search_per_algo', 0)} per algorithm id, "
                   f"timing {json.dumps(g.get('timing'))}")
    for p in peers:
        if "error" in p:
            out.append(f"\npeer: {p['error']}")
    if peer:
        out.append(f"\npeer: torch {peer.get('torch')}, BLAS {peer.get('blas_library')}, "
                   f"CUBLAS_WORKSPACE_CONFIG={peer.get('cublas_workspace_config')}, "
                   f"bf16 reduced-precision reduction {peer.get('bf16_reduced_precision_reduction')}"
                   f", NVML {peer.get('nvml', '-')}")
    gemm_peers = [p for p in peers if "gemm_rounds" in p or "gemm" in p]
    if gemms and gemm_peers:
        miss_rows = []
        misses += gemm_section(gemms, gemm_peers, out, smi, miss_rows)
        if a.misses_out:
            # One line per shape below target: "dtype NAME=MxNxKxGROUPS", for `zaya bench gemm
            # --dtype dtype --shape ...` (tools/device/bench_h200.sh's focus rounds).
            with open(a.misses_out, "w") as f:
                for dt, name, m, n, k, g in miss_rows:
                    f.write(f"{dt} {name}={m}x{n}x{k}x{g}\n")
    mem = load(a.mem)
    if mem and peer and "mem" in peer:
        misses += mem_section(mem, peer, out)
    for i, (c, d) in enumerate(zip(a.comm, a.nccl_direct)):
        comm, direct = load(c), load(d)
        label = a.label[i] if i < len(a.label) else f"pair {i + 1}"
        if comm and direct and direct.get("results"):
            misses += comm_section(label, comm, direct, out)
        else:
            out.append(f"\n## all_reduce {label}: missing {c if not comm else d}")
    out.append(f"\n# rows below the {TARGET} target: {misses}")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
