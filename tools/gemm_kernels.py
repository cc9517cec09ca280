#!/usr/bin/env python3
"""Which GEMM kernel each side runs: zaya's kept cuBLASLt algorithm against the peer's kernel.

    python3 tools/gemm_kernels.py ZAYA_GEMM.json PEER_KERNELS.json [--header cublasLt.h]

ZAYA_GEMM.json is a `zaya bench gemm --json` file (its rows' `algo_fields` are the enum values of the
kept algorithm's attributes); PEER_KERNELS.json is a `tools/bench_peer.py --kernel-names` file (the
kernel names one peer call launches, from torch.profiler). The enum values are named from the
cublasLt.h this machine has (the CUDA toolkit the benchmark was built with: --header, else
$CUDA_HOME, else next to nvcc, else /usr/local/cuda), and the peer's cuBLAS kernel name
(nvjet_sm90_tst_<tile>_<k x stages>_<cluster>_...) is read for its tile and cluster, so each shape
gets a verdict: the same tile and cluster as the peer, or not. A shape where both sides run the same
kernel cannot differ by the algorithm choice, only by the run (clocks, power, the harness).
"""
import argparse
import json
import os
import re
import shutil
import sys

# algo_fields key -> (cublasLt.h enum prefix, how the name's suffix reads)
ENUMS = {
    "tile": "CUBLASLT_MATMUL_TILE_",
    "stages": "CUBLASLT_MATMUL_STAGES_",
    "cluster_shape": "CUBLASLT_CLUSTER_SHAPE_",
    "inner_shape": "CUBLASLT_MATMUL_INNER_SHAPE_",
}


def find_header(given):
    if given:
        return given
    roots = []
    if os.environ.get("CUDA_HOME"):
        roots.append(os.environ["CUDA_HOME"])
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots.append("/usr/local/cuda")
    for r in roots:
        for sub in ("include", "targets/x86_64-linux/include"):
            p = os.path.join(r, sub, "cublasLt.h")
            if os.path.exists(p):
                return p
    return None


def read_enums(path):
    """{field: {value: suffix}} from the header's `PREFIX_SUFFIX = value,` lines."""
    names = {k: {} for k in ENUMS}
    if not path:
        return names
    pat = re.compile(r"^\s*(CUBLASLT_\w+)\s*=\s*(\d+)\s*,?")
    with open(path) as f:
        for line in f:
            m = pat.match(line)
            if not m:
                continue
            for field, prefix in ENUMS.items():
                if m.group(1).startswith(prefix):
                    names[field].setdefault(int(m.group(2)), m.group(1)[len(prefix):])
    return names


def peer_kernel(names):
    """(tile, cluster) of the first cuBLAS kernel name in the list, or (None, None)."""
    for n in names:
        m = re.search(r"nvjet_sm\d+_\w*?_(\d+x\d+)_(\d+)x(\d+)_(\d+x\d+)_", n)
        if m:
            return m.group(1), m.group(4), int(m.group(3))
    return None, None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("zaya")
    ap.add_argument("peer")
    ap.add_argument("--header", help="cublasLt.h to name the enum values from")
    a = ap.parse_args()
    header = find_header(a.header)
    names = read_enums(header)
    if not header:
        print("gemm_kernels: no cublasLt.h found (give --header); enum values left as numbers",
              file=sys.stderr)
    try:
        z = json.load(open(a.zaya))["results"]
        p = json.load(open(a.peer)).get("gemm", [])
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"gemm_kernels: cannot read {a.zaya} / {a.peer}: {e}")
    print(f"# enum names from {header or '(none)'}; same: the peer's kernel has zaya's tile and "
          "cluster; swap: with M and N the other way round")
    print(f"{'dtype':5} {'shape':22} {'zaya tile':>10} {'cluster':>8} {'stages':>9}  "
          f"{'peer tile':>10} {'cluster':>8} {'stg':>4}  same  peer kernel")
    same_count = total = 0
    for r in z:
        f = r.get("algo_fields")
        if r.get("method") not in ("lt", "lt-batched") or not f:
            continue
        key = (r["m"], r["n"], r["k"], r["groups"], r["dtype"])
        rows = [q for q in p if (q["m"], q["n"], q["k"], q["groups"], q["dtype"]) == key]
        kern = rows[0].get("kernels", []) if rows else []
        named = {k: names[k].get(f.get(k, -1), str(f.get(k, "-"))) for k in ENUMS}
        ztile = named["tile"]
        zcl = named["cluster_shape"].rsplit("x1", 1)[0] if named["cluster_shape"].endswith("x1") \
            else named["cluster_shape"]
        ptile, pcl, pst = peer_kernel(kern)
        same = "-"
        if ptile:
            total += 1
            flip = lambda s: "x".join(reversed(s.split("x")))  # noqa: E731
            if ztile == ptile and zcl == pcl:
                same = "yes"
            elif ztile == flip(ptile) and zcl == flip(pcl):
                same = "swap"  # the same kernel with M and N the other way round
            else:
                same = "no"
            same_count += same != "no"
        shape = f"{r['m']}x{r['n']}x{r['k']}" + (f"x{r['groups']}" if r["groups"] > 1 else "")
        print(f"{r['dtype']:5} {shape:22} {ztile:>10} {zcl:>8} {named['stages']:>9}  "
              f"{ptile or '-':>10} {pcl or '-':>8} {pst or '-':>4}  {same:4}  "
              f"{'; '.join(k for k in kern if not k.startswith('Memset')) or '(no peer row)'}")
    print(f"# {same_count} of {total} shapes: zaya runs the peer's tile and cluster (yes or swap)")


if __name__ == "__main__":
    main()
