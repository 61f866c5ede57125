#!/usr/bin/env python
"""anGPT with and without ν(α) on its LERP residuals, at 12 and 24 layers, side by side (the anGPT paper: without
it, training is unstable).

The convergence experiment's ablation found no instability without ν(α) at 4 layers. Without the factor, each of the
2L residual updates (1 − α)h + αx of unit, independent h and x has norm √((1 − α)² + α²) instead of 1
(docs/architectures.md, the `angpt` section), so the stream shrinks by about that factor per update, and the effect
grows with depth at a fixed α init. This script trains anGPT at the convergence experiment's shape, data and recipe
(its default size, or with --device its GPU size; docs/architectures.md: Adam, no warm-up, cosine to 0.01 × peak,
clip 1.0, the project's width rule and s_z speed) at each LAYERS:ALPHA pair, with and without ν(α), side by side, and reports the final validation
loss, whether it diverged, the largest rise of the validation loss above its running minimum, the largest gradient
norm, and the residual stream's norm after each layer of the trained model on held-out text.

    python experiments/residual_nu_depth/residual_nu_depth.py   # 12 and 24 layers (~1 h on 2 CPU cores)
    python experiments/residual_nu_depth/residual_nu_depth.py --pairs 12:0.05 12:0.0333 24:0.0167 24:0.01 \
        --seeds 3 --steps 40 --eval-steps 20 --output-dir runs/residual_nu_depth_start \
        --section residual_nu_depth_start --title ", first 40 steps"   # the start of training, three seeds
    python experiments/residual_nu_depth/residual_nu_depth.py --pairs 24:0.0167 --lr 0.004 --first-seed 2
        # one long pair, seed 2 alone
    python experiments/residual_nu_depth/residual_nu_depth.py --device --hidden 1024 --heads 16 \
        --pairs 24:0.05 24:0.01 --output-dir runs/residual_nu_depth-device   # a GPU: the convergence GPU size, wider

Finished runs are cached as OUTPUT_DIR/<run>/result.json: a rerun of the same command resumes.
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
# the convergence experiment's runs, the experiments' helpers and bench's
sys.path[:0] = [str(HERE.parent / "convergence"), str(HERE.parent / "common"), str(HERE.parents[1] / "bench")]

import convergence  # noqa: E402
import convergence_runs  # noqa: E402
import results_file as rf  # noqa: E402
import study  # noqa: E402

BEST_4_LAYER_LR = 8e-3  # anGPT's best peak rate in the convergence experiment's sweep (experiments/convergence)


def default_lr(size: str) -> float:
    """The measured 4-layer best, scaled for a size as the convergence experiment scales the centre of its anGPT
    sweep (the device size was not swept: a larger model and batch start from half the rate)."""
    centre = lambda name: convergence.SIZES[name]["centre"]["angpt"]  # noqa: E731
    return BEST_4_LAYER_LR * centre(size) / centre("default")


def stream_norms(model, recipe, info: dict) -> dict:
    """The mean ‖h‖ over held-out tokens entering the first layer and leaving each layer (1 is the premise of
    every ν factor), measured on the first 2 × batch validation blocks."""
    import numpy as np
    import torch

    from modeling_angpt.data.blocks import split_blocks

    _, val = split_blocks(np.load(info["blocks_cache"]), recipe.validation_fraction, recipe.data_seed)
    ids = torch.as_tensor(val[: 2 * recipe.per_device_train_batch_size].astype("int64"))
    norms: list[float] = []
    mean_norm = lambda h: norms.append(float(h.detach().float().norm(dim=-1).mean()))  # noqa: E731
    layers = model.model.layers
    hooks = [layers[0].register_forward_pre_hook(
        lambda module, args, kwargs: mean_norm(args[0] if args else kwargs["hidden_states"]), with_kwargs=True)]
    hooks += [layer.register_forward_hook(lambda module, args, output: mean_norm(output)) for layer in layers]
    model.eval()
    with torch.no_grad():
        model(input_ids=ids.to(model.device))
    for hook in hooks:
        hook.remove()
    return {"stream_norms": norms}


def seed_range(cfg: dict) -> range:
    return range(cfg["first_seed"], cfg["first_seed"] + cfg["seeds"])


def setting(run: dict) -> tuple[int, float, bool]:
    """What a run's seeds share: depth, α init, and whether ν(α) is off."""
    return run["layers"], run["alpha"], bool(run.get("ablation"))


def planned(pairs: list[tuple[int, float]], lr: float, seeds: range) -> list[dict]:
    """Per pair, ν(α) on then off, seed by seed: deepest first, where the paper's claim has the most room to show."""
    return [{"arch": "angpt", "layers": layers, "alpha": alpha, "lr": lr, "seed": seed,
             **({"ablation": "no_nu"} if off else {})}
            for layers, alpha in sorted(pairs, key=lambda p: -p[0]) for seed in seeds for off in (False, True)]


def largest_gradient(cfg: dict, run: dict) -> float | None:
    """The largest gradient norm (before clipping) in the run's metrics.jsonl; None if it stopped before its first
    log."""
    from modeling_angpt.training.metrics import read_metrics

    rows = read_metrics(pathlib.Path(cfg["output_dir"]) / convergence_runs.run_name(run) / "metrics.jsonl")
    return max((r["grad_norm"] for r in rows if "grad_norm" in r), default=None)


def largest_rise(curve: list) -> float | None:
    """The largest increase of the validation loss above its running minimum: the held-out tokens are the same at
    every evaluation, so unlike the training loss of a mixed corpus, a rise is the model's, not the batch's."""
    rise, low = 0.0, math.inf
    for _, loss in curve:
        rise, low = max(rise, loss - low), min(low, loss)
    return rise if len(curve) > 1 else None


def row(runs: list[dict], on_finals: list[float], cfg: dict) -> str:
    """The cells after ν(α) for the seeds of one (layers, α, ν) setting; medians over the seeds that finished."""
    finished = [r for r in runs if not r["diverged"]]
    finals = [r["final"] for r in finished]
    largest = lambda values: max((x for x in values if x is not None), default=None)  # noqa: E731
    rise, grad = largest(largest_rise(r["curve"]) for r in runs), largest(largest_gradient(cfg, r) for r in runs)
    norms = [r["stream_norms"] for r in finished if r.get("stream_norms")]
    diverged = [r for r in runs if r["diverged"]]
    cells = [f"{len(diverged)}/{len(runs)}" + (f" (step {', '.join(str(r.get('diverged_at')) for r in diverged)})"
                                               if diverged else ""),
             convergence.spread(finals, ".3f", mark_one=False),
             f"{statistics.median(finals) - statistics.median(on_finals):+.3f}" if finals and on_finals else "",
             *(f"{x:.2f}" if x is not None else "—" for x in (rise, grad)),
             *(f"{statistics.median(values):.2f}" if norms else "—"
               for values in ([n[-1] for n in norms], [min(n) for n in norms]))]
    return " | ".join(cells) + " |"


def section(results: list[dict], cfg: dict, command: str) -> str:
    by_name = {convergence_runs.run_name(r): r for r in results}
    tokens = cfg["steps"] * cfg["batch"] * cfg["block"]
    seed_numbers = seed_range(cfg)
    seeds = (f"seed {seed_numbers[0]}" if len(seed_numbers) == 1
             else f"seeds {seed_numbers[0]}–{seed_numbers[-1]}")
    lines = [f"## Residual ν(α) at depth{cfg['title']}: anGPT with and without it (the anGPT paper: without it, "
             "training is unstable)", "", f"`{command}`", "", study.corpus_line(cfg["dataset"]), "",
             f"{cfg['machine']} anGPT d={cfg['hidden']}, {cfg['heads']} heads, MLP 4d, vocab {cfg['vocab']}, context "
             f"{cfg['block']}; the anGPT recipe at peak lr {cfg['lr']:g} ("
             + ("" if cfg["lr"] == BEST_4_LAYER_LR else f"{cfg['lr'] / BEST_4_LAYER_LR:g} × ")
             + f"anGPT's best rate in the convergence benchmark's 4-layer sweep), {cfg['steps']} steps × "
             f"{cfg['batch']}×{cfg['block']} = {tokens:,} training tokens per run, {seeds}, "
             f"{convergence.precision_text(results)}; {rf.counted(cfg['jobs'], 'run')} in parallel, "
             f"{rf.counted(cfg['threads'], 'thread')} each. diverged = seeds whose loss or gradient became non-finite "
             "(and the step); the losses and norms are medians over the seeds that finished (range when several); "
             f"rise = largest increase of the validation loss (every {cfg['eval_steps']} steps, the same held-out "
             "tokens each time) above its running minimum and grad = largest gradient norm before clipping (logged "
             "every 10 steps), both over every seed; ‖h‖ = mean norm of the residual stream on held-out text after "
             "training (1 at initialisation), leaving the last layer and its smallest value over the layers.", "",
             "| layers | α init | α·L | ν(α) | diverged | final val loss | Δ off − on | rise | grad | ‖h‖ last layer | "
             "min ‖h‖ |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    settings: dict[tuple, list] = {}
    for spec in planned(cfg["pairs"], cfg["lr"], seed_numbers):
        runs = settings.setdefault(setting(spec), [])  # every planned setting gets a row, finished or not
        if (name := convergence_runs.run_name(spec)) in by_name:
            runs.append(by_name[name])
    for (layers, alpha, off), runs in settings.items():
        default = " (default)" if math.isclose(alpha, library_alpha_init(layers)) else ""
        head = f"| {layers} | {alpha:g}{default} | {layers * alpha:.2f} | {'off' if off else 'on'} | "
        on_finals = [r["final"] for r in settings[layers, alpha, False] if not r["diverged"]] if off else []
        lines.append(head + (row(runs, on_finals, cfg) if runs else "not run yet | | | | | | |"))
    lines += ["", f"![validation loss and the stream's norm per layer, ν(α) on and off]({cfg['plot_link']})"]
    return "\n".join(lines)


def plot(results: list[dict], cfg: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curves, norms) = plt.subplots(1, 2, figsize=(12, 4.2))
    colours = {}
    runs: dict[tuple, list] = {}
    for r in results:
        runs.setdefault(setting(r), []).append(r)
    labelled = {curves: set(), norms: set()}

    def label(axis, run: dict) -> str | None:
        """One legend entry per setting and panel, on whichever seed draws there first (a diverged run draws no
        norms)."""
        if (key := setting(run)) in labelled[axis]:
            return None
        labelled[axis].add(key)
        layers, alpha, off = key
        diverged = sum(r["diverged"] for r in runs[key])
        return (f"{layers} layers, α {alpha:g}, ν(α) {'off' if off else 'on'}"
                + (f" ({diverged}/{len(runs[key])} diverged)" if diverged else ""))

    for r in sorted(results, key=lambda r: (-r["layers"], *setting(r)[1:], r["seed"])):
        key = (r["layers"], r["alpha"])  # ν(α) on and off share a colour
        style = dict(linestyle="--" if r.get("ablation") else "-", color=colours.get(key))
        if r["curve"]:
            line, = curves.plot(*zip(*r["curve"]), label=label(curves, r), **style)
            colours.setdefault(key, line.get_color())
            style["color"] = colours[key]
        if r.get("stream_norms"):
            norms.plot(range(len(r["stream_norms"])), r["stream_norms"], marker=".", label=label(norms, r), **style)
    finals = [r["final"] for r in results if not r["diverged"]]
    if finals:
        curves.set_ylim(min(finals) - 0.1, max(finals) + 1.0)
    curves.set(xlabel="training tokens", ylabel="validation loss", title="validation loss")
    norms.set(xlabel="layer (0 = embedding)", ylabel="mean ‖h‖ on held-out text", yscale="log",
              title="residual stream norm after training")
    for axis in (curves, norms):
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    rf.save_figure(figure, path)


def library_alpha_init(layers: int) -> float:
    """The α init a config that sets none gets at this depth (the papers' 0.05, or 0.10 / layers when deeper:
    docs/architectures.md, "Deep models start with a smaller α")."""
    from modeling_angpt import AnGPTConfig

    return AnGPTConfig(architecture="angpt", num_hidden_layers=layers).alpha_init


def pair(text: str) -> tuple[int, float]:
    """LAYERS:ALPHA, where ALPHA `default` is the library's own α init at that depth."""
    try:
        layers, alpha = text.split(":")
        return int(layers), library_alpha_init(int(layers)) if alpha == "default" else float(alpha)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYERS:ALPHA such as 24:0.05 or 24:default, got {text!r}") from None


def parse_config(argv) -> dict:
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    parser.add_argument("--pairs", nargs="+", type=pair, default=[(12, 0.05), (12, 0.0333), (24, 0.05)],
                        metavar="LAYERS:ALPHA", help="depth and α init of each pair of runs, ALPHA `default` for the "
                        "library's α init at that depth (default: 12:0.05 "
                        "12:0.0333 24:0.05: the paper's α init, and α·L = 0.4, the largest training does not warn about)")
    study.add_size_arguments(parser, ("default", "device"))  # the convergence experiment's sizes, but its quick one
    parser.add_argument("--lr", type=float, help="peak learning rate (default: anGPT's best at 4 layers, 8e-3, "
                        "halved at the device size as the convergence experiment halves its sweep's centre)")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds of every run")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the first of those seeds (a long setting can then be run one seed at a time)")
    parser.add_argument("--section", default="residual_nu_depth", help="the section to write, and its plot's file name")
    parser.add_argument("--title", default="", help="added to the section's heading (a second section of this script)")
    for name in ("hidden", "heads", "vocab", "block", "batch", "steps", "eval_steps", "eval_batches"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help="override the convergence default")
    parser.add_argument("--recipe", default=str(study.RECIPES / "bench_debian_cpu.yaml"))
    parser.add_argument("--dataset", default=str(study.CORPUS), help="built by experiments/common/build_corpus.sh")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--threads", type=int, help="torch threads per run (default: cores / jobs)")
    parser.add_argument("--output-dir", default="runs/residual_nu_depth")
    rf.add_output_arguments(parser, results=HERE / "README.md", plots_dir=HERE / "plots")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.first_seed < 0:
        parser.error(f"--seeds must be at least 1 and --first-seed at least 0, got {args.seeds} and {args.first_seed}")
    cfg = study.sized_config(convergence.SIZES, args)
    cfg.setdefault("lr", default_lr(cfg["size"]))  # --lr when given
    cfg["threads"] = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    return cfg


def main(argv=None):
    cfg = parse_config(argv)
    study.claim_output_dir("residual_nu_depth.py", cfg["output_dir"], {k: cfg[k] for k in convergence_runs.SETTINGS})
    command = rf.command_line(__file__, argv)
    png = pathlib.Path(cfg["plots_dir"]) / f"{cfg['section']}.png"
    cfg["plot_link"] = rf.plot_link(cfg["results"], png)
    cfg["probe"] = stream_norms

    import torch

    torch.set_num_threads(cfg["threads"])  # the machine line names the runs' thread count

    specs = planned(cfg["pairs"], cfg["lr"], seed_range(cfg))
    wanted = {convergence_runs.run_name(s) for s in specs}

    def report(results: list[dict]) -> str:
        # the folder may hold other pairs' runs
        results = [r for r in results if convergence_runs.run_name(r) in wanted]
        cfg["machine"] = rf.machine_line()
        text = section(results, cfg, command)
        if not cfg["no_write"]:
            plot(results, cfg, png)
            rf.update_section(cfg["section"], text, cfg["results"])
        return text

    convergence_runs.prepare_data(cfg)
    # execute skips every run already finished in the folder, so the plan is simply all of this command's runs
    print(report(convergence.execute(cfg, report, lambda results, cfg: specs)))


if __name__ == "__main__":
    main()
