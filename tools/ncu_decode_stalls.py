#!/usr/bin/env python3
"""Warp stall reasons of one decode step's kernels from an Nsight Compute CSV.

Run on the device (tools/device/decode_ab.sh NCU=1 does this):
    ncu --clock-control none --cache-control all|none \
        --metrics gpu__time_duration.sum,smsp__average_warps_issue_stalled_<why>_per_issue_active.ratio,... \
        --csv zaya bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 3 \
        --warmup 1 --repeats 1 > ncu_stalls.csv
then:
    python3 tools/ncu_decode_stalls.py ncu_stalls.csv[.gz]
    python3 tools/ncu_decode_stalls.py --each ncu_graph.csv[.gz]   # every result (ncu
        --graph-profiling graph: one result per graph launch, its kernels overlapping as they run)
Takes the last decode step (the kernels after the second-to-last step-ending launch, token_commit
or advance, up to the last one), and prints per kernel name: launches, mean time, warp cycles per
issued instruction (the sum of the stall ratios: how many cycles a warp waits, on average, between
two of its instructions) and the share of each stall reason in it, largest first. A large
'no_instruction' share means warps wait for instructions to be fetched (instruction cache misses,
or the refetch after a branch); 'long_scoreboard' is waiting on global or local memory,
'barrier' on __syncthreads or cluster barriers, 'membar' on memory fences, 'wait' on fixed
instruction latencies.
"""
import collections
import csv
import gzip
import re
import sys

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio$")
STEP_ENDS = ("token_commit_kernel", "advance_kernel")


def read_kernels(path):
    """{id: (name, {metric: value})} from ncu's long CSV (one row per kernel and metric)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.startswith('"')]
    if not lines:
        sys.exit(f"{path}: no CSV rows (expected ncu --csv output)")
    kernels = {}
    for r in csv.DictReader(lines):
        for col in ("ID", "Kernel Name", "Metric Name", "Metric Value"):
            if col not in r:
                sys.exit(f"{path}: column '{col}' missing (expected ncu --csv's details page)")
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue  # n/a
        name = re.sub(r"\(.*", "", r["Kernel Name"])
        metric = r["Metric Name"]
        if metric == "gpu__time_duration.sum":
            unit = r.get("Metric Unit", "")
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
            if unit not in scale:
                sys.exit(f"{path}: unknown time unit '{unit}' (expected ns, us or ms)")
            value *= scale[unit]
        kernels.setdefault(int(r["ID"]), (name, {}))[1][metric] = value
    return kernels


def main():
    args = sys.argv[1:]
    each = bool(args) and args[0] == "--each"
    if each:
        args = args[1:]
    if len(args) != 1:
        sys.exit("usage: ncu_decode_stalls.py [--each] NCU_CSV[.gz]")
    kernels = read_kernels(args[0])
    ids = sorted(kernels)
    if each:
        step = ids
    else:
        ends = [i for i, k in enumerate(ids) if any(e in kernels[k][0] for e in STEP_ENDS)]
        if len(ends) < 2:
            sys.exit(f"{args[0]}: fewer than two decode steps (token_commit/advance launches) found")
        step = ids[ends[-2] + 1 : ends[-1] + 1]
    agg = collections.OrderedDict()
    for k in step:
        name, m = kernels[k]
        a = agg.setdefault(name, [0, collections.Counter()])
        a[0] += 1
        a[1].update(m)
    total_us = sum(kernels[k][1].get("gpu__time_duration.sum", 0.0) for k in step)
    what = "results" if each else "last decode step"
    print(f"{what}: {len(step)} kernels, {total_us:.1f} us of kernel time")
    print(f"{'kernel':52s} {'n':>3s} {'us':>7s} {'cyc/inst':>8s}  stall shares (of cycles/inst)")
    rows = sorted(agg.items(), key=lambda x: -x[1][1].get("gpu__time_duration.sum", 0.0))
    for name, (n, sums) in rows:
        stalls = {STALL.match(k).group(1): v / n for k, v in sums.items() if STALL.match(k)}
        # 'selected' is the issue cycle itself, not a stall; the ratios sum to cycles per issue.
        cpi = sum(stalls.values())
        us = sums.get("gpu__time_duration.sum", 0.0) / n
        top = sorted(stalls.items(), key=lambda x: -x[1])[:6]
        shares = " ".join(f"{k} {100 * v / cpi:.0f}%" for k, v in top if cpi > 0 and v > 0)
        print(f"{name[:52]:52s} {n:3d} {us:7.2f} {cpi:8.2f}  {shares}")


if __name__ == "__main__":
    main()
