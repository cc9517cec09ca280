#!/usr/bin/env python3
"""Peer measurements for `zaya bench gemm|mem`, to check zaya's figures against PyTorch.

GEMMs: for every single/batched cuBLASLt row of a `zaya bench gemm --json` file, the same problem
in PyTorch: Y = X @ W^T with X [m,k], W [n,k] through torch.matmul(x, w.t(), out=y) (cuBLAS
cublasGemmEx, PyTorch's default BLAS backend), torch.bmm(..., out=y) for expert groups
(cublasGemmStridedBatchedEx), torch._scaled_mm with unit scales for fp8 (one call per expert for
groups; PyTorch has no batched fp8 matmul). The harness is zaya's (src/bench/gemm_bench.h,
TimingPolicy), with its numbers read from the JSON:
  * inputs uniform in [-1, 1) (bf16, or fp8 e4m3 rounded from them), the row's `sets` operand
    and output sets rotated (zaya sizes them to exceed 3x L2);
  * `warmup` launches; a 3-launch estimate enqueued behind a hold of the stream; the row's `warm`
    launches (zaya's count: at least warm_ms of GPU time); then the row's `iters` launches,
    enqueued while torch.cuda._sleep holds the stream for block_us(iters) (so Python's ~20 us of
    launch cost per call is not timed), each between consecutive CUDA events; the median.
  * cuBLAS workspace 32 MiB (CUBLAS_WORKSPACE_CONFIG=:4096:8, PyTorch's own Hopper default,
    stated explicitly so both sides are known to run with the same workspace as zaya's cuBLASLt).
With --rounds R the whole GEMM list is measured R times in a row; tools/device/bench_h200.sh runs
one round per call (--rounds 1) between zaya's rounds, and the comparison pairs each round with its
neighbours in time (tools/bench_peer_compare.py).

Clock: like zaya, every GEMM row records the wall-clock window of its timed launches (t_start,
t_end: Unix seconds at which the host saw the first and the last timed event complete; the host
polls the events instead of blocking) and, when NVML is reachable (pynvml if importable, else the
driver's libnvidia-ml.so.1 through ctypes), the mean SM clock, power and temperature sampled about
every millisecond in between (clock_samples, sm_clock_mhz, sm_clock_min_mhz, power_w, temp_c,
clock_reasons), for attributing a zaya/peer difference to the clock. --no-nvml turns sampling off.

Memory: torch's device copy (dst.copy_(src)) and plain cudaMemcpyAsync device-to-device through
ctypes, both counted as 2N bytes (read + write) like zaya, timed as `zaya bench mem` times its
device tests (3 warm-up calls, then 20 calls each between CUDA events, median).

With --kernel-names each GEMM row also records the names of the CUDA kernels one call launches
(torch.profiler, after the row's timing), to set beside the algorithm zaya kept for the shape
(its algo_fields).

Usage: bench_peer.py --gemm-json gemm.json --out peer.json [--rounds 2] [--skip-mem]
                     [--kernel-names]
Compare with tools/bench_peer_compare.py.
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
import time

# Before torch creates its cuBLAS handle (see the docstring).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

DEFAULT_POLICY = {"warmup": 5, "min_iters": 20, "max_iters": 200, "warm_ms": 20.0,
                  "min_time_ms": 25.0, "block_base_us": 1000.0, "block_per_iter_us": 50.0,
                  "block_max_us": 50000.0}


# The arithmetic of zaya's TimingPolicy (src/bench/gemm_shapes.cpp), used when a row lacks counts.
def warm_launches(p, est_us):
    if not est_us > 0 or not p["warm_ms"] > 0:
        return 0
    return int(min(1000.0, math.ceil(p["warm_ms"] * 1e3 / est_us)))


def timed_iters(p, est_us):
    lo = max(1, int(p["min_iters"]))
    hi = max(lo, int(p["max_iters"]))
    if not est_us > 0:
        return hi
    return int(min(max(math.ceil(p["min_time_ms"] * 1e3 / est_us), lo), hi))


def block_us(p, iters):
    return min(p["block_max_us"], p["block_base_us"] + p["block_per_iter_us"] * iters)


def operand_sets(l2, m, n, k, g, es, free_bytes):
    """zaya's make_buffers: 256-byte-rounded sets exceeding 3x L2, 1..32, within half the free."""
    up = lambda v: (v + 255) // 256 * 256
    set_bytes = up(g * n * k * es) + up(g * m * k * es) + up(g * m * n * 2)
    sets = max(1, min(32, -(-3 * l2 // set_bytes)))
    while sets > 1 and sets * set_bytes > free_bytes // 2:
        sets -= 1
    return sets


class Nvml:
    """The GPU's SM clock, power, temperature and clock event reasons (as zaya's sampler)."""

    def __init__(self, pci_bus_id):
        self.sample_fn = None
        try:
            self._pynvml(pci_bus_id)
        except Exception:
            try:
                self._ctypes(pci_bus_id)
            except Exception:
                self.sample_fn = None
        self.ok = self.sample_fn is not None
        self.backend = getattr(self, "backend", None) if self.ok else None

    def _pynvml(self, bus):
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByPciBusId(bus.encode() if isinstance(bus, str) else bus)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

        def sample():
            mhz = pynvml.nvmlDeviceGetClockInfo(h, 1)  # NVML_CLOCK_SM
            mw = pynvml.nvmlDeviceGetPowerUsage(h)
            c = pynvml.nvmlDeviceGetTemperature(h, 0)  # NVML_TEMPERATURE_GPU
            why = reasons(h) if reasons else 0
            return float(mhz), mw * 1e-3, float(c), int(why)
        sample()
        self.sample_fn, self.backend = sample, "pynvml"

    def _ctypes(self, bus):
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")
        h = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus.encode()),
                                                ctypes.byref(h)) != 0:
            raise OSError(f"no NVML device at {bus}")
        try:
            reasons = lib.nvmlDeviceGetCurrentClocksEventReasons
        except AttributeError:
            reasons = lib.nvmlDeviceGetCurrentClocksThrottleReasons
        u, ull = ctypes.c_uint(), ctypes.c_ulonglong()

        def sample():
            if lib.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(u)) != 0:
                raise OSError("nvmlDeviceGetClockInfo failed")
            mhz = float(u.value)
            mw = u.value if lib.nvmlDeviceGetPowerUsage(h, ctypes.byref(u)) == 0 else 0
            c = u.value if lib.nvmlDeviceGetTemperature(h, 0, ctypes.byref(u)) == 0 else 0
            why = ull.value if reasons(h, ctypes.byref(ull)) == 0 else 0
            return mhz, mw * 1e-3, float(c), int(why)
        sample()
        self.sample_fn, self.backend = sample, "ctypes"

    def sample(self, acc):
        """Adds one sample to acc (a dict of sums); a failing query adds nothing."""
        try:
            mhz, w, c, why = self.sample_fn()
        except Exception:
            return
        acc["n"] += 1
        acc["mhz"] += mhz
        acc["min"] = mhz if acc["n"] == 1 else min(acc["min"], mhz)
        acc["w"] += w
        acc["c"] += c
        acc["why"] |= why


def pci_bus_id():
    import torch
    try:
        p = torch.cuda.get_device_properties(0)
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:  # older PyTorch: ask the runtime
        cudart = load_cudart()
        buf = ctypes.create_string_buffer(64)
        if cudart is None or cudart.cudaDeviceGetPCIBusId(buf, 64, torch.cuda.current_device()):
            return None
        return buf.value.decode()


def wait_window(first, last, nvml):
    """Polls two CUDA events as zaya does: the window between seeing `first` and `last` complete,
    with NVML sampled about every millisecond in between (a dict of the row's new fields)."""
    nap = 1e-3 if nvml is not None else 2e-4
    while not first.query():
        time.sleep(nap)
    acc = {"n": 0, "mhz": 0.0, "min": 0.0, "w": 0.0, "c": 0.0, "why": 0}
    t0 = time.time()
    while True:
        done = last.query()
        if nvml is not None and (not done or acc["n"] == 0):
            nvml.sample(acc)
        if done:
            break
        time.sleep(nap)
    row = {"t_start": t0, "t_end": time.time()}
    if acc["n"]:
        n = acc["n"]
        row.update(clock_samples=n, sm_clock_mhz=acc["mhz"] / n, sm_clock_min_mhz=acc["min"],
                   power_w=acc["w"] / n, temp_c=acc["c"] / n, clock_reasons=acc["why"])
    return row


class Timer:
    """zaya's measurement protocol on the current PyTorch stream."""

    def __init__(self, policy, nvml=None):
        import torch
        self.torch = torch
        self.p = policy
        self.nvml = nvml
        self.window = {}  # the last measure()'s window and clock fields
        # torch.cuda._sleep spins for a number of GPU clock cycles: calibrate cycles per
        # microsecond once (the hold only needs to outlast the host's enqueueing).
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        cycles = 4_000_000
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        torch.cuda.synchronize()
        self.cycles_per_us = cycles / max(1.0, s.elapsed_time(e) * 1e3)

    def hold(self, us):
        if us > 0:
            self.torch.cuda._sleep(int(us * self.cycles_per_us))

    def measure(self, fn, sets, iters=None, warm=None):
        """Returns (median us, iters, warm); iters/warm default to the policy's counts."""
        torch, p = self.torch, self.p
        nxt = 0
        for _ in range(int(p["warmup"])):
            fn(nxt % sets)
            nxt += 1
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.hold(block_us(p, 3))
        a.record()
        for _ in range(3):
            fn(nxt % sets)
            nxt += 1
        b.record()
        torch.cuda.synchronize()
        est = a.elapsed_time(b) * 1e3 / 3
        warm = warm_launches(p, est) if warm is None else int(warm)
        iters = timed_iters(p, est) if not iters else int(iters)
        for _ in range(warm):
            fn(nxt % sets)
            nxt += 1
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        self.hold(block_us(p, iters))
        ev[0].record()
        for i in range(iters):
            fn(nxt % sets)
            nxt += 1
            ev[i + 1].record()
        self.window = wait_window(ev[0], ev[-1], self.nvml)
        torch.cuda.synchronize()
        return statistics.median(ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(iters)), \
            iters, warm


def l2_bytes():
    import torch
    p = torch.cuda.get_device_properties(0)
    return int(getattr(p, "L2_cache_size", 50 << 20))


def capture_graphs(fn, sets):
    """One CUDA graph per operand set, each replaying fn(i); None when capture fails."""
    import torch
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (workspaces, handles)
            for i in range(sets):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graphs = []
        for i in range(sets):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(i)
            graphs.append(g)
        torch.cuda.synchronize()
        return graphs
    except Exception as e:  # capture refused: time direct calls, and say so
        print(f"# cuda graph capture failed ({str(e)[:120]}); timing direct calls", file=sys.stderr)
        torch.cuda.synchronize()
        return None


def kernel_names(fn):
    """The names of the CUDA kernels one call fn(0) launches, in order (torch.profiler), so that a
    row can be compared with the cuBLASLt algorithm zaya kept (its algo_fields); an error text in a
    one-element list when the profiler cannot say."""
    import torch
    try:
        from torch.profiler import ProfilerActivity, profile
        fn(0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(0)
            torch.cuda.synchronize()
        names = []
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in names:
                names.append(e.name)
        return names
    except Exception as e:  # diagnostic only: never fails the measurement
        return [f"(profiler: {str(e)[:160]})"]


def gemm_peer(rows, timer, with_kernels=False):
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
        free, _ = torch.cuda.mem_get_info()
        sets = int(r.get("sets") or operand_sets(l2, m, n, k, g, es, free))
        xs, ws, ys = [], [], []
        launch = "direct"
        try:
            for _ in range(sets):
                x = torch.empty((g, m, k), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
                w = torch.empty((g, n, k), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
                if dt == "fp8":
                    x, w = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                else:
                    ys.append(torch.empty((g, m, n), device="cuda", dtype=torch.bfloat16))
                    if g == 1:
                        ys[-1] = ys[-1][0]
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
                # Called directly, _scaled_mm costs ~200 us per call whatever the shape (a host-side
                # synchronisation inside the call defeats the held-stream timing), so each operand
                # set's calls are replayed from a CUDA graph when capture works.
                graphs = capture_graphs(fn, sets)
                if graphs is not None:
                    fn = lambda i, graphs=graphs: graphs[i].replay()
                    launch = "cuda-graph"
            elif g > 1:
                def fn(i):
                    torch.bmm(xs[i], ws[i].transpose(1, 2), out=ys[i])
            else:
                def fn(i):
                    torch.matmul(xs[i], ws[i].t(), out=ys[i])
            us, iters, warm = timer.measure(fn, sets, r.get("iters"), r.get("warm"))
            gflop = 2.0 * m * n * k * g / 1e9
            out.append(dict({"name": r["name"], "m": m, "n": n, "k": k, "groups": g,
                             "dtype": dt, "time_us": us, "tflops": gflop / (us * 1e-6) / 1e3,
                             "sets": sets, "iters": iters, "warm": warm, "launch": launch},
                            **timer.window))
            if with_kernels:  # after the timing, which it must not disturb
                out[-1]["kernels"] = kernel_names(fn)
        except Exception as e:  # a shape torch cannot run is reported, not fatal
            out.append({"name": r["name"], "m": m, "n": n, "k": k, "groups": g, "dtype": dt,
                        "error": str(e)[:200]})
        del xs, ws, ys
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


def median_events_us(fn, warmup, iters):
    """`zaya bench mem`'s device timing: warm-up calls, then per-call CUDA events, median."""
    import torch
    for _ in range(warmup):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in ev)


def mem_peer(warmup, iters, max_bytes):
    import torch
    out = []
    cudart = load_cudart()
    size = 1 << 20
    while size <= max_bytes:
        src = torch.empty(size, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        us = median_events_us(lambda: dst.copy_(src), warmup, iters)
        out.append({"name": "torch_copy", "size": size, "time_us": us,
                    "gbs": 2 * size / (us * 1e-6) / 1e9})
        if cudart is not None:
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            fn = cudart.cudaMemcpyAsync
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                           ctypes.c_void_p]

            def memcpy():
                rc = fn(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()), size, 3,
                        stream)  # 3 = cudaMemcpyDeviceToDevice
                if rc != 0:
                    raise RuntimeError(f"cudaMemcpyAsync returned {rc}")
            us = median_events_us(memcpy, warmup, iters)
            out.append({"name": "cudaMemcpy_d2d", "size": size, "time_us": us,
                        "gbs": 2 * size / (us * 1e-6) / 1e9})
        del src, dst
        torch.cuda.empty_cache()
        size *= 4
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm-json", help="zaya bench gemm --json output (shapes, counts, policy)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=1, help="measure the GEMM list this many times")
    ap.add_argument("--skip-mem", action="store_true", help="GEMMs only")
    ap.add_argument("--no-nvml", action="store_true", help="do not sample the clock")
    ap.add_argument("--kernel-names", action="store_true",
                    help="also record each GEMM row's CUDA kernel names (torch.profiler)")
    ap.add_argument("--mem-iters", type=int, default=20, help="as `zaya bench mem -n`")
    ap.add_argument("--mem-warmup", type=int, default=3, help="as `zaya bench mem -w`")
    ap.add_argument("--mem-max", default=str(4 << 30), help="largest copy in bytes")
    a = ap.parse_args()
    result = {"schema": "zaya.bench.peer/2"}
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
    result["cublas_workspace_config"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        result["blas_library"] = str(torch.backends.cuda.preferred_blas_library())
    except Exception:  # older PyTorch: cuBLAS is the only choice
        result["blas_library"] = "cublas"
    result["bf16_reduced_precision_reduction"] = \
        bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    if a.gemm_json:
        doc = json.load(open(a.gemm_json))
        policy = dict(DEFAULT_POLICY, **doc.get("timing", {}))
        result["timing"] = policy
        nvml = None
        if not a.no_nvml:
            bus = pci_bus_id()
            nvml = Nvml(bus) if bus else None
            result["pci_bus_id"] = bus
            result["nvml"] = nvml.backend if nvml is not None and nvml.ok else None
            if nvml is not None and not nvml.ok:
                nvml = None
                print("# NVML unavailable: rows carry no clock samples", file=sys.stderr)
        timer = Timer(policy, nvml)
        result["sleep_cycles_per_us"] = timer.cycles_per_us
        result["t_start"] = time.time()
        rounds = [gemm_peer(doc["results"], timer, a.kernel_names)
                  for _ in range(max(1, a.rounds))]
        result["t_end"] = time.time()
        result["gemm_rounds"] = rounds
        # "gemm": the best round per shape (highest TFLOP/s), for readers of the old layout.
        best = {}
        for rnd in rounds:
            for p in rnd:
                key = (p["m"], p["n"], p["k"], p["groups"], p["dtype"])
                if "tflops" in p and ("tflops" not in best.get(key, {}) or
                                      p["tflops"] > best[key]["tflops"]):
                    best[key] = p
                best.setdefault(key, p)
        result["gemm"] = list(best.values())
    if not a.skip_mem:
        result["mem"] = mem_peer(a.mem_warmup, a.mem_iters, int(a.mem_max))
    tmp = a.out + ".tmp"
    json.dump(result, open(tmp, "w"), indent=1)
    os.replace(tmp, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
