#!/usr/bin/env python3
"""The PyTorch peer of `zaya bench infer`: transformers' ZayaForCausalLM on the same GPU, same model
shape (a config.json written by `zaya bench infer --write-config F`), random bf16 weights.

Measures, like zaya's benchmark:
  prefill: one forward pass over batch x prompt tokens with the cache enabled (median of repeats);
  decode:  greedy steps with the model's own cache, timed per step after warm-up steps,
           via a manual loop over forward(past_key_values=...) (what generate() does per token,
           without its logits processors), and also generate() end to end for reference.
Prints a small table and writes JSON (--json). Needs no network.

    python3 tools/bench_infer_peer.py --config cfg.json --batch 1 --prompt 4096 --decode 128
"""
import argparse
import json
import statistics
import time

import torch
from transformers import ZayaConfig, ZayaForCausalLM


def sync_time():
    torch.cuda.synchronize()
    return time.perf_counter()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, ...)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    with open(a.config) as f:
        cj = json.load(f)
    cj.pop("architectures", None)
    cj.pop("model_type", None)
    cj["dtype"] = "bfloat16"
    cfg = ZayaConfig(**cj)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ZayaForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16,
                                             attn_implementation=a.attn).eval()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt), device="cuda")

    with torch.no_grad():
        pre = []
        for r in range(a.repeats + 1):
            t0 = sync_time()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            t1 = sync_time()
            if r > 0:
                pre.append(t1 - t0)
        prefill_s = statistics.median(pre)

        # Manual greedy decode loop on the model's cache.
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(a.warmup):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = sync_time()
        for _ in range(a.decode):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        decode_s = (sync_time() - t0) / a.decode

        # generate() end to end: (time for n new tokens - time for 1) / (n - 1).
        def gen(n):
            t0 = sync_time()
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=cfg.pad_token_id, eos_token_id=None)
            return sync_time() - t0
        gen(2)
        g1, gn = gen(1), gen(a.decode + 1)
        generate_step_s = (gn - g1) / a.decode

    res = {
        "peer": f"transformers ZayaForCausalLM ({a.attn}), torch {torch.__version__}",
        "layers": cfg.num_hidden_layers, "batch": a.batch, "prompt": a.prompt,
        "decode_steps": a.decode,
        "prefill_ms": prefill_s * 1e3,
        "prefill_tokens_per_s": a.batch * a.prompt / prefill_s,
        "decode_ms_per_step": decode_s * 1e3,
        "decode_tokens_per_s": a.batch / decode_s,
        "generate_ms_per_step": generate_step_s * 1e3,
        "gpu": torch.cuda.get_device_name(),
    }
    for k, v in res.items():
        print(f"{k:28s} {v:.3f}" if isinstance(v, float) else f"{k:28s} {v}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
