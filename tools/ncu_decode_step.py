#!/usr/bin/env python3
"""Per-kernel GPU times of one decode step from an Nsight Compute CSV.

Run on the device (ncu times every kernel in isolation, caches flushed, no launch overlap):
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        zaya bench infer --preset zaya1-base --layers 8 --prompt 1024 --decode 3 --warmup 1 \
        --repeats 1 > ncu_decode.csv
then here:
    python3 tools/ncu_decode_step.py ncu_decode.csv[.gz]
The last decode step is the kernels after the second-to-last launch of advance_kernel (the step's
final kernel) up to the last one. Prints the step's kernel count and summed kernel time, then one
line per kernel name: launches, total and per-launch time, grid and block. The sum exceeds the
graph-replayed step when kernels overlap under programmatic dependent launch, and is below it by
the launch gaps.
"""
import collections
import csv
import gzip
import re
import sys


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = []
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r["Metric Unit"]
        if unit not in scale:
            sys.exit(f"{path}: unknown time unit '{unit}' (expected ns, us or ms)")
        us = float(r["Metric Value"].replace(",", "")) * scale[unit]
        name = re.sub(r"\(.*", "", r["Kernel Name"])
        rows.append((int(r["ID"]), name, us, r["Grid Size"], r["Block Size"]))
    rows.sort()
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_decode_step.py NCU_CSV[.gz]")
    rows = read_rows(sys.argv[1])
    ends = [i for i, r in enumerate(rows) if "advance_kernel" in r[1]]
    if len(ends) < 2:
        sys.exit(f"{sys.argv[1]}: fewer than two decode steps (advance_kernel launches) found")
    step = rows[ends[-2] + 1 : ends[-1] + 1]
    total = sum(r[2] for r in step)
    print(f"last decode step: {len(step)} kernels, {total:.1f} us of kernel time")
    agg = collections.OrderedDict()
    for _, name, us, grid, block in step:
        a = agg.setdefault(name, [0, 0.0, grid, block])
        a[0] += 1
        a[1] += us
    for name, (n, t, grid, block) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"{name[:60]:60s} {n:3d}x {t:8.1f} us {t / n:7.2f} us/launch  grid {grid} block {block}")


if __name__ == "__main__":
    main()
