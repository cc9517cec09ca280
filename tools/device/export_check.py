#!/usr/bin/env python3
"""Loads a `zaya ckpt export-hf` directory with transformers' ZayaForCausalLM (from_pretrained, the
stored balancing biases put back as tools/make_parity_fixtures.py explains) and prints, for the
token ids in IDS_FILE (whitespace-separated), the mean next-token cross-entropy as `zaya eval
--ids-file` reports it, then the greedy continuation of its first 8 ids (N new tokens) as `zaya
generate --greedy --print-ids` does:
    python3 tools/device/export_check.py DIR IDS_FILE N
"""
import os
import sys

import torch
from transformers import ZayaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from make_parity_fixtures import restore_balancing_biases  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    d, n = sys.argv[1], int(sys.argv[3])
    with open(sys.argv[2]) as f:
        ids = [int(t) for t in f.read().split()]
    model = ZayaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    restore_balancing_biases(model, d)
    x = torch.tensor([ids])
    with torch.no_grad():
        print(f"loss {model(x, labels=x).loss.item():.8f}")
        out = model.generate(x[:, :8], max_new_tokens=n, do_sample=False, min_new_tokens=n)
    print(" ".join(str(t) for t in out[0, 8:].tolist()))


if __name__ == "__main__":
    main()
