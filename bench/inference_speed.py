#!/usr/bin/env python
"""Inference tokens/s: folded anGPT vs folded GPT+ vs transformers' Llama of one shape (docs/inference-fold.md).

    python bench/inference_speed.py [--hidden 512 --layers 8 --heads 8 --vocab 16384 --repeats 7] [--compile]
                                    [--device cuda --dtype bfloat16]

All models run side by side in one process, interleaved repetition by repetition (so machine noise hits
them alike), same dtype, same attention backend (sdpa), same threads; medians are reported. The unfolded
(training-form) anGPT is included to show what the fold removes.
  prefill: one forward over B × T prompt tokens (use_cache=False), tokens/s = B·T / time
  decode:  after a prefill of P tokens, N single-token steps through the KV cache, tokens/s = B·N / time
  --compile: decode through a StaticCache with the single-token step under torch.compile(fullgraph=True,
  dynamic=False), every model alike (transformers' compiled static-cache decoding path; the prefill stays eager);
  folded anGPT also decodes eagerly through the dynamic cache in the same run (the "compiled / eager" ratio), and
  the batch-1 bound is printed: one decode step reads every weight once, so tokens/s ≤ memory bandwidth / weight
  bytes, with the bandwidth measured in the same run (a large tensor copy)
Two clocks: wall time, and process CPU time / threads (less sensitive to other processes on a shared machine).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache, StaticCache

import modeling_angpt  # noqa: F401
from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from results_file import help_description


EAGER_ANGPT = "anGPT (folded, eager dynamic cache)"  # --compile: the folded weights on the eager path


def build_models(args, dtype):
    shape = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                 num_attention_heads=args.heads, max_position_embeddings=4096)
    models = {}
    angpt = AnGPTForCausalLM._from_config(AnGPTConfig(architecture="angpt", **shape), attn_implementation="sdpa")
    with torch.no_grad():  # trained-looking scales, so nothing folds to a trivial 1
        for p in angpt.parameters():
            if p.ndim == 1:
                p.mul_(1 + 0.1 * torch.randn_like(p))
    models["anGPT (folded)"] = angpt.fold(dtype)
    models["anGPT (training form)"] = angpt.to(dtype)
    gptplus = AnGPTForCausalLM._from_config(AnGPTConfig(architecture="gptplus", **shape), attn_implementation="sdpa")
    models["GPT+ (folded norms)"] = gptplus.fold(dtype)
    llama = LlamaForCausalLM._from_config(LlamaConfig(intermediate_size=4 * args.hidden, tie_word_embeddings=False,
                                                      **shape), attn_implementation="sdpa")
    models["Llama (transformers)"] = llama.to(dtype)
    if args.compile:  # the same folded weights on the eager dynamic-cache path, for the compiled / eager ratio
        models[EAGER_ANGPT] = models["anGPT (folded)"]
    return {name: m.to(args.device).eval() for name, m in models.items()}


def memory_bandwidth(device: str, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second of a large tensor copy (one read and one write per byte), median of `repeats`."""
    source = torch.ones(megabytes * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    times = []
    for _ in range(repeats + 1):
        start = clocks()
        target.copy_(source)
        times.append(elapsed(start)[0])
    return 2 * source.numel() * source.element_size() / statistics.median(times[1:])


DEVICE = "cpu"  # set by main(); the clocks wait for the GPU's queue, otherwise they would time the launches only


def clocks():
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter(), time.process_time()


def elapsed(start):
    """(wall seconds, process CPU seconds / threads): the second is robust to other processes on a shared machine."""
    wall, cpu = clocks()
    return wall - start[0], (cpu - start[1]) / torch.get_num_threads()


@torch.no_grad()
def prefill_time(model, ids):
    start = clocks()
    model(ids, use_cache=False, logits_to_keep=1)
    return elapsed(start)


_static = {}  # (model, batch) -> (StaticCache, compiled step): one cache object, so the compiled step is reused


@torch.no_grad()
def decode_time(model, ids, steps, compiled=False, capacity=None):
    if compiled:
        key = (id(model), ids.shape[0])
        if key not in _static:
            cache = StaticCache(config=model.config, max_cache_len=capacity or ids.shape[1] + steps)
            _static[key] = cache, torch.compile(model, fullgraph=True, dynamic=False)
        cache, step = _static[key]
        cache.reset()
    else:
        cache, step = DynamicCache(config=model.config), model
    out = model(ids, cache=cache, use_cache=True, logits_to_keep=1)
    token = out.logits[:, -1:].argmax(-1)
    start = clocks()
    for _ in range(steps):
        out = step(token, cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
    return elapsed(start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--prefill-len", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128, help="prefill before the decode steps")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="compiled static-cache decoding (see above)")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    models = build_models(args, dtype)
    results = {}  # (phase, batch, model) -> [tokens/s]
    capacity = args.prompt_len + args.decode_steps  # one static cache size for warm-up and measurement
    for batch in args.batches:
        prefill_ids = torch.randint(0, args.vocab, (batch, args.prefill_len), device=args.device)
        prompt_ids = torch.randint(0, args.vocab, (batch, args.prompt_len), device=args.device)
        for model in models.values():  # warm-up
            prefill_time(model, prefill_ids[:, :32])
            decode_time(model, prompt_ids, 2, args.compile, capacity)  # the decode shapes, so compiling happens here
        for _ in range(args.repeats):
            for name, model in models.items():
                for clock, t in zip(("wall", "cpu"), prefill_time(model, prefill_ids)):
                    results.setdefault((clock, "prefill", batch, name), []).append(batch * args.prefill_len / t)
                compiled = args.compile and name != EAGER_ANGPT
                for clock, t in zip(("wall", "cpu"), decode_time(model, prompt_ids, args.decode_steps, compiled, capacity)):
                    results.setdefault((clock, "decode", batch, name), []).append(batch * args.decode_steps / t)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"machine: {where}, "
          f"torch {torch.__version__}, {args.dtype}, sdpa" + (", compiled static-cache decoding" if args.compile else ""))
    print(f"shape: d={args.hidden}, L={args.layers}, H={args.heads}, MLP 4d, vocab {args.vocab}; "
          f"prefill {args.prefill_len} tokens; decode {args.decode_steps} steps after {args.prompt_len}; "
          f"median of {args.repeats}")
    names = list(models)
    extra = " | folded anGPT compiled / eager |" if args.compile else " |"
    print("\n| clock | phase | batch | " + " | ".join(f"{n} tok/s" for n in names) + " | folded anGPT / GPT+" + extra)
    print("|---|---|---|" + "---|" * len(names) + "---|" + ("---|" if args.compile else ""))
    for clock in ("wall", "cpu"):
        for phase in ("prefill", "decode"):
            for batch in args.batches:
                medians = {n: statistics.median(results[(clock, phase, batch, n)]) for n in names}
                ratio = medians["anGPT (folded)"] / medians["GPT+ (folded norms)"]
                row = (f"| {clock} | {phase} | {batch} | " + " | ".join(f"{medians[n]:.0f}" for n in names)
                       + f" | {ratio:.3f}× |")
                if args.compile:
                    speedup = medians["anGPT (folded)"] / medians[EAGER_ANGPT]
                    row += f" {speedup:.2f}× |" if phase == "decode" else " – |"
                print(row)
    if args.compile:
        weights = sum(p.numel() * p.element_size() for p in models["anGPT (folded)"].parameters())
        bandwidth = memory_bandwidth(args.device)
        print(f"\nbatch-1 decode bound: {bandwidth / 1e9:.1f} GB/s copy bandwidth (measured now) / "
              f"{weights / 1e6:.0f} MB of folded anGPT weights = {bandwidth / weights:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
