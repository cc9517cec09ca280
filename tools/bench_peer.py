#!/usr/bin/env python3
"""Peer measurements for `zaya bench gemm|mem`, to check zaya's figures against PyTorch.

GEMMs: for every single/batched cuBLASLt row of a `zaya bench gemm --json` file, the same problem
in PyTorch (Y = X @ W^T with X [m,k], W [n,k]; torch.bmm for expert groups; torch._scaled_mm with
unit scales for fp8), with the same harness as zaya: operand sets rotated so they exceed 3x L2,
warm-up, per-iteration CUDA events, median. Memory: torch's device copy (dst.copy_(src)) and plain
cudaMemcpyAsync device-to-device through ctypes, both counted as 2N bytes (read + write) like zaya.
Writes one JSON file; compare with tools/device/bench_h200.sh's summary.

Usage: bench_peer.py --gemm-json gemm.json --out peer.json [--iters 20 --warmup 5]
"""
import argparse
import ctypes
import ctypes.util
import glob
import json
import math
import os
import statistics
import sys


def median_time_us(fn, sets, warmup, iters):
    import torch
    for i in range(warmup):
        fn(i % sets)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i % sets)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def l2_bytes():
    import torch
    p = torch.cuda.get_device_properties(0)
    return int(getattr(p, "L2_cache_size", 50 << 20))


def gemm_peer(rows, warmup, iters):
    import torch
    out = []
    l2 = l2_bytes()
    seen = set()
    for r in rows:
        if r["method"] not in ("lt", "lt-batched"):
            continue
        key = (r["m"], r["n"], r["k"], r["groups"], r["dtype"])
        if key in seen:
            continue
        seen.add(key)
        m, n, k, g, dt = key
        es = 1 if dt == "fp8" else 2
        set_bytes = g * (m * k + n * k) * es + g * m * n * 2
        sets = max(1, min(32, math.ceil(3 * l2 / set_bytes)))
        try:
            xs, ws = [], []
            for _ in range(sets):
                x = torch.rand((g, m, k), device="cuda") * 2 - 1
                w = torch.rand((g, n, k), device="cuda") * 2 - 1
                if dt == "fp8":
                    x, w = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                else:
                    x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
                xs.append(x if g > 1 else x[0])
                ws.append(w if g > 1 else w[0])
            if dt == "fp8":
                one = torch.ones((), device="cuda", dtype=torch.float32)
                if g > 1:
                    def fn(i):  # no batched _scaled_mm: one call per expert
                        for e in range(g):
                            torch._scaled_mm(xs[i][e], ws[i][e].t(), scale_a=one, scale_b=one,
                                             out_dtype=torch.bfloat16, use_fast_accum=False)
                else:
                    def fn(i):
                        torch._scaled_mm(xs[i], ws[i].t(), scale_a=one, scale_b=one,
                                         out_dtype=torch.bfloat16, use_fast_accum=False)
            elif g > 1:
                def fn(i):
                    torch.bmm(xs[i], ws[i].transpose(1, 2))
            else:
                def fn(i):
                    torch.matmul(xs[i], ws[i].t())
            us = median_time_us(fn, sets, warmup, iters)
            gflop = 2.0 * m * n * k * g / 1e9
            out.append({"name": r["name"], "m": m, "n": n, "k": k, "groups": g, "dtype": dt,
                        "time_us": us, "tflops": gflop / (us * 1e-6) / 1e3, "sets": sets})
        except Exception as e:  # a shape torch cannot run is reported, not fatal
            out.append({"name": r["name"], "m": m, "n": n, "k": k, "groups": g, "dtype": dt,
                        "error": str(e)[:200]})
        del xs, ws
        torch.cuda.empty_cache()
    return out


def load_cudart():
    import torch
    names = []
    tdir = os.path.dirname(torch.__file__)
    names += glob.glob(os.path.join(tdir, "..", "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
    names += glob.glob(os.path.join(tdir, "lib", "libcudart*.so*"))
    names += glob.glob("/usr/local/cuda/lib64/libcudart.so*")
    found = ctypes.util.find_library("cudart")
    if found:
        names.append(found)
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


def mem_peer(warmup, iters, max_bytes):
    import torch
    out = []
    cudart = load_cudart()
    size = 1 << 20
    while size <= max_bytes:
        src = torch.empty(size, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        us = median_time_us(lambda i: dst.copy_(src), 1, warmup, iters)
        out.append({"name": "torch_copy", "size": size, "time_us": us,
                    "gbs": 2 * size / (us * 1e-6) / 1e9})
        if cudart is not None:
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            fn = cudart.cudaMemcpyAsync
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                           ctypes.c_void_p]
            def memcpy(i):
                rc = fn(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()), size, 3,
                        stream)  # 3 = cudaMemcpyDeviceToDevice
                if rc != 0:
                    raise RuntimeError(f"cudaMemcpyAsync returned {rc}")
            us = median_time_us(memcpy, 1, warmup, iters)
            out.append({"name": "cudaMemcpy_d2d", "size": size, "time_us": us,
                        "gbs": 2 * size / (us * 1e-6) / 1e9})
        del src, dst
        torch.cuda.empty_cache()
        size *= 4
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm-json", help="zaya bench gemm --json output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mem-max", default=str(4 << 30), help="largest copy in bytes")
    a = ap.parse_args()
    result = {"schema": "zaya.bench.peer/1"}
    try:
        import torch
        assert torch.cuda.is_available(), "torch sees no CUDA device"
    except Exception as e:
        result["error"] = f"PyTorch with CUDA is not available: {e}"
        json.dump(result, open(a.out, "w"), indent=1)
        print(result["error"], file=sys.stderr)
        return 2
    result["torch"] = torch.__version__
    result["device"] = torch.cuda.get_device_name(0)
    if a.gemm_json:
        rows = json.load(open(a.gemm_json))["results"]
        result["gemm"] = gemm_peer(rows, a.warmup, a.iters)
    result["mem"] = mem_peer(a.warmup, a.iters, int(a.mem_max))
    tmp = a.out + ".tmp"
    json.dump(result, open(tmp, "w"), indent=1)
    os.replace(tmp, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
