#!/usr/bin/env python
"""Training step time of GPT+, nGPT and anGPT of one shape, measured side by side (SPEC §5: the paper reports
anGPT +2.75 % and nGPT +9.6 % over GPT+ on 4×A100 with fused kernels).

A step = forward + backward + Adam step + the architecture's weight constraint. The architectures are
interleaved round by round so that drift of the machine affects them alike; medians are reported.

    python bench/train_step_time.py [--hidden 256 --layers 4 --batch 16 --seq 256 --rounds 15 --bf16]
"""
from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import torch

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from results_file import update_section

ARCHITECTURES = ("gptplus", "angpt", "ngpt")


def make_step(architecture: str, args):
    config = AnGPTConfig(architecture=architecture, vocab_size=args.vocab, hidden_size=args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64 or 1,
                         max_position_embeddings=args.seq, use_cache=False)
    model = AnGPTForCausalLM._from_config(config, attn_implementation="sdpa").train()
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    raw = getattr(model, "_orig_mod", model)

    def step():
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        raw.apply_weight_constraints()

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    steps = {name: make_step(name, args) for name in ARCHITECTURES}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times = {name: [] for name in ARCHITECTURES}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)

    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["gptplus"]
    tokens = args.batch * args.seq
    lines = [
        "## Training step time: GPT+ vs anGPT vs nGPT (SPEC §5: +2.75 % / +9.6 % on 4×A100)", "",
        f"`bench/train_step_time.py{' --bf16' if args.bf16 else ''}{' --compile' if args.compile else ''}` on "
        f"{platform.machine()} with {torch.get_num_threads()} threads, torch {torch.__version__}: d={args.hidden}, "
        f"L={args.layers}, V={args.vocab}, {args.batch}×{args.seq} tokens, "
        f"{'bf16 autocast' if args.bf16 else 'float32'}, sdpa; a step = forward, backward, Adam, weight constraint; "
        f"architectures interleaved over {args.rounds} rounds, medians.", "",
        "| architecture | median step (s) | tokens/s | vs GPT+ |", "|---|---|---|---|"]
    for name in ARCHITECTURES:
        lines.append(f"| {name} | {medians[name]:.4f} | {tokens / medians[name]:,.0f} | {medians[name] / base:.3f}× |")
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        update_section("train_step_time", section)

if __name__ == "__main__":
    main()
