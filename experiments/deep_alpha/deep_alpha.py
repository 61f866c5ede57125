#!/usr/bin/env python
"""The largest α·L at which a deep anGPT starts cleanly in every seed, at the demo recipe's defaults.

anGPT has no exact norm on its residual stream, and the initial LERP weight α times the depth L decides whether the
first Adam steps blow up (docs/architectures.md, "Deep models start with a smaller α"). This script trains the first
`--steps` steps of the demo recipe (configuration/recipes/demo_cpu.yaml, its learning rate, width rule, schedule and
precision unchanged) with a 24-layer anGPT, d = 256, 4 heads, at several α·L (α init = level / layers), seed by seed.
A run is clean when it finishes its steps with every loss finite and none above 1.5x the first one. `--sweep`
(the default) bisects a sorted grid of levels for the largest one at which every seed is clean, assuming that a
level fails when a smaller one does: a level counts as failed at its first failing seed, and its remaining seeds are
not run. `--check-default` instead trains the config a user writes by hand, which sets no alpha_init and so gets
the library's default, and reports every seed.

    python experiments/deep_alpha/deep_alpha.py                  # the sweep: 24 layers, 40 steps, seeds 0-9
    python experiments/deep_alpha/deep_alpha.py --check-default  # the default α init: 30 steps, seeds 0-5

Each finished run is appended to OUTPUT_DIR/records.jsonl, so an interrupted command resumes where it stopped.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import shutil
import sys
import time
import warnings
from concurrent.futures import Future

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "common"), str(HERE.parents[1] / "bench"), str(HERE.parents[1])]

import results_file as rf  # noqa: E402
import study  # noqa: E402

SPIKE = 1.5  # a loss above 1.5x the first one counts as a blow-up even when the run recovers
# below 0.40, where five seeds in six failed; from 0.04, a third of the presets' former 0.12
LEVELS = [0.04, 0.06, 0.08, 0.10, 0.12, 0.16, 0.20, 0.24, 0.28, 0.32, 0.36]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    parser.add_argument("--check-default", action="store_true",
                        help="train the config without alpha_init (the library's default) instead of the sweep")
    parser.add_argument("--levels", type=float, nargs="+", default=LEVELS, help="the α·L grid the sweep bisects")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 40; 30 with --check-default)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per level (default 10; 6 with --check-default)")
    parser.add_argument("--recipe", default=str(study.RECIPES / "demo_cpu.yaml"))
    parser.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                        help="recipe keys changed for every run (the smoke test's small data and vocabulary)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--output-dir", default="runs/deep_alpha")
    parser.add_argument("--report", action="store_true",
                        help="train nothing: write the section from the runs already recorded in OUTPUT_DIR")
    parser.add_argument("--section", default=None, help="the README section to write (default deep_alpha_sweep, "
                                                         "or deep_alpha_default with --check-default)")
    rf.add_output_arguments(parser, plots=False, results=HERE / "README.md")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 30 if args.check_default else 40
    if args.seeds is None:
        args.seeds = 6 if args.check_default else 10
    for name in ("layers", "hidden", "heads", "steps", "seeds", "jobs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if any(not level > 0 for level in args.levels):
        parser.error(f"--levels must be positive numbers, got {' '.join(map(str, args.levels))}")
    args.levels = sorted(set(args.levels))
    return args


def model_config(args) -> dict:
    """The config a user writes by hand: no alpha_init (the sweep adds one per level through model_kwargs)."""
    return {"architecture": "angpt", "num_hidden_layers": args.layers, "hidden_size": args.hidden,
            "num_attention_heads": args.heads}


def model_file(args) -> pathlib.Path:
    path = pathlib.Path(args.output_dir) / "model.json"
    path.write_text(json.dumps(model_config(args)))
    return path


def run_name(spec: dict) -> str:
    # a default run is named by the value the library's default resolves to, so a record made under an earlier default
    # is not taken for one of the current default (records from before this key have the value as alpha_init_used)
    default = spec.get("default_alpha", spec.get("alpha_init_used"))
    alpha = f"default{default:.6g}" if spec["alpha_init"] is None else f"{spec['alpha_init']:.6g}"
    return f"L{spec['layers']}-a{alpha}-steps{spec['steps']}-s{spec['seed']}"


def run_one(spec: dict, cfg: dict) -> dict:
    """The first spec['steps'] steps of the recipe with this α init and seed (in a worker process)."""
    import torch

    from modeling_angpt.training import NonFiniteLossError, train
    from modeling_angpt.training.metrics import read_metrics
    from modeling_angpt.training.recipe import load_recipe

    torch.set_num_threads(cfg["threads"])
    out = pathlib.Path(cfg["output_dir"]) / run_name(spec)
    overrides = [f"model={cfg['model_file']}", f"output_dir={out}", f"seed={spec['seed']}", "eval_steps=0",
                 "logging_steps=1", "report_to=[jsonl]", "disable_tqdm=true", *cfg["override"]]
    if spec["alpha_init"] is not None:
        overrides.append(f"model_kwargs.alpha_init={spec['alpha_init']!r}")
    recipe = load_recipe(cfg["recipe"], overrides)
    if spec["steps"] >= recipe.max_steps:  # else: the first steps of the recipe's schedule, stopped as a kill would
        recipe = load_recipe(cfg["recipe"], overrides + [f"max_steps={spec['steps']}"])
    start = time.perf_counter()
    stopped_at = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the depth warning above the limit, and the CPU's bf16 fallback
        try:
            result = train(recipe, overwrite=True, stop_after_steps=spec["steps"])
            losses, alpha = result.losses, float(result.model.config.alpha_init)
            precision = "bf16" if result.accelerator.mixed_precision == "bf16" else "float32"
        except NonFiniteLossError as error:
            stopped_at, alpha, precision = error.step, None, None
            losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    first = losses[0] if losses else math.nan
    peak = max(range(len(losses)), key=lambda i: losses[i]) if losses else None
    ratio = losses[peak] / first if losses else math.nan
    clean = stopped_at is None and ratio <= SPIKE
    record = {**spec, "alpha_init_used": alpha, "clean": clean, "stopped_at": stopped_at, "max_ratio": ratio,
              "max_ratio_step": None if peak is None else peak + 1, "first_loss": first,
              "final_loss": losses[-1] if losses and stopped_at is None else None, "losses": losses,
              "precision": precision, "matrix_lr": recipe.learning_rate * min(1.0, 128 / cfg["hidden"]),
              "wall_s": round(time.perf_counter() - start, 1)}
    shutil.rmtree(out, ignore_errors=True)  # the record holds every loss; keep the disk free
    return record


class Records:
    """OUTPUT_DIR/records.jsonl: one line per finished run, read back on a rerun so finished runs are skipped."""

    def __init__(self, output_dir: pathlib.Path):
        self.path = output_dir / "records.jsonl"
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        self.done = {run_name(r): r for r in map(json.loads, lines)}

    def add(self, record: dict) -> None:
        self.done[run_name(record)] = record
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class InProcess(contextlib.AbstractContextManager):
    """A pool of one: runs each submitted call here and now (one run at a time needs no worker process)."""

    def __exit__(self, *exc) -> None:
        return None

    def submit(self, function, *args) -> Future:
        future = Future()
        future.set_result(function(*args))
        return future


def run_seeds(specs: list[dict], cfg: dict, records: Records, pool, stop_on_failure: bool) -> list[dict]:
    """Run the specs in order, `cfg['jobs']` at a time; with stop_on_failure no further seed starts once one
    failed (the runs already started finish and are recorded)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    queue = [s for s in specs if run_name(s) not in records.done and not cfg["report"]]
    failed = lambda: any(not records.done[run_name(s)]["clean"]  # noqa: E731
                         for s in specs if run_name(s) in records.done)
    running = set()
    while (queue and not (stop_on_failure and failed())) or running:
        while queue and len(running) < cfg["jobs"] and not (stop_on_failure and failed()):
            running.add(pool.submit(run_one, queue.pop(0), cfg))
        finished, running = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            record = future.result()
            records.add(record)
            print(describe(record), flush=True)
    return [records.done[run_name(s)] for s in specs if run_name(s) in records.done]


def describe(record: dict) -> str:
    what = "clean" if record["clean"] else outcome(record)
    return (f"{run_name(record)}: {what}, max {record['max_ratio']:.2f}x at step {record['max_ratio_step']} "
            f"({record['wall_s']:.0f} s)")


def outcome(record: dict) -> str:
    if record["stopped_at"] is not None:
        return f"seed {record['seed']}: non-finite at step {record['stopped_at']}"
    return f"seed {record['seed']}: {record['max_ratio']:.2f}× at step {record['max_ratio_step']}"


def specs_for(alpha_init, args) -> list[dict]:
    """One spec per seed; alpha_init None means the library's default, recorded with the value it resolves to."""
    extra = {}
    if alpha_init is None:
        from modeling_angpt import AnGPTConfig

        extra["default_alpha"] = AnGPTConfig(**model_config(args)).alpha_init
    return [{"layers": args.layers, "alpha_init": alpha_init, "steps": args.steps, "seed": seed, **extra}
            for seed in range(args.seeds)]


def sweep(args, cfg: dict, records: Records, pool) -> dict[float, list[dict]]:
    """Bisect the sorted levels for the largest one at which every seed is clean; returns the runs per level."""
    tested: dict[float, list[dict]] = {}
    low, high = -1, len(args.levels)  # levels[low] clean in every seed (none yet), levels[high] failed (none yet)
    while high - low > 1:
        middle = (low + high) // 2
        level = args.levels[middle]
        tested[level] = run_seeds(specs_for(level / args.layers, args), cfg, records, pool, stop_on_failure=True)
        if all(r["clean"] for r in tested[level]) and len(tested[level]) == args.seeds:
            low = middle
        elif any(not r["clean"] for r in tested[level]):
            high = middle
        else:  # --report: the records leave this level undecided
            break
    return tested


def with_other_records(args, tested: dict[float, list[dict]], records: Records) -> dict[float, list[dict]]:
    """The bisection's levels plus any other level of the grid the records hold runs of (an earlier bisection's, on
    another grid), so the section shows every run made."""
    for level in args.levels:
        runs = [records.done[run_name(s)] for s in specs_for(level / args.layers, args) if run_name(s) in records.done]
        if level not in tested and runs:
            tested[level] = runs
    return tested


def sweep_section(args, tested: dict[float, list[dict]], command: str) -> str:
    clean_levels = [level for level, runs in tested.items()
                    if len(runs) == args.seeds and all(r["clean"] for r in runs)]
    failed_levels = [level for level, runs in tested.items() if any(not r["clean"] for r in runs)]
    limit = max(clean_levels, default=None)
    lines = [f"## The α·L sweep: {args.layers} layers, d = {args.hidden}, first {args.steps} steps, "
             f"seeds 0–{args.seeds - 1}", "", f"`{command}`", "", setting_line(args, tested), "",
             "| α·L | α init | seeds clean | failed (how) | seeds not run | largest loss / first loss (clean seeds) |",
             "|---|---|---|---|---|---|"]
    for level in sorted(tested):
        runs = tested[level]
        clean = [r for r in runs if r["clean"]]
        worst = max(clean, key=lambda r: r["max_ratio"], default=None)
        lines.append(f"| {level:.2f} | {level / args.layers:.5g} | {len(clean)} of {len(runs)} | "
                     f"{'; '.join(outcome(r) for r in runs if not r['clean']) or '—'} | {args.seeds - len(runs)} | "
                     + (f"{worst['max_ratio']:.2f}× (seed {worst['seed']}, step {worst['max_ratio_step']})"
                        if worst else "—") + " |")
    undecided = [level for level, runs in tested.items() if level not in clean_levels + failed_levels]
    lines += [""] + [f"Undecided: α·L = {level:.2f}, {len(tested[level])} of {args.seeds} seeds run, all clean "
                     "(the others not run yet)." for level in undecided]
    lines += [(f"Largest level with {args.seeds} of {args.seeds} seeds clean: α·L = {limit:.2f}"
                   if limit is not None else "No level had every seed clean" + (" yet" if undecided else ""))
              + (f"; the {'next' if limit is not None else 'lowest'} level tested, "
                 f"{min(l for l in failed_levels if limit is None or l > limit):.2f}, failed."
                 if any(limit is None or l > limit for l in failed_levels) else ".")]
    return "\n".join(lines)


def check_section(args, runs: list[dict], command: str) -> str:
    alphas = {r["alpha_init_used"] for r in runs if r["alpha_init_used"] is not None}
    alpha = f"{alphas.pop():.6g}" if len(alphas) == 1 else "—"
    clean = sum(r["clean"] for r in runs)
    lines = [f"## The default α init: {args.layers} layers, d = {args.hidden}, first {args.steps} steps, "
             f"seeds 0–{args.seeds - 1}", "", f"`{command}`", "", setting_line(args, {None: runs}) + " The model "
             f"config sets no alpha_init: AnGPTConfig(architecture=\"angpt\", num_hidden_layers={args.layers}, "
             f"hidden_size={args.hidden}, num_attention_heads={args.heads}) gets α init {alpha}"
             + (f" (α·L = {float(alpha) * args.layers:.3g})." if alpha != "—" else "."), "",
             "| seed | finished | loss₀ | largest loss / first loss (step) | final loss |", "|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['seed']} | {'yes' if r['stopped_at'] is None else 'non-finite at step ' + str(r['stopped_at'])}"
                     f" | {r['first_loss']:.3f} | {r['max_ratio']:.2f}× ({r['max_ratio_step']}) | "
                     + (f"{r['final_loss']:.3f}" if r["final_loss"] is not None else "—") + " |")
    lines += ["", f"{clean} of {len(runs)} seeds clean (finished with no loss above {SPIKE}× the first)."]
    return "\n".join(lines)


def shown_path(path: str) -> str:
    """A path inside the repository relative to its root (as the README's commands run), any other as it is."""
    resolved = pathlib.Path(path).resolve()
    return os.path.relpath(resolved, study.REPO) if resolved.is_relative_to(study.REPO) else path


def setting_line(args, tested) -> str:
    runs = [r for rs in tested.values() for r in rs]
    precisions = sorted({r["precision"] for r in runs if r["precision"]})
    lr = sorted({r["matrix_lr"] for r in runs})
    return (f"anGPT, {args.layers} layers, d = {args.hidden}, {args.heads} heads, MLP 4d; "
            f"`{shown_path(args.recipe)}` at its "
            f"defaults (block, batch, learning rate, schedule, Adam, clip), the first {args.steps} steps of its "
            f"schedule; matrices' learning rate {', '.join(f'{x:g}' for x in lr)} (the width rule); "
            f"{', '.join(precisions) or 'precision not recorded'}"
            + (" (the recipe's bf16 replaced: this CPU has no native bfloat16)" if precisions == ["float32"] else "")
            + (f"; recipe overrides {' '.join(args.override)}" if args.override else "")
            + f"; {rf.counted(args.jobs, 'run')} in parallel, {rf.counted(args.threads, 'thread')} each. A run is "
            f"clean when every loss is finite and none exceeds {SPIKE}× the first. " + rf.machine_line())


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)  # each run's, and what the machine line reports
    output_dir = pathlib.Path(args.output_dir)
    study.claim_output_dir("deep_alpha.py", output_dir, {
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "recipe": args.recipe,
        "override": args.override})
    cfg = {"model_file": str(model_file(args).resolve()), "recipe": args.recipe, "override": args.override,
           "report": args.report,
           "threads": args.threads, "jobs": args.jobs, "hidden": args.hidden, "output_dir": str(output_dir)}
    records = Records(output_dir)
    command = rf.command_line(pathlib.Path(__file__), [a for a in (sys.argv[1:] if argv is None else argv)
                                                       if a != "--report"])
    from worker_pool import worker_pool

    with worker_pool(args.jobs) if args.jobs > 1 else InProcess() as pool:
        if args.check_default:
            runs = run_seeds(specs_for(None, args), cfg, records, pool, stop_on_failure=False)
            section, default = check_section(args, runs, command), "deep_alpha_default"
        else:
            tested = with_other_records(args, sweep(args, cfg, records, pool), records)
            section, default = sweep_section(args, tested, command), "deep_alpha_sweep"
    print(section)
    if not args.no_write:
        rf.update_section(args.section or default, section, args.results)


if __name__ == "__main__":
    main()
