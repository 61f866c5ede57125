#!/usr/bin/env python
"""Convergence of anGPT and nGPT against GPT+ at small scale (SPEC §5: 1.40× / 1.29× fewer tokens at 0.5B).

Each architecture trains with its own recipe defaults (SPEC §1: GPT+ AdamW, weight decay, 20 % warm-up; nGPT and
anGPT Adam with neither) at each learning rate of a small sweep, so every architecture is compared at its best
rate (DESIGN.md: anGPT tolerates about twice GPT+'s). The speed-up is the number of tokens GPT+ (best rate)
needs to reach its final validation loss, divided by the tokens the other architecture needs to reach it
(linear interpolation between evaluations). Writes bench/convergence.png and a RESULTS.md section.

    python bench/convergence.py [--steps 400] [--recipe configuration/recipes/demo_cpu.yaml]
"""
from __future__ import annotations

import argparse
import json
import pathlib

from results_file import update_section

from modeling_angpt.training import load_recipe, train

SWEEP = {"gptplus": (2e-3, 4e-3), "angpt": (4e-3, 8e-3), "ngpt": (4e-3, 8e-3)}
HERE = pathlib.Path(__file__).parent


def run(architecture: str, lr: float, args) -> dict:
    out = pathlib.Path(args.output_dir) / f"{architecture}-lr{lr:g}"
    recipe = load_recipe(args.recipe, [f"architecture={architecture}", f"learning_rate={lr}",
                                       f"max_steps={args.steps}", f"eval_steps={args.eval_steps}",
                                       f"output_dir={out}", "save_steps=100000", "disable_tqdm=true",
                                       "report_to=[jsonl]"])
    result = train(recipe)
    tokens_per_step = recipe.per_device_train_batch_size * recipe.gradient_accumulation_steps * recipe.block_size
    curve = [(step * tokens_per_step, loss) for step, loss in result.val_losses]
    return {"architecture": architecture, "lr": lr, "curve": curve, "final": curve[-1][1]}


def tokens_to_reach(curve, target: float) -> float | None:
    """First token count at which the validation loss reaches `target` (linear between evaluations)."""
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return t1 if l0 == l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(HERE.parent / "configuration/recipes/demo_cpu.yaml"))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-steps", type=int, default=25)
    parser.add_argument("--output-dir", default="runs/convergence")
    parser.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    args = parser.parse_args(argv)

    runs = [run(arch, lr, args) for arch, lrs in SWEEP.items() for lr in lrs]
    (pathlib.Path(args.output_dir) / "runs.json").write_text(json.dumps(runs, indent=1))
    best = {arch: min((r for r in runs if r["architecture"] == arch), key=lambda r: r["final"]) for arch in SWEEP}
    target = best["gptplus"]["final"]
    base_tokens = tokens_to_reach(best["gptplus"]["curve"], target)

    lines = ["## Convergence: tokens to GPT+'s final validation loss (SPEC §5: anGPT 1.40×, nGPT 1.29× at 0.5B)", "",
             f"`bench/convergence.py --steps {args.steps}`: the demo recipe's model (d=128, 4 layers, 4 heads, "
             f"Shakespeare; `{pathlib.Path(args.recipe).name}`), {args.steps} steps, bf16 autocast on "
             f"the 2-core CPU, validation every {args.eval_steps} steps; each architecture at its best learning "
             f"rate of the sweep {json.dumps({k: list(v) for k, v in SWEEP.items()})}. One seed: a small-scale "
             "check of direction, not a reproduction of the paper's figure.", "",
             "| architecture | best lr | final val loss (lr sweep) | tokens to GPT+'s final loss | speed-up vs GPT+ |",
             "|---|---|---|---|---|"]
    for arch in SWEEP:
        reached = tokens_to_reach(best[arch]["curve"], target)
        sweep = ", ".join(f"{r['lr']:g}: {r['final']:.3f}" for r in runs if r["architecture"] == arch)
        speed = f"{base_tokens / reached:.2f}×" if reached else "not reached"
        lines.append(f"| {arch} | {best[arch]['lr']:g} | {best[arch]['final']:.3f} ({sweep}) | "
                     f"{f'{reached:,.0f}' if reached else '—'} | {speed} |")
    edge = [arch for arch in SWEEP if best[arch]["lr"] == max(SWEEP[arch])]
    if edge:
        lines += ["", f"Caveat: the best rate of {', '.join(edge)} is the largest of its sweep, so a wider sweep "
                      "could move these ratios."]
    lines += ["", "![validation loss against tokens](convergence.png)"]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        plot(best, HERE / "convergence.png")
        update_section("convergence", section)


def plot(best: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for arch, r in best.items():
        tokens, losses = zip(*r["curve"])
        axis.plot(tokens, losses, label=f"{arch} (lr {r['lr']:g})")
    axis.set(xlabel="training tokens", ylabel="validation loss", ylim=(None, min(8.5, max(losses) + 0.5)))
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
