#!/usr/bin/env python3
"""A stand-in for the ranks of `zaya train` and `zaya health` in the supervisor's tests
(tests/ft/test_supervisor.cpp): it speaks the protocol of src/dist/ft_protocol.h to
ZAYA_SUPERVISOR and obeys ZAYA_FAULTS, without training anything. Also the launcher: run as
`mpirun [-np N] [-x NAME]... COMMAND...` (the name it is called by) it starts N copies of COMMAND
with FAKE_RANK/FAKE_WORLD set and, like mpirun, ends the others when one fails.

As `zaya train --out D [--steps N] [--resume auto]`: steps of FAKE_STEP_S seconds through the
sections data, forward, backward, collective, optimizer; a checkpoint every step (D/fake_ckpt
holds the step; `--resume auto` starts after it). Faults (KIND@rank=R,step=S[,section=X][,arg=V]):
kill (SIGKILL itself), exit (code arg), hang (stops in the section, beats go on), nan (a
nonfinite event, exit 3), slow (steps arg times longer from step S on). FAKE_LOG, when set, gets
one line per train process: "attempt rank argv...". FAKE_BADCONFIG=1 exits 2 at once;
FAKE_NO_BYE=1 ends a completed run without a bye.
As `zaya health`: a health event, failing for the ranks listed in FAKE_UNHEALTHY ("1,3").
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def launcher(argv):
    n, i = 1, 1
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("-np", "-n"):
            n = int(argv[i + 1])
            i += 2
        elif argv[i] == "-x":
            i += 2
        else:
            i += 1
    cmd = argv[i:]
    procs = []
    for r in range(n):
        env = dict(os.environ, FAKE_RANK=str(r), FAKE_WORLD=str(n))
        procs.append(subprocess.Popen(cmd, env=env))

    def forward(sig, _):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)
        sys.exit(128 + sig)

    signal.signal(signal.SIGTERM, forward)
    code = 0
    while any(p.poll() is None for p in procs):
        for p in procs:
            rc = p.poll()
            if rc not in (None, 0) and code == 0:
                code = rc if rc > 0 else 128 - rc
                for q in procs:
                    if q.poll() is None:
                        q.kill()
        time.sleep(0.01)
    for p in procs:
        rc = p.wait()
        if rc != 0 and code == 0:
            code = rc if rc > 0 else 128 - rc
    sys.exit(code)


class Rank:
    def __init__(self, kind):
        self.rank = int(os.environ.get("FAKE_RANK", "0"))
        self.world = int(os.environ.get("FAKE_WORLD", "1"))
        self.attempt = int(os.environ.get("ZAYA_SUPERVISOR_ATTEMPT", "0"))
        host, port = os.environ["ZAYA_SUPERVISOR"].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.lock = threading.Lock()
        self.step, self.section = 0, "startup"
        self.kind = kind

    def send(self, type_, **kw):
        m = dict(type=type_, rank=self.rank, world=self.world, host=socket.gethostname(),
                 pid=os.getpid(), attempt=self.attempt, t=time.time(), **kw)
        with self.lock:
            self.sock.sendall((json.dumps(m) + "\n").encode())

    def beat(self, step, section, **kw):
        self.step, self.section = step, section
        self.send("beat", step=step, section=section, **kw)

    def beats_forever(self):
        def loop():
            while True:
                time.sleep(0.2)
                self.send("beat", step=self.step, section=self.section, step_s=None)
        threading.Thread(target=loop, daemon=True).start()


def faults_for(rank):
    out = []
    for item in filter(None, os.environ.get("ZAYA_FAULTS", "").split(";")):
        kind, rest = item.split("@", 1)
        f = dict(kind=kind)
        for kv in rest.split(","):
            k, v = kv.split("=", 1)
            f[k] = v
        if int(f["rank"]) == rank:
            out.append(f)
    return out


def option(args, name, default=None):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return default


def train(args):
    if os.environ.get("FAKE_BADCONFIG") == "1":
        print("zaya train: error: bad config (fake)", file=sys.stderr)
        sys.exit(2)
    r = Rank("train")
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(f"{r.attempt} {r.rank} {' '.join(args)}\n")
    out = option(args, "--out", ".")
    steps = int(option(args, "--steps", "10"))
    step_s = float(os.environ.get("FAKE_STEP_S", "0.05"))
    ckpt = os.path.join(out, "fake_ckpt")
    start = 0
    if option(args, "--resume") == "auto" and os.path.exists(ckpt):
        start = int(open(ckpt).read())
    r.send("hello", step=start, kind="train")
    r.beats_forever()
    r.beat(0, "startup")
    if start:
        r.beat(start, "checkpoint")
        time.sleep(0.02)
    faults = faults_for(r.rank)
    slow = 1.0
    last = None
    for s in range(start + 1, steps + 1):
        busy = None
        t0 = time.time()
        for section in ("data", "forward", "backward", "collective", "optimizer", "checkpoint"):
            extra = dict(step_s=last, busy_s=last_busy) if section == "data" and last else {}
            r.beat(s, section, **extra)
            for f in faults:
                if int(f["step"]) != s or f.get("section", "forward") != section:
                    continue
                r.send("event", event="fault_injected", step=s, kind=f["kind"])
                if f["kind"] == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if f["kind"] == "exit":
                    code = int(f.get("arg", "1"))
                    r.send("bye", status="error", step=s, code=code)
                    sys.exit(code)
                if f["kind"] == "hang":
                    while True:
                        time.sleep(1)
                if f["kind"] == "nan":
                    r.send("event", event="nonfinite", step=s, message="loss is nan (fake)")
                    r.send("bye", status="error", step=s, code=3)
                    sys.exit(3)
                if f["kind"] == "slow":
                    slow = float(f.get("arg", "2"))
            if section == "collective":
                busy = time.time() - t0
            if section in ("forward", "backward"):
                time.sleep(step_s * slow / 2)
            if section == "checkpoint":
                if r.rank == 0:
                    with open(ckpt + ".tmp", "w") as fh:
                        fh.write(str(s))
                    os.replace(ckpt + ".tmp", ckpt)
                r.send("event", event="checkpoint_saved", step=s)
        last, last_busy = time.time() - t0, busy
    r.beat(steps, "shutdown")
    if os.environ.get("FAKE_NO_BYE") != "1":
        r.send("bye", status="completed", step=steps, code=0)
    sys.exit(0)


def health(args):
    r = Rank("health")
    r.send("hello", step=0, kind="health")
    bad = [int(x) for x in filter(None, os.environ.get("FAKE_UNHEALTHY", "").split(","))]
    ok = r.rank not in bad
    checks = [dict(name="gemm", ok=ok, value=100.0 if ok else 1.0, limit=50.0)]
    r.send("event", event="health", step=0, ok=ok, checks=checks)
    r.send("bye", status="completed" if ok else "error", step=0, code=0 if ok else 1)
    sys.exit(0 if ok else 1)


def main():
    name = os.path.basename(sys.argv[0])
    if name in ("mpirun", "fake_mpirun"):
        launcher(sys.argv)
    sub, args = sys.argv[1], sys.argv[2:]
    {"train": train, "health": health}[sub](args)


if __name__ == "__main__":
    main()
