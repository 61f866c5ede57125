#!/usr/bin/env python
"""Semantic focus (Ram et al.): full vs top-k (k=5) vs window (5) vs block (5) attention on Even Pairs,
Parity and ListOps (and, on request, Missing Duplicates) with the paper's protocol (`angpt semantic-focus`:
bidirectional classifier, mean pooling, SGD + StepLR, batch 25, clip 0.5), several seeds. Reports the first
epoch with ≥ 95 % training accuracy (the paper's convergence criterion) and the held-out accuracy beside the
split's trivial baselines (majority class, one position; evaluation/semantic_focus/baselines.py), writes its
section of experiments/semantic_focus/README.md and plots/semantic_focus*.png there. The paper: top-k converges
faster than full attention; window and block do not.

Profiles (sizes per task are in PROFILES below):
    python experiments/semantic_focus/semantic_focus.py            # default: 3 seeds, about two hours on 2 CPU cores
    python experiments/semantic_focus/semantic_focus.py --quick    # 1 seed, smaller sets and budgets: minutes
    python experiments/semantic_focus/semantic_focus.py --paper --device cuda   # the paper's sizes and budgets (GPU)
    python experiments/semantic_focus/semantic_focus.py --backbone paper        # the paper's own encoder
`--backbone paper` (paper_encoder.py) writes its own sections, `semantic_focus[_<profile>]_paper_encoder`;
`--section NAME` writes another, so that a run of one task (say Parity at its 1000-epoch budget) sits beside the
section of the others instead of replacing it.
On CPU the default cannot afford the paper's budgets (Parity 1000 epochs, ListOps 200 epochs of 5000
sequences of 501–599 tokens): it caps the epochs and runs a shorter ListOps (documented in the section).
Finished runs are reused from --output-dir (summary.json); a stopped run continues from the state saved after
its last epoch (resume.pt), and so does a finished run given a larger --epochs. `--first-seed K` starts the seeds
at K, so a later seed can run alone into the directory a run of more seeds would use. `--time-limit MINUTES` ends
every run after its last epoch that fits (say, in a lease of GPU time); the section names the epochs run, and the
same command continues the runs from their saved state. `--tasks missing_duplicates` runs the paper's Missing
Duplicates (budget 250 epochs), which the default task list leaves out to keep the default within its two hours.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
# the experiments' and bench's helpers, and this checkout's modeling_angpt rather than an installed copy
sys.path[:0] = [str(HERE.parent / "common"), str(HERE.parents[1] / "bench"), str(HERE.parents[1])]

from results_file import (add_output_arguments, command_line, counted, cpu_name, gpu_name,  # noqa: E402
                          help_description, plot_link, save_figure, update_section)
from worker_pool import worker_pool  # noqa: E402

VARIANTS = {
    "full": {"attention_sparsity": "none"},
    "topk": {"attention_sparsity": "topk", "attention_topk": 5},
    "window": {"attention_sparsity": "window", "attention_window": 5},
    "block": {"attention_sparsity": "block", "attention_block_size": 5},
}
VARIANT_NAMES = {"full": "full", "topk": "top-k", "window": "window", "block": "block"}
DEFAULT_TASKS = ("even_pairs", "parity", "listops")  # the three tasks of the reproduction
TASKS = DEFAULT_TASKS + ("missing_duplicates",)
BACKBONE_TEXT = {
    "library": "backbone `library`: bidirectional GPT+ `AnGPTForSequenceClassification` without QK-norm, mean "
               "pooling over real tokens, 5 blocks (ListOps 10), d 64, MLP 64 (SwiGLU), 1 head, RMSNorm, no biases, "
               "N(0, 0.02) init, attention dropout 0.01, RoPE",
    "paper": "backbone `paper`: the paper's own encoder (`modeling_angpt/evaluation/semantic_focus/paper_encoder.py`): token embedding "
             "U(±0.1)·√d plus fixed sinusoidal absolute positions, 5 pre-LN blocks (ListOps 10) with non-affine "
             "LayerNorm, 1-head attention with biases through the library's eager sparse attention, ReLU MLP 64 "
             "with biases, dropout 0.01 on embeddings, attention probabilities, MLP and residuals, no final LN, "
             "mean pooling over all positions (PAD included), classifier U(±0.1), PyTorch default init elsewhere",
}
# per task: n_train, n_heldout, epochs (None: the paper's budget, the task registry's `epochs`), task kwargs
# (ListOps lengths)
PROFILES = {
    "paper": {"seeds": 3, "even_pairs": (5000, 2000, None, {}), "parity": (5000, 2000, None, {}),
              "listops": (5000, 2000, None, {"min_length": 501, "max_length": 599}),
              "missing_duplicates": (5000, 2000, None, {})},
    "default": {"seeds": 3, "even_pairs": (5000, 2000, 15, {}), "parity": (5000, 2000, 15, {}),
                "listops": (1000, 400, 8, {"min_length": 101, "max_length": 199}),
                "missing_duplicates": (5000, 2000, 15, {})},
    "quick": {"seeds": 1, "even_pairs": (2000, 500, 6, {}), "parity": (2000, 500, 6, {}),
              "listops": (300, 100, 4, {"min_length": 51, "max_length": 99}),
              "missing_duplicates": (2000, 500, 6, {})},
    "smoke": {"seeds": 1, "even_pairs": (40, 20, 1, {}), "parity": (40, 20, 1, {}),
              "listops": (20, 10, 1, {"min_length": 21, "max_length": 40}),
              "missing_duplicates": (40, 20, 1, {})},
}


def one_run(job: dict) -> dict:
    """One (task, variant, seed) in a worker process: reuses a finished run's summary, continues a stopped run
    from its resume.pt, and a finished one given a larger --epochs too."""
    import torch

    from modeling_angpt.evaluation.semantic_focus import ProtocolSettings, run_protocol

    out = pathlib.Path(job["output_dir"])
    if (out / "summary.json").exists() and (out / "metrics.jsonl").exists():
        summary = json.loads((out / "summary.json").read_text())
        if summary.get("backbone", "library") != job["backbone"]:
            raise ValueError(f"{out} holds a {summary.get('backbone', 'library')}-backbone run, not {job['backbone']}")
        # a run cut by --time-limit is not finished: it continues from its resume.pt
        stopped_early = summary["epochs_run"] < summary["epochs_budget"]
        if not summary.get("stopped_at_deadline") and (stopped_early or summary["epochs_budget"] >= job["epochs"]):
            summary["history"] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            if "baselines" not in summary:  # a run from before summaries carried them: the same split's baselines
                summary["baselines"] = job_baselines(job)
            return {**job, **summary, "reused": True}
        if not (out / "resume.pt").exists():
            raise ValueError(f"{out} holds a finished {summary['epochs_budget']}-epoch run without resume.pt, which "
                             f"cannot be extended to --epochs {job['epochs']}; choose another --output-dir")
    # epochs trained by earlier calls: none without a saved state (run_protocol, holding the directory's lock,
    # starts again a run killed before it saved one)
    earlier = len((out / "metrics.jsonl").read_text().splitlines()) if (out / "resume.pt").exists() else 0
    torch.set_num_threads(job["threads"])
    settings = ProtocolSettings(task=job["task"], output_dir=out, model=VARIANTS[job["variant"]],
                                backbone=job["backbone"], task_kwargs=job["task_kwargs"], seed=job["seed"],
                                epochs=job["epochs"], n_train=job["n_train"], n_heldout=job["n_heldout"],
                                device=job["device"], stop_at_train_acc=job["stop_at"], deadline=job["deadline"],
                                resume=True, tensorboard=False, save_model=False, plot_every=0)
    summary = run_protocol(settings, log=lambda line: print(line, flush=True) if job["verbose"] else None)
    return {**job, **summary, "reused": False, "epochs_earlier": earlier}


def job_baselines(job: dict) -> dict:
    """The held-out trivial baselines of a job's split (what run_protocol writes into summary.json)."""
    from modeling_angpt.evaluation.semantic_focus import build_splits
    from modeling_angpt.evaluation.semantic_focus.baselines import split_baselines

    return split_baselines(build_splits(job["task"], seed=job["seed"], n_train=job["n_train"],
                                        n_heldout=job["n_heldout"], **job["task_kwargs"]))


def _median(values):
    return statistics.median(values) if values else None


def summarise(runs: list[dict], tasks, variants) -> dict:
    table = {}
    for task in tasks:
        for variant in variants:
            rows = [r for r in runs if r["task"] == task and r["variant"] == variant]
            reached = [r["epochs_to_95"] for r in rows if r["epochs_to_95"] is not None]
            unreached_run = [r["epochs_run"] for r in rows if r["epochs_to_95"] is None]
            table[task, variant] = {
                "seeds": len(rows), "reached": len(reached), "epochs_to_95": [r["epochs_to_95"] for r in rows],
                # a seed that never reached 95 % counts as "epochs run + 1" for the median (a lower bound)
                "median_epochs": _median([r["epochs_to_95"] or r["epochs_run"] + 1 for r in rows]),
                "unreached_within": min(unreached_run, default=None),
                "heldout_final": _median([r["final"]["heldout_acc"] for r in rows]),
                "heldout_best": _median([r["best_heldout_acc"] for r in rows]),
                "train_final": _median([r["final"]["train_acc"] for r in rows]),
                "train_losses": [[epoch["train_loss"] for epoch in r["history"]] for r in rows]}
    return table


def loss_at_common_epoch(table, task) -> str:
    """Median training loss of each variant at the last epoch all the task's runs reached: the paper's ListOps
    comparison (training CE), for when no run reaches 95 % accuracy."""
    cells = {v: c for (t, v), c in table.items() if t == task}
    common = min(len(losses) for c in cells.values() for losses in c["train_losses"])
    return (f"training loss at epoch {common} (median over seeds): "
            + ", ".join(f"{VARIANT_NAMES[v]} {_median([losses[common - 1] for losses in c['train_losses']]):.3f}"
                        for v, c in cells.items()))


def verdict(table, task, budget) -> str:
    full, topk = table[task, "full"], table[task, "topk"]
    fixed = [table[task, v] for v in ("window", "block") if (task, v) in table]
    if not full["reached"] and not topk["reached"]:
        within = min(full["unreached_within"], topk["unreached_within"])
        return (f"neither full nor top-k reached 95 % within {within} epochs: no verdict"
                + ("" if within == budget else f" (budget {budget}, cut by --time-limit)")
                + f"; {loss_at_common_epoch(table, task)}")
    faster = topk["median_epochs"] < full["median_epochs"]
    text = (f"top-k {'faster than' if faster else 'not faster than'} full (median epochs to 95 %: "
            f"{_fmt_epochs(topk)} vs {_fmt_epochs(full)})")
    if fixed:
        text += "; window/block " + ("reached 95 % in some seeds" if any(f["reached"] for f in fixed)
                                     else "never reached 95 %")
    return text


def _run_time(runs) -> str:
    """Runs reused or continued from an earlier invocation took (part of) their time there, not in this wall clock:
    name them and the time all their epochs took."""
    reused = sum(r["reused"] for r in runs)
    continued = [r["epochs_earlier"] for r in runs if not r["reused"] and r.get("epochs_earlier")]
    if not reused and not continued:
        return ""
    earlier = [f"{reused} of the runs reused from earlier invocations"] if reused else []
    if continued:
        epochs = str(continued[-1])
        if len(continued) > 1:
            epochs = f"{', '.join(map(str, continued[:-1]))} and {epochs}"
        earlier.append(f"{len(continued)} continued from an earlier invocation after {epochs} epochs")
    seconds = [epoch["seconds"] for r in runs for epoch in r["history"]]
    every = {1: "its epochs", 2: "the epochs of both"}.get(len(runs), f"the epochs of all {len(runs)}")
    return (f" ({'; '.join(earlier)}; {every} took "
            f"{sum(seconds) / 60:.0f} min of run time, median {statistics.median(seconds):.1f} s per epoch)")


def _fmt_epochs(cell) -> str:
    if not cell["reached"]:
        return f">{cell['unreached_within']}"
    return f"{cell['median_epochs']:g}" + ("" if cell["reached"] == cell["seeds"] else f" ({cell['reached']}/{cell['seeds']} seeds)")


def plot(runs, tasks, variants, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    keys = ("train_acc", "heldout_acc", "train_loss")
    figure, axes = plt.subplots(len(keys), len(tasks), figsize=(max(4 * len(tasks), 5), 9), squeeze=False)
    for column, task in enumerate(tasks):
        for variant in variants:
            chosen = [r for r in runs if r["task"] == task and r["variant"] == variant]
            if not chosen:
                continue
            for row, key in enumerate(keys):
                # runs that stopped because they had converged keep their last value; runs cut by --time-limit end
                curves = [[epoch[key] for epoch in r["history"]] for r in chosen]
                longest = max(len(c) for c in curves)
                columns = [[c[e] if e < len(c) else c[-1] for c, r in zip(curves, chosen)
                            if e < len(c) or not r.get("stopped_at_deadline")] for e in range(longest)]
                epochs = list(range(1, len(columns) + 1))
                # a dot per epoch reads over tens of epochs, and is a smear over hundreds
                line, = axes[row][column].plot(epochs, [statistics.median(v) for v in columns], label=variant,
                                               marker="." if longest <= 100 else None)
                axes[row][column].fill_between(epochs, [min(v) for v in columns], [max(v) for v in columns],
                                               color=line.get_color(), alpha=0.15)
        for row, name in enumerate(("train accuracy", "held-out accuracy", "train loss")):
            axes[row][column].set(title=f"{task}" if row == 0 else None, xlabel="epoch", ylabel=name)
            if row < 2:
                axes[row][column].set_ylim(0, 1.02)
                axes[row][column].axhline(0.95, color="grey", lw=0.6, ls="--")
            else:
                axes[row][column].set_yscale("log")
            axes[row][column].xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))  # 4-digit epochs fit
    axes[0][0].legend(fontsize=8)
    save_figure(figure, path)


def machine(device: str = "cpu") -> str:
    import torch

    gpu = gpu_name(device)
    return (f"{gpu + ' with ' if gpu else ''}{cpu_name()}, {os.cpu_count()} cores, {platform.system()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    profile = parser.add_mutually_exclusive_group()
    profile.add_argument("--quick", action="store_true", help="1 seed, small sets, a few epochs (minutes)")
    profile.add_argument("--paper", action="store_true", help="the paper's sizes and epoch budgets (for a GPU)")
    profile.add_argument("--smoke", action="store_true", help="seconds: for the test suite")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backbone", default="library", choices=("library", "paper"),
                        help="library: AnGPTForSequenceClassification (GPT+); paper: the paper's encoder")
    parser.add_argument("--seeds", type=int, default=None, help="override the profile's number of seeds")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the runs' seeds are FIRST … FIRST+SEEDS-1 (default 0): --seeds 1 --first-seed 2 runs seed 2 "
                             "alone, into the directory a run of --seeds 3 uses")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                        help=f"comma-separated, of {','.join(TASKS)} (default: the first three)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--epochs", type=int, default=None, help="override every task's epoch budget")
    parser.add_argument("--stop-at", type=float, default=0.99,
                        help="end a run once training accuracy reaches this (0.95 criterion unaffected); 0: never")
    parser.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                        help="end every run after its last epoch that fits in this many minutes from the start (the "
                             "section names the epochs run; the same command continues the runs)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--output-dir", default=None, help="default runs/semantic_focus-<profile>")
    parser.add_argument("--section", default=None,
                        help="section and plot name, default semantic_focus[_<profile>][_paper_encoder]; "
                             "name another (semantic_focus_...) to keep a run of some tasks beside a section "
                             "already written for others")
    add_output_arguments(parser, results=HERE / "README.md", plots_dir=HERE / "plots")
    parser.add_argument("--verbose", action="store_true", help="print every epoch of every run")
    args = parser.parse_args(argv)

    name = "quick" if args.quick else "paper" if args.paper else "smoke" if args.smoke else "default"
    tasks, variants = args.tasks.split(","), args.variants.split(",")
    for given, known, flag, hint in ((tasks, TASKS, "--tasks", " (other tasks: angpt semantic-focus --task NAME)"),
                                     (variants, VARIANTS, "--variants", "")):
        unknown = [x for x in given if x not in known]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)}; expected a comma-separated subset of "
                         f"{','.join(known)}{hint}")
    if args.section is not None and not re.fullmatch(r"semantic_focus_\w+", args.section):
        parser.error(f"--section: expected a name like semantic_focus_parity (letters, digits, _), got {args.section!r}")
    seeds = args.seeds or PROFILES[name]["seeds"]
    if seeds < 1 or args.first_seed < 0:
        parser.error(f"--seeds {seeds} --first-seed {args.first_seed}: expected at least one seed, the first ≥ 0")
    if args.time_limit is not None and args.time_limit <= 0:
        parser.error(f"--time-limit {args.time_limit:g}: expected a positive number of minutes")
    from modeling_angpt.evaluation.semantic_focus import get_task  # imports the model library: after the checks

    paper_epochs = {task: get_task(task).epochs for task in TASKS}
    settings = {}  # per task: n_train, n_heldout, epochs, task kwargs
    for task in TASKS:
        n_train, n_heldout, epochs, task_kwargs = PROFILES[name][task]
        settings[task] = n_train, n_heldout, epochs or paper_epochs[task], task_kwargs
    seed_ids = range(args.first_seed, args.first_seed + seeds)
    suffix = "_paper_encoder" if args.backbone == "paper" else ""  # own sections, plots and runs per backbone
    output_dir = pathlib.Path(args.output_dir or f"runs/semantic_focus-{name}{suffix.replace('_', '-')}")
    started = time.time()
    deadline = None if args.time_limit is None else started + 60 * args.time_limit
    jobs = []
    for task in tasks:
        n_train, n_heldout, epochs, task_kwargs = settings[task]
        for seed in seed_ids:
            for variant in variants:
                jobs.append(dict(task=task, variant=variant, seed=seed, n_train=n_train, n_heldout=n_heldout,
                                 epochs=args.epochs or epochs, task_kwargs=task_kwargs, device=args.device,
                                 stop_at=args.stop_at or None, threads=args.threads, verbose=args.verbose,
                                 backbone=args.backbone, deadline=deadline,
                                 output_dir=str(output_dir / task / variant / f"seed{seed}")))
    try:
        if args.jobs > 1:
            with worker_pool(args.jobs) as pool:
                runs = list(pool.map(one_run, jobs))
        else:
            runs = [one_run(job) for job in jobs]
    except (ValueError, FileExistsError) as error:  # a run directory that cannot be reused or continued
        raise SystemExit(f"semantic_focus.py: error: {error}") from None
    wall = time.time() - started
    (output_dir / "runs.json").write_text(json.dumps(runs, indent=1))
    table = summarise(runs, tasks, variants)

    command = command_line(__file__, argv)
    backbone = BACKBONE_TEXT[args.backbone]
    compared = " vs ".join(VARIANT_NAMES[v] for v in variants) + " attention"
    if args.section:  # a section beside the profile's own: say which tasks it holds
        compared += " on " + ", ".join(tasks)
    seed_cell = seeds  # a count when the seeds start at 0
    if args.first_seed:  # which seeds otherwise (a bare "2" for seed 2 alone reads as two seeds), in the table and in
        # the heading, whose anchor then differs from that of the first seeds' section
        seed_cell = f"seed{'s' if seeds > 1 else ''} {', '.join(map(str, seed_ids))}"
        compared += f", {seed_cell}"
    lines = [f"## Semantic focus: {compared} ({name} profile, {args.backbone} backbone)", "",
             f"`{command}` on {machine(args.device)}; {len(runs)} runs, {args.jobs} in parallel with "
             f"{counted(args.threads, 'thread')} each, {wall / 60:.1f} min wall clock{_run_time(runs)}.", "",
             f"Protocol (`angpt semantic-focus --backbone {args.backbone}`, Ram et al.): {backbone}; SGD batch 25, "
             "clip 0.5, lr 0.1 with StepLR 0.9995 per epoch (ListOps lr 1.0, 0.99); k = window = block = 5. "
             + (f"Runs end once training accuracy reaches {args.stop_at:g}." if args.stop_at else ""), "",
             "| task | train / held-out sequences | length | epoch budget (paper) | seeds | held-out baselines: majority "
             "class / one position |", "|---|---|---|---|---|---|"]
    for task in tasks:
        n_train, n_heldout, epochs, kw = settings[task]
        length = f"{kw['min_length']}–{kw['max_length']}" if kw else "40"
        baselines = [r["baselines"] for r in runs if r["task"] == task]
        majority = _median([b["majority_class"]["heldout_acc"] for b in baselines])
        one = _median([b["one_position"]["heldout_acc"] for b in baselines])
        lines.append(f"| {task} | {n_train} / {n_heldout} | {length} | {args.epochs or epochs} ({paper_epochs[task]}) | "
                     f"{seed_cell} | {majority:.3f} / {one:.3f} |")
    lines += ["", "Epochs to ≥ 95 % training accuracy (median over seeds, a seed that never reached it counted as its epochs run + 1; – = not reached) and "
              "held-out accuracy (median over seeds: at the last epoch run / best epoch).", "",
              "| task | variant | epochs to 95 % | per seed | held-out acc (last / best) | train acc (last) |",
              "|---|---|---|---|---|---|"]
    for task in tasks:
        for variant in variants:
            cell = table[task, variant]
            per_seed = ", ".join("–" if e is None else str(e) for e in cell["epochs_to_95"])
            lines.append(f"| {task} | {variant} | {_fmt_epochs(cell)} | {per_seed} | "
                         f"{cell['heldout_final']:.3f} / {cell['heldout_best']:.3f} | {cell['train_final']:.3f} |")
    cut = [r for r in runs if r.get("stopped_at_deadline")]
    if cut:
        lines += ["", f"Stopped by `--time-limit {args.time_limit:g}` before their budget (the same command continues "
                  "them): " + "; ".join(f"{r['task']} {r['variant']} seed {r['seed']} after {r['epochs_run']} epochs"
                                       for r in cut) + "."]
    if "full" in variants and "topk" in variants:
        lines += ["", "Against the paper's claim (top-k learns faster than full; fixed patterns do not):", ""]
        lines += [f"- {task}: {verdict(table, task, args.epochs or settings[task][2])}" for task in tasks]
    section_name = args.section or f"semantic_focus{'' if name == 'default' else '_' + name}{suffix}"
    png = (output_dir if args.no_write else pathlib.Path(args.plots_dir)) / f"{section_name}.png"
    lines += ["", f"![median accuracy and training loss per epoch with min–max band over seeds]({plot_link(args.results, png)})"]
    section = "\n".join(line for line in lines if line is not None)
    print(section)
    plot(runs, tasks, variants, png)
    if not args.no_write:
        update_section(section_name, section, args.results)
    return {"runs": runs, "table": table, "section": section}


if __name__ == "__main__":
    main()
