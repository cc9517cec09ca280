#!/usr/bin/env python3
"""PyTorch peer for `zaya bench train`: the same training step in transformers' ZayaForCausalLM.

A ZayaConfig equivalent to zaya's preset (src/model/config.cpp) with --layers layers, random init
on the GPU (no weights, no network), fp32 master weights with bf16 autocast, fused AdamW (lr 1e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1; zaya's step runs Muon on the matrices, which costs
more: compare fwd+bwd and optimizer time separately), grad-norm clipping at 1.0, timed steps with
CUDA synchronisation. Reports tokens/s and model TFLOP/s with zaya's FLOP formula (DESIGN.md
§Performance: 6 × matmul parameters active per token incl. the LM head, + 6·S·Hq·d attention per
layer; sizing/model_shape.cpp), and writes JSON.

Expert implementation: transformers' experts interface (integrations/moe.py, `@use_experts_
implementation` on ZayaExperts) offers "eager" (a Python loop over experts), "batched_mm" (one bmm
over per-token copies of the expert weights: at 16K tokens that copy alone is ~270 GB, so it is not
tried by default) and "grouped_mm" (tokens sorted by expert, torch's grouped GEMM; the fastest for
training-size inputs). "sonicmoe"/"deepgemm" need hub kernels (network) and are not used. The
script tries --experts in order and keeps the first that runs a training step; attention is
"sdpa" (PyTorch's flash/cuDNN backends; the flash-attn package is not installed on the H200 image).

Usage: bench_train_peer.py --preset zaya1-base --layers 8 --batch 4 --seq 4096 \
           [--steps 10 --warmup 3 --compile --experts grouped_mm,eager --json out.json]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

PRESETS = {
    # Mirrors ZayaConfig::preset (src/model/config.cpp); defaults are ZAYA1-base.
    "zaya1-base": dict(rope_theta=1e6, eos_token_id=1, max_position_embeddings=32768),
    "zaya1-8b": dict(rope_theta=5e6, eos_token_id=106, max_position_embeddings=32768),
    "tiny": dict(vocab_size=384, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, moe_intermediate_size=128, num_experts=4, router_hidden_size=32,
                 max_position_embeddings=1024, pad_token_id=256, bos_token_id=257,
                 eos_token_id=258, rope_theta=10000.0),
}
BASE = dict(vocab_size=262272, hidden_size=2048, num_attention_heads=8, num_key_value_heads=2,
            head_dim=128, moe_intermediate_size=2048, num_experts=16, router_hidden_size=256,
            cca_time0=2, cca_time1=2, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=2,
            partial_rotary_factor=0.5)


def preset(name, layers, seq):
    p = dict(BASE)
    p.update(PRESETS[name])
    p["num_hidden_layers"] = layers
    p["max_position_embeddings"] = max(p["max_position_embeddings"], seq)
    return p


def flops_per_token(p, seq):
    """zaya's sizing::train_flops_per_token for full (non-sliding) attention layers."""
    D, L, Hq, Hkv, d = p["hidden_size"], p["num_hidden_layers"], p["num_attention_heads"], \
        p["num_key_value_heads"], p["head_dim"]
    R, E, I, V = p["router_hidden_size"], p["num_experts"], p["moe_intermediate_size"], \
        p["vocab_size"]
    C = (Hq + Hkv) * d
    per_layer = (Hq * d * D + Hkv * d * D + Hkv * d * D  # q, k, v current + delayed halves
                 + C * p["cca_time0"] + C * d * p["cca_time1"]  # the two conv kernels
                 + D * Hq * d  # o_proj
                 + R * D + 2 * R * R + (E + 1) * R  # router
                 + 3 * I * D)  # one expert (top-1)
    matmul_active_with_head = L * per_layer + V * D
    attn = 12.0 * L * (seq / 2.0) * Hq * d
    return 6.0 * matmul_active_with_head + attn


def build(p, experts_impl, attn_impl, seed):
    import torch
    from transformers import ZayaConfig, ZayaForCausalLM
    rope = {"rope_type": "default", "rope_theta": p["rope_theta"],
            "partial_rotary_factor": p["partial_rotary_factor"]}
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "moe_intermediate_size", "num_experts",
            "router_hidden_size", "cca_time0", "cca_time1", "rms_norm_eps", "pad_token_id",
            "bos_token_id", "eos_token_id", "max_position_embeddings")
    cfg = ZayaConfig(**{k: p[k] for k in keys}, num_experts_per_tok=1, tie_word_embeddings=True,
                     rope_parameters={"hybrid": rope, "hybrid_sliding": dict(rope)},
                     use_cache=False)
    for attr, value in (("_attn_implementation", attn_impl),
                        ("_experts_implementation", experts_impl)):
        try:  # read by the attention and experts dispatchers; set_* below is the public route
            setattr(cfg, attr, value)
        except Exception:  # noqa: BLE001
            pass
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = ZayaForCausalLM(cfg)  # fp32 parameters: the master weights
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(experts_impl)
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation(attn_impl)
        except Exception:  # older API: the config attribute above is what counts
            pass
    model.train()
    return model, cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="zaya1-base", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--experts", default="grouped_mm,eager",
                    help="experts implementations to try, in order")
    ap.add_argument("--attn", default="sdpa", help="attention implementation")
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = {"kind": "zaya.bench.train/1", "impl": "torch", "preset": a.preset, "layers": a.layers,
           "batch": a.batch, "seq": a.seq, "steps": a.steps, "warmup": a.warmup,
           "compile": a.compile, "peak_tflops": a.peak_tflops}

    def finish(code):
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
            print(f"# wrote {a.json}")
        sys.exit(code)

    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001
        out["error"] = f"import failed: {e}"
        print(out["error"], file=sys.stderr)
        finish(1)
    out.update(torch=torch.__version__, transformers=transformers.__version__,
               device=torch.cuda.get_device_name(0))
    p = preset(a.preset, a.layers, a.seq)
    fpt = flops_per_token(p, a.seq)
    tokens = a.batch * a.seq
    out.update(tokens_per_step=tokens, flops_per_token=fpt, attn_implementation=a.attn)
    print(f"# bench_train_peer: {a.preset}, {a.layers} layers, batch {a.batch} x seq {a.seq} on "
          f"{out['device']}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{fpt / 1e9:.3f} GFLOP/token")
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(a.seed + 1)
    ids = torch.randint(0, p["vocab_size"], (a.batch, a.seq), device="cuda", generator=g)
    labels = ids.clone()  # transformers shifts labels inside the loss

    errors = {}
    model = opt = None
    for impl in [x for x in a.experts.split(",") if x]:
        try:
            model, cfg = build(p, impl, a.attn, a.seed)
            fwd = torch.compile(model) if a.compile else model
            opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                                    weight_decay=0.1, fused=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            out["experts_implementation"] = impl
            break
        except Exception as e:  # noqa: BLE001  (try the next implementation)
            errors[impl] = f"{type(e).__name__}: {e}"[:500]
            print(f"# experts implementation {impl} failed: {errors[impl]}", file=sys.stderr)
            traceback.print_exc(limit=3)
            model = opt = None
            torch.cuda.empty_cache()
    if errors:
        out["experts_errors"] = errors
    if model is None:
        out["error"] = "no experts implementation ran"
        finish(1)
    nparams = sum(t.numel() for t in model.parameters())
    out["params"] = nparams
    print(f"# experts: {out['experts_implementation']}, attention: {a.attn}, "
          f"{nparams / 1e6:.1f}M parameters, compile: {a.compile}")

    torch.cuda.reset_peak_memory_stats()
    rows, losses = [], []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        r = {"fwd_bwd_ms": (t1 - t0) * 1e3, "optim_ms": (t2 - t1) * 1e3, "ms": (t2 - t0) * 1e3}
        print(f"{'warmup' if i < a.warmup else 'step  '} {i if i < a.warmup else i - a.warmup:>3}: "
              f"loss {loss.item():.4f}  gnorm {float(gnorm):.3f}  fwd+bwd {r['fwd_bwd_ms']:8.2f} ms"
              f"  norm+optimizer {r['optim_ms']:8.2f} ms  step {r['ms']:8.2f} ms")
        if i >= a.warmup:
            rows.append(r)
            losses.append(loss.item())
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    step_ms, fb_ms, opt_ms = med("ms"), med("fwd_bwd_ms"), med("optim_ms")
    tps = tokens / (step_ms * 1e-3)
    tflops = tps * fpt / 1e12
    fb_tflops = tokens * fpt / (fb_ms * 1e-3) / 1e12
    out.update(step_ms_median=step_ms, fwd_bwd_ms_median=fb_ms, optimizer_ms_median=opt_ms,
               tokens_per_s=tps, model_tflops=tflops, fwd_bwd_tflops=fb_tflops,
               fraction_of_peak=tflops / a.peak_tflops,
               device_bytes_peak=torch.cuda.max_memory_allocated(),
               device_bytes_reserved=torch.cuda.max_memory_reserved(), losses=losses,
               step_times=rows)
    print(f"\n# median of {len(rows)} steps: step {step_ms:.2f} ms = fwd+bwd {fb_ms:.2f} + "
          f"norm+optimizer {opt_ms:.2f} ms")
    print(f"tokens/s            {tps:12.0f}")
    print(f"model TFLOP/s       {tflops:12.1f}   ({100 * tflops / a.peak_tflops:.1f}% of "
          f"{a.peak_tflops:.0f})")
    print(f"fwd+bwd TFLOP/s     {fb_tflops:12.1f}")
    print(f"device memory       {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB peak allocated")
    finish(0)


if __name__ == "__main__":
    main()
