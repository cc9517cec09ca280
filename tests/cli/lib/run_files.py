"""What the script tests read back from a training run's --out directory, for python3 heredocs in
tests/cli/*.sh (`sys.path.insert(0, SRC + "/tests/cli/lib")`):
  losses(run)   the records of run/metrics.jsonl, in order
  weights(run)  run/model/model.safetensors as {name: tuple of floats} (F32 tensors only)
"""
import json
import struct


def losses(run):
    with open(f"{run}/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def weights(run):
    with open(f"{run}/model/model.safetensors", "rb") as f:
        b = f.read()
    h = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + h])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        out[k] = struct.unpack(f"<{(e - s) // 4}f", b[8 + h + s:8 + h + e])
    return out
