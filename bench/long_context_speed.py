#!/usr/bin/env python
"""Long context on a GPU (docs/attention.md): one T-token forward and one training step per attention backend,
with the time, the peak device memory, and the agreement of the last positions' logits with the eager math.

For each (logit transform, sparsity) the backends that compute it exactly (configuration_angpt.backend_computes)
run the same anGPT model: `angpt_chunked` (the eager math, a chunk of queries at a time), compiled
`flex_attention` (fused kernel, no T×T scores) and `sdpa` where the transform is an additive bias. Agreement is
measured in float32 against `angpt_chunked` in float32 (TF32 off), so it checks the kernels, not bf16 rounding;
time and memory are measured under bf16 autocast on CUDA (float32 on a CPU). FlexAttention compiles once in a
warm-up forward and backward at the full length; a row that fell back to the chunked path says so.

    python bench/long_context_speed.py                   # CUDA: T=16384, d=512, 4 layers, 8 heads
    python bench/long_context_speed.py --device cpu --length 64 --hidden 32 --layers 1 --heads 2 --no-write
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import torch

import results_file as rf
from throughput import synchronize

VARIANTS = [("none", "none"), ("alibi", "none"), ("scale_invariant", "none"), ("scale_invariant", "window")]
BACKENDS = ("angpt_chunked", "flex_attention", "sdpa")
KEEP = 64  # last positions whose logits are compared
# flex_angpt.MASK_CHUNK_ELEMENTS values timed for the BlockMask build (2^24: the default on CUDA, 2^22 elsewhere)
MASK_CHUNKS = (1 << 20, 1 << 22, 1 << 24)


def model_config(args, transform: str, sparsity: str):
    from modeling_angpt import AnGPTConfig

    return AnGPTConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, max_position_embeddings=args.length, architecture="angpt",
                       rope_parameters={"rope_type": "scale_invariant_p"}, attention_logit_transform=transform,
                       attention_sparsity=sparsity, attention_window=args.window,
                       attention_query_chunk_size=args.chunk, use_cache=False)


def build(args, transform: str, sparsity: str, backend: str):
    from modeling_angpt import AnGPTForCausalLM

    torch.manual_seed(0)
    return AnGPTForCausalLM._from_config(model_config(args, transform, sparsity),
                                         attn_implementation=backend).to(args.device)


def timed(fn, device: torch.device, repeats: int) -> tuple[float, float | None]:
    """(median seconds, peak device memory in MiB or None on a CPU) of `fn` after one warm-up call."""
    fn()
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return statistics.median(times), peak


def measure(args, transform: str, sparsity: str, backend: str, ids: torch.Tensor, reference) -> dict:
    from modeling_angpt import flex_angpt

    device = torch.device(args.device)
    model = build(args, transform, sparsity, backend)
    with torch.no_grad():
        logits = model(ids, logits_to_keep=KEEP).logits.float()
    error = None if reference is None else ((logits - reference).abs().max() / reference.abs().max()).item()
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext())

    def forward():
        with torch.no_grad(), autocast:
            model(ids, logits_to_keep=1)

    def train_step():
        with autocast:
            loss = model(ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    row = {"error": error, "logits": logits}
    row["forward_s"], row["forward_mib"] = timed(forward, device, args.repeats)
    row["train_s"], row["train_mib"] = None, None  # FlexAttention has no backward on a CPU
    if device.type == "cuda":
        try:  # SDPA's dense [h, T, T] ALiBi bias, with its gradient, can outgrow the device at long T
            row["train_s"], row["train_mib"] = timed(train_step, device, args.repeats)
        except torch.cuda.OutOfMemoryError:
            total = torch.cuda.get_device_properties(device).total_memory / 2**20
            row["train_s"], row["train_mib"] = "out of memory", f"> {total:,.0f}"
            model.zero_grad(set_to_none=True)
    row["fell_back"] = backend == "flex_attention" and flex_angpt._failed
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def block_mask_costs(args, transform: str, sparsity: str) -> dict:
    """{elements per step: (median seconds, MiB held above the start or None on a CPU)} of building the BlockMask of
    one unpadded row of args.length tokens alone, for each of MASK_CHUNKS: the eager work a FlexAttention forward
    does once, before its layers (from the layout AnGPTModel.forward builds for it)."""
    from modeling_angpt import flex_angpt
    from modeling_angpt.attention_layout_angpt import AttentionLayout

    device = torch.device(args.device)
    config = model_config(args, transform, sparsity)
    length = args.length
    layout = AttentionLayout.build(config, attention_mask=None, position_ids=torch.arange(length, device=device)[None],
                                   cache=None, past_seen=0, batch=1, packed=False)
    mask_mod, _ = flex_angpt.mods(config, layout, device, 1, length, length)
    costs = {}
    for chunk in MASK_CHUNKS:
        before = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else None
        with mock.patch.dict(flex_angpt.MASK_CHUNK_ELEMENTS, {device.type: chunk}):
            seconds, peak = timed(lambda: flex_angpt.block_mask(mask_mod, 1, length, length, device), device,
                                  args.repeats)
        costs[chunk] = (seconds, None if peak is None else peak - before)
    return costs


def section(args, rows: list, masks: dict, command: str) -> str:
    from modeling_angpt import flex_angpt

    device = torch.device(args.device)
    precision = "bf16 autocast" if device.type == "cuda" else "float32"
    where = "a GPU" if device.type == "cuda" else device.type.upper()
    lines = [f"## Long context on {where}: one {args.length:,}-token "
             "forward and training step per attention backend (FlexAttention, chunked eager, SDPA)", "",
             f"`{command}`", "", rf.machine_line(device.type), "",
             f"anGPT d={args.hidden}, {args.layers} layers, {args.heads} heads (d_h={args.hidden // args.heads}), "
             f"vocab {args.vocab}, scale-invariant p-RoPE positions, batch 1, T={args.length}; `angpt_chunked` with "
             f"{args.chunk} queries per chunk, window {args.window} for the window rows. Times and peak memory: "
             f"{precision}, median of {args.repeats} after one warm-up call (FlexAttention compiles there); training "
             "step = forward, loss and backward, peak memory includes the weights and gradients. 'Error': max |Δ| "
             f"of the last {KEEP} positions' logits against `angpt_chunked`, over its max |logit|, both in float32 "
             "(TF32 off).", "",
             "| logit transform | sparsity | backend | error vs chunked (fp32) | forward (ms) | forward peak (MiB) "
             "| train step (ms) | train peak (MiB) |", "|---|---|---|---|---|---|---|---|"]

    def ms(value):
        return "—" if value is None else value if isinstance(value, str) else f"{1000 * value:.1f}"

    def mib(value):
        return "—" if value is None else value if isinstance(value, str) else f"{value:,.0f}"

    for (transform, sparsity, backend), r in rows:
        error = f"{r['error']:.1e}" if r["error"] is not None else (
            "reference" if backend == "angpt_chunked" else "—")
        if r["fell_back"]:
            error += " (fell back to chunked)"
        lines.append(f"| {transform} | {sparsity} | {backend} | {error} | {ms(r['forward_s'])} | "
                     f"{mib(r['forward_mib'])} | {ms(r['train_s'])} | {mib(r['train_mib'])} |")
    device_default = flex_angpt.mask_chunk_elements(device)
    lines += ["", "Building the BlockMask alone (`flex_angpt.block_mask`, what a FlexAttention forward does once "
              "before its layers) with at most 2^k (row, query, key) elements per step (`MASK_CHUNK_ELEMENTS`; the "
              f"default on {device.type}: 2^{device_default.bit_length() - 1}): median ms of {args.repeats}, and the "
              "MiB it holds at its peak above what was allocated before.", "",
              "| logit transform | sparsity | " + " | ".join(
                  f"2^{c.bit_length() - 1}{' (default)' if c == device_default else ''}: ms; MiB"
                  for c in MASK_CHUNKS) + " |",
              "|---|---|" + "---|" * len(MASK_CHUNKS)]
    for (transform, sparsity), costs in masks.items():
        lines.append(f"| {transform} | {sparsity} | " + " | ".join(
            f"{ms(seconds)}; {mib(held)}" for seconds, held in costs.values()) + " |")
    return "\n".join(lines)


def main(argv=None) -> list:
    from modeling_angpt.configuration_angpt import backend_computes

    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    names = [f"{t}:{s}" for t, s in VARIANTS]
    parser.add_argument("--variants", nargs="+", default=names, choices=names, metavar="TRANSFORM:SPARSITY")
    rf.add_output_arguments(parser)
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False  # the error column compares kernels, not TF32 rounding
    torch.backends.cudnn.allow_tf32 = False
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (1, args.length), generator=generator).to(args.device)
    name = "long_context_speed" if args.device.startswith("cuda") else "long_context_speed_cpu"  # not the GPU's
    variants = [tuple(v.split(":")) for v in args.variants]
    if not any(backend_computes(b, t, s) for t, s in variants for b in args.backends):
        parser.error("--backends: none of them computes any of --variants (configuration_angpt.backend_computes)")
    rows, masks = [], {}
    for transform, sparsity in variants:
        masks[transform, sparsity] = block_mask_costs(args, transform, sparsity)
        print(transform, sparsity, "block mask", masks[transform, sparsity], flush=True)
        reference = None
        for backend in [b for b in args.backends if backend_computes(b, transform, sparsity)]:
            row = measure(args, transform, sparsity, backend, ids, reference)
            if backend == "angpt_chunked":
                reference = row["logits"]
            rows.append(((transform, sparsity, backend), row))
            print(transform, sparsity, backend, {k: v for k, v in row.items() if k != "logits"}, flush=True)
            text = section(args, rows, masks, rf.command_line(__file__, argv))
            if not args.no_write:  # after every row: a run stopped later keeps what it measured
                rf.update_section(name, text, args.results)
    print(text)
    return rows


if __name__ == "__main__":
    main()
