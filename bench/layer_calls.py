#!/usr/bin/env python
"""What calling the layers costs: the training step of anGPT and nGPT over GPT+'s, with the projections called as
modules (`layers_angpt.project`, the current code) and with their weights read as before (`linear(x, module.weight,
scale)`, the code before the change), eager and compiled (docs/architectures.md, "Where the constants are applied").

On a plain nn.Linear both do the same arithmetic; what differs is the check `project` makes on every call. Each form
runs in its own process (a module-level function cannot differ between models of one process once compiled); the
processes alternate, `--repeats` pairs of each, and each reports the medians of `bench/train_step_time.py`'s
interleaved steps. The figures go into docs/results/benchmarks.md, section `layer_calls`.

    python bench/layer_calls.py [--repeats 3 --rounds 10 --hidden 256 --layers 4 --batch 8 --seq 256]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout
sys.path.insert(0, HERE)

from results_file import help_description, update_section  # noqa: E402

FORMS = ("weights read (before)", "layers called (now)")
ARCHITECTURES = ("gptplus", "angpt", "ngpt")


def child(form: str, compiled: bool, args) -> dict[str, float]:
    """Median step time per architecture in this process, the projections applied the `form` way."""
    import torch

    import modeling_angpt.modeling_angpt as modeling
    from modeling_angpt.layers_angpt import linear
    from train_step_time import make_step

    if form == FORMS[0]:  # the code before the change: the weight read, the scale on it, the module never called
        modeling.project = lambda module, x, row_scale=None: linear(x, module.weight, row_scale)
    torch.manual_seed(0)
    step_args = argparse.Namespace(device="cpu", vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                                   batch=args.batch, seq=args.seq, bf16=False, compile=compiled, compile_mode=None)
    steps = {name: make_step(name, step_args) for name in ARCHITECTURES}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times = {name: [] for name in ARCHITECTURES}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--repeats", type=int, default=3, help="processes of each form and mode, alternating")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--child", nargs=2, metavar=("FORM", "COMPILED"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print only, leave docs/results/benchmarks.md alone")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(FORMS[int(args.child[0])], args.child[1] == "1", args)))
        return
    passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-write"]
    ratios = {}  # (form, compiled) -> {"angpt": [...], "ngpt": [...]}
    for _ in range(args.repeats):
        for compiled in (False, True):
            for index, form in enumerate(FORMS):
                out = subprocess.run([sys.executable, __file__, *passed, "--child", str(index), str(int(compiled))],
                                     capture_output=True, text=True, check=True).stdout
                medians = json.loads(out.strip().splitlines()[-1])
                for name in ("angpt", "ngpt"):
                    ratios.setdefault((form, compiled), {}).setdefault(name, []).append(
                        medians[name] / medians["gptplus"])
    machine = f"{platform.machine()} CPU, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    lines = ["## Calling the layers: training step over GPT+'s, weights read vs layers called", "",
             f"`bench/layer_calls.py {' '.join(passed)}` on {machine}, float32, sdpa: d={args.hidden}, "
             f"L={args.layers}, V={args.vocab}, {args.batch}×{args.seq} tokens; a step = forward, backward, Adam, weight "
             f"constraint; each cell the median over {args.repeats} alternating processes of each process's median "
             f"over {args.rounds} interleaved steps (range in brackets).", "",
             "| projections | mode | anGPT / GPT+ | nGPT / GPT+ |", "|---|---|---|---|"]
    for compiled in (False, True):
        for form in FORMS:
            cells = [f"{statistics.median(r):.3f}× [{min(r):.3f}–{max(r):.3f}]"
                     for r in (ratios[(form, compiled)]["angpt"], ratios[(form, compiled)]["ngpt"])]
            lines.append(f"| {form} | {'compiled blocks' if compiled else 'eager'} | {cells[0]} | {cells[1]} |")
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        update_section("layer_calls", section)


if __name__ == "__main__":
    main()
