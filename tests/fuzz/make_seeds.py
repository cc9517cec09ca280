#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/fuzz_*.cpp) into OUT/<target>/: small
valid inputs of each format, derived from the repository's own fixtures and configs where it has
them, so libFuzzer starts from files that get past the first checks. Standard library only.

usage: make_seeds.py OUT_DIR
"""
import json
import pathlib
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def put(out, target, name, data):
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] in data order."""
    hdr, off, body = {}, 0, b""
    if metadata:
        hdr["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        body += data
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + body


def megatron(seqs, docs, code=8, fmt="<H"):
    """An MMIDIDX pair as one fuzz input: u32 len(idx), idx, bin."""
    size = struct.calcsize(fmt)
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([code])
    idx += struct.pack("<QQ", len(seqs), len(docs))
    idx += b"".join(struct.pack("<i", len(s)) for s in seqs)
    ptr = 0
    for s in seqs:
        idx += struct.pack("<q", ptr)
        ptr += len(s) * size
    idx += b"".join(struct.pack("<q", d) for d in docs)
    binary = b"".join(struct.pack(fmt, t) for s in seqs for t in s)
    return struct.pack("<I", len(idx)) + idx + binary


def small_tokenizer():
    """mini_gemma.json cut to its first vocabulary entries (and the merges among them)."""
    t = json.loads((ROOT / "tests/fixtures/tokenizer/mini_gemma.json").read_text())
    keep = dict(list(t["model"]["vocab"].items())[:400])
    for a in t["added_tokens"]:
        keep.setdefault(a["content"], a["id"])
    t["model"]["vocab"] = keep
    t["model"]["merges"] = [m for m in t["model"]["merges"]
                            if m[0] in keep and m[1] in keep and m[0] + m[1] in keep][:100]
    return json.dumps(t, ensure_ascii=False, separators=(",", ":"))


def main():
    out = pathlib.Path(sys.argv[1])
    f32 = struct.pack("<6f", *range(6))
    put(out, "fuzz_safetensors", "two.safetensors",
        safetensors([("w", "F32", [2, 3], f32), ("b", "BF16", [2], b"\x80\x3f\x00\x40")],
                    {"format": "pt"}))
    put(out, "fuzz_safetensors", "empty.safetensors", safetensors([("e", "I64", [0, 4], b"")]))
    put(out, "fuzz_safetensors", "unaligned.safetensors",
        safetensors([("u8", "U8", [1], b"\x07"), ("f", "F32", [1], b"\x00\x00\x80\x3f")]))

    put(out, "fuzz_shard_index", "index.json", json.dumps(
        {"metadata": {"total_size": 32}, "weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))

    put(out, "fuzz_manifest", "manifest.json", json.dumps({
        "format": "zaya-checkpoint-manifest", "version": 1, "hash": "xxh64",
        "files": [{"path": "a.bin", "size": 3, "xxh64": "44bc2cf5ad770999"},
                  {"path": "shard/b.bin", "size": 1, "xxh64": "d24ec4f1a98c6e5b"}],
        "extra": {"step": 10, "kind": "zaya-train"}}, indent=2))

    for cfg in sorted((ROOT / "tests/fixtures/parity").glob("*/config.json")):
        put(out, "fuzz_model_config", cfg.parent.name + ".json", cfg.read_bytes())

    put(out, "fuzz_tokenizer", "small_gemma.json", small_tokenizer())
    put(out, "fuzz_tokenizer", "minimal.json",
        '{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"<0x41>":3},"merges":[["a","b"]],'
        '"byte_fallback":true},"added_tokens":[{"id":4,"content":"<s>","special":true}]}')

    put(out, "fuzz_indexed_dataset", "uint16.bin", megatron([[1, 2, 3], [], [65535]], [0, 1, 3]))
    put(out, "fuzz_indexed_dataset", "int32.bin",
        megatron([[70000], [0, -1]], [0, 2], code=4, fmt="<i"))
    put(out, "fuzz_indexed_dataset", "empty.bin", megatron([[]], [0, 1], code=4, fmt="<i"))

    for toml in sorted((ROOT / "configs").glob("*.toml")):
        put(out, "fuzz_run_config", toml.name, toml.read_bytes())
    put(out, "fuzz_run_config", "rules.toml", '''[optim]
betas = [0.9, 0.95]
rules = [{ pattern = "re:model\\\\.layers\\\\.(\\\\d+)\\\\..*", optimizer = "muon", lr_mult = 0.5 }]
[[phase]]
name = """long
name"""
tokens = 1000
batch_start = 1
batch_ramp_tokens = 500
[[phase]]
name = 'two'
tokens = 2000
''')


if __name__ == "__main__":
    main()
