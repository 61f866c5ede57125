#!/usr/bin/env python
"""Training step time of GPT+, nGPT and anGPT of one shape, measured side by side (the anGPT paper reports
anGPT +2.75 % and nGPT +9.6 % over GPT+ on 4×A100 with torch.compile).

A step = forward + backward + Adam step + the architecture's weight constraint. The architectures are
interleaved round by round so that drift of the machine affects them alike; medians are reported. `--compile`
compiles each decoder block (the recipes' `torch_compile: true`, regional compilation); `--ablations` adds anGPT
with one part removed at a time (its ν factors set to 1, its LERP replaced by a plain residual add, no weight
constraint), which says what each part costs.

    python bench/train_step_time.py [--device cuda --hidden 1024 --layers 24 --batch 8 --seq 2048 --bf16 --compile]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM  # noqa: E402
from modeling_angpt.architectures_angpt import Architecture, AnGPT  # noqa: E402
from modeling_angpt.layers_angpt import AddResidual  # noqa: E402
from modeling_angpt.training.model_setup import compile_blocks  # noqa: E402
from results_file import help_description, update_section  # noqa: E402

ARCHITECTURES = ("gptplus", "angpt", "ngpt")
# anGPT with one part taken out (a speed ablation: these models are not meant to train well)
ABLATIONS = {
    "angpt without ν factors": dict(patch=("constants", lambda self, config: Architecture.constants(self, config))),
    "angpt without LERP (plain add)": dict(patch=("residual", lambda self, config: AddResidual())),
    "angpt without constraint": dict(constrain=False),
}


def make_step(name: str, args):
    ablation = ABLATIONS.get(name, {})
    architecture = "angpt" if ablation else name
    config = AnGPTConfig(architecture=architecture, vocab_size=args.vocab, hidden_size=args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64 or 1,
                         max_position_embeddings=args.seq, use_cache=False)
    patch = mock.patch.object(AnGPT, *ablation["patch"]) if "patch" in ablation else contextlib.nullcontext()
    with patch:
        model = AnGPTForCausalLM._from_config(config, attn_implementation="sdpa").to(args.device).train()
    if args.compile:
        compile_blocks(model, args.compile_mode)
    fused = {"fused": True} if args.device.startswith("cuda") else {}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, **fused)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    ids = ids.to(args.device)
    device_type = torch.device(args.device).type
    autocast = torch.autocast(device_type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    constrain = ablation.get("constrain", True)

    def step():
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if constrain:
            model.apply_weight_constraints()

    return step


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv=None):
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--compile", action="store_true", help="compile each decoder block (torch_compile: true)")
    parser.add_argument("--compile-mode", default=None)
    parser.add_argument("--ablations", action="store_true", help="also time anGPT without ν / LERP / constraint")
    parser.add_argument("--section", default=None,
                        help="the section of docs/results/benchmarks.md to write (default: by --compile)")
    parser.add_argument("--no-write", action="store_true", help="print only, leave docs/results/benchmarks.md alone")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    names = list(ARCHITECTURES) + (list(ABLATIONS) if args.ablations else [])
    steps = {name: make_step(name, args) for name in names}
    warmup_s = {}
    for name, step in steps.items():
        start = time.perf_counter()
        for _ in range(args.warmup):
            step()
        synchronize(args.device)
        warmup_s[name] = time.perf_counter() - start
    times = {name: [] for name in names}
    for _ in range(args.rounds):
        for name, step in steps.items():
            synchronize(args.device)
            start = time.perf_counter()
            step()
            synchronize(args.device)
            times[name].append(time.perf_counter() - start)

    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["gptplus"]
    tokens = args.batch * args.seq
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else \
        f"{platform.machine()} CPU, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}"
    flags = "".join(f" {f}" for f, on in (("--bf16", args.bf16), ("--compile", args.compile),
                                          ("--ablations", args.ablations)) if on)
    lines = [
        f"## Training step time{', compiled' if args.compile else ''}: GPT+ vs anGPT vs nGPT "
        "(the anGPT paper: +2.75 % / +9.6 % on 4×A100, compiled)", "",
        f"`bench/train_step_time.py{flags} --device {args.device}` on {device}, torch {torch.__version__}: "
        f"d={args.hidden}, L={args.layers}, V={args.vocab}, {args.batch}×{args.seq} tokens, "
        f"{'bf16 autocast' if args.bf16 else 'float32'}, sdpa; a step = forward, backward, Adam, weight constraint"
        f"{'; each decoder block compiled (regional compilation)' if args.compile else ''}; "
        f"interleaved over {args.rounds} rounds, medians; warm-up = the first {args.warmup} steps (compilation "
        "included).", "",
        "| model | median step (s) | tokens/s | vs GPT+ | warm-up (s) |", "|---|---|---|---|---|"]
    for name in names:
        lines.append(f"| {name} | {medians[name]:.4f} | {tokens / medians[name]:,.0f} | "
                     f"{medians[name] / base:.3f}× | {warmup_s[name]:.1f} |")
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        update_section(args.section or ("train_step_time_compiled" if args.compile else "train_step_time"), section)


if __name__ == "__main__":
    main()
