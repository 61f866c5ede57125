#!/usr/bin/env python
"""Convergence of anGPT and nGPT against GPT+ (the anGPT paper: 1.40× / 1.29× fewer tokens to the same loss at 0.5B).

GPT+, nGPT and anGPT of one shape train on the Debian corpus (experiments/common/build_corpus.sh, ~20 M tokens: no
run sees a block twice), each with its paper recipe (docs/architectures.md: GPT+ AdamW, weight decay 0.1, 20 %
warm-up; nGPT and anGPT Adam with neither; cosine to 0.01 × peak; clip 1.0) at every learning rate of a sweep. The sweep
starts as a factor-2 grid around a centre and grows by a factor 2 past whichever edge is best, up to
--max-extend times per architecture; a best rate still on an edge after that is reported as such. Then
--seeds seeds run at each best rate, and the anGPT ablations at anGPT's best rate: α init 0.01 (vs 0.05),
no ν(α) on the LERP residual, and a 5 % warm-up, among others; each at seeds 0 to --ablation-seeds − 1, compared
with anGPT's run of the same seed.

speed-up (per seed) = tokens GPT+ needs to reach its final validation loss / tokens the other needs to reach
that loss (linear interpolation between evaluations); reported as the median and range over seeds.

Every finished run is cached as OUTPUT_DIR/<run>/result.json: a rerun of the same command resumes, and
--report-only writes the section from whatever has finished (a partial sweep is marked as partial).

    python experiments/convergence/convergence.py                # d=256, 4 layers, 500 steps (~1 h on 2 CPU cores)
    python experiments/convergence/convergence.py --size quick   # d=64, minutes
    python experiments/convergence/convergence.py --size device  # d=512, 8 layers, 3000 steps on a GPU
    python experiments/convergence/convergence.py --steps 1000 --output-dir runs/convergence-1000 \
        --section convergence_1000 --title ', 1000 steps'     # a second setting: its own folder, section and plot

An output folder belongs to one setting (shape, length, data, recipe): a command with other settings is refused
rather than resumed from another experiment's runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
from concurrent.futures import FIRST_COMPLETED, wait

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "common"), str(HERE.parents[1] / "bench")]  # the experiments' and bench's helpers

import results_file as rf  # noqa: E402
import study  # noqa: E402
from convergence_plot import plot  # noqa: E402
from convergence_runs import ABLATIONS, SETTINGS, load_results, prepare_data, run_name, run_one  # noqa: E402
from worker_pool import worker_pool  # noqa: E402

# the first token count at which the validation loss reaches a target, linear between evaluations (angpt compare's)
from modeling_angpt.training.compare import tokens_to_reach  # noqa: E402

ARCHS = ("gptplus", "ngpt", "angpt")
# Per size: model shape, run length, and the centre of each architecture's initial learning-rate grid.
SIZES = {
    "default": dict(hidden=256, layers=4, heads=4, vocab=8192, block=128, batch=16, steps=500, eval_steps=25,
                    eval_batches=4, centre={"gptplus": 4e-3, "ngpt": 8e-3, "angpt": 8e-3}),
    "quick": dict(hidden=64, layers=2, heads=2, vocab=8192, block=64, batch=8, steps=60, eval_steps=10,
                  eval_batches=2, centre={"gptplus": 4e-3, "ngpt": 8e-3, "angpt": 8e-3}),
    "device": dict(hidden=512, layers=8, heads=8, vocab=16384, block=512, batch=32, steps=3000, eval_steps=100,
                   eval_batches=16, centre={"gptplus": 2e-3, "ngpt": 4e-3, "angpt": 4e-3}),
}


# --- what to run next, from what has finished ----------------------------------------------------------------
def sweep_state(results: list[dict], arch: str, cfg: dict) -> tuple[list[float], float | None, bool]:
    """(rates to run now, best rate if the sweep is settled, best-at-edge flag) for one architecture."""
    centre, n = cfg["centre"][arch], cfg["grid_points"]
    grid = [centre * 2.0 ** (k - (n - 1) // 2) for k in range(n)]
    done = {r["lr"]: r["final"] for r in results if r["arch"] == arch and r["seed"] == 0 and not r.get("ablation")}
    extensions = 0
    while True:
        missing = [lr for lr in grid if not any(math.isclose(lr, x) for x in done)]
        if missing:
            return missing, None, False
        finals = [next(done[x] for x in done if math.isclose(x, lr)) for lr in grid]
        best = grid[min(range(len(grid)), key=finals.__getitem__)]
        at_low, at_high = best == grid[0] or all(math.isinf(f) for f in finals), best == grid[-1]
        if not (at_low or at_high):
            return [], best, False
        if extensions >= cfg["max_extend"]:
            return [], best, True
        grid = [grid[0] / 2] + grid if at_low else grid + [grid[-1] * 2]
        extensions += 1


def needed_runs(results: list[dict], cfg: dict) -> list[dict]:
    """Sweeps first, then seeds, then ablations, each seed-major: a command cut short leaves the most important part
    done, and whole seeds (every architecture's run of a seed, which the seed-paired speed-up needs)."""
    needed = []
    for arch in cfg["archs"]:
        missing, best, _ = sweep_state(results, arch, cfg)
        needed += [{"arch": arch, "lr": lr, "seed": 0} for lr in missing]
        if best is None:
            continue
        needed += [{"arch": arch, "lr": best, "seed": s} for s in range(1, cfg["seeds"])]
        if arch == "angpt" and cfg["ablations"]:  # seed-major: a command cut short leaves seed 0 of every ablation
            needed += [{"arch": arch, "lr": best, "seed": s, "ablation": name}
                       for s in range(cfg["ablation_seeds"]) for name in ABLATIONS]
    return sorted(needed, key=lambda s: ((s["seed"] > 0 or "ablation" in s) + ("ablation" in s), s["seed"]))


def execute(cfg: dict, report, plan=needed_runs) -> list[dict]:
    """Run what `plan(results, cfg)` says is needed until nothing is, `jobs` at a time; `report(results)` after
    every finished run."""
    output_dir = pathlib.Path(cfg["output_dir"])
    results = load_results(output_dir)
    submitted: set[str] = {run_name(r) for r in results}
    if cfg["jobs"] == 1:
        while todo := [s for s in plan(results, cfg) if run_name(s) not in submitted]:
            submitted.add(run_name(todo[0]))
            results.append(run_one(todo[0], cfg))
            report(results)
        return results
    with worker_pool(cfg["jobs"]) as pool:
        running = {}
        while True:
            for spec in plan(results, cfg):
                if run_name(spec) not in submitted and len(running) < cfg["jobs"]:
                    submitted.add(run_name(spec))
                    running[pool.submit(run_one, spec, cfg)] = spec
            if not running:
                return results
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                running.pop(future)
                results.append(future.result())
            report(results)


# --- report ---------------------------------------------------------------------------------------------------
def spread(values: list[float], fmt: str, unit: str = "", *, mark_one: bool = True) -> str:
    """Median (min–max) over seeds; a single value is marked "(1 seed)" unless `mark_one` is false."""
    if not values:
        return "—"
    f = lambda x: format(x, fmt) + unit  # noqa: E731
    if len(values) == 1:
        return f(values[0]) + " (1 seed)" * mark_one
    between = " to " if fmt.startswith("+") else "–"  # signed figures: "-0.057 to -0.042", not "-0.057–-0.042"
    return f"{f(statistics.median(values))} ({f(min(values))}{between}{f(max(values))})"


def summarise(results: list[dict], cfg: dict) -> dict:
    """Best rates, per-seed speed-ups against GPT+ (seed-paired), ablations, and what is still missing."""
    finished = {run_name(r) for r in results}
    out = {"sweep": {}, "seeds": {}, "speedup": {}, "ablations": {},
           "missing": [s for s in needed_runs(results, cfg) if run_name(s) not in finished]}
    for arch in cfg["archs"]:
        _, best, edge = sweep_state(results, arch, cfg)
        out["sweep"][arch] = {"runs": sorted((r for r in results if r["arch"] == arch and r["seed"] == 0
                                              and not r.get("ablation")), key=lambda r: r["lr"]),
                              "best": best, "edge": edge}
        if best is not None:
            out["seeds"][arch] = {r["seed"]: r for r in results if r["arch"] == arch and not r.get("ablation")
                                  and math.isclose(r["lr"], best)}
    base = out["seeds"].get("gptplus", {})
    for arch, by_seed in out["seeds"].items():
        ratios, reached = [], []
        for seed, run in sorted(by_seed.items()):
            if seed not in base or math.isinf(base[seed]["final"]):
                continue
            target = base[seed]["final"]
            mine, theirs = tokens_to_reach(run["curve"], target), tokens_to_reach(base[seed]["curve"], target)
            reached.append(mine)
            if mine and theirs:
                ratios.append(theirs / mine)
        out["speedup"][arch] = {"ratios": ratios, "not_reached": sum(m is None for m in reached)}
    baselines = out["seeds"].get("angpt", {})
    for r in results:  # an ablation counts once anGPT's run of its seed (its baseline) has finished
        if r.get("ablation") and (own := baselines.get(r["seed"])):
            out["ablations"].setdefault(r["ablation"], {})[r["seed"]] = {
                **r, "tokens_to_baseline": tokens_to_reach(r["curve"], own["final"]),
                "delta": r["final"] - own["final"],
                "delta_curve": [(t, loss - b) for (t, loss), (_, b) in zip(r["curve"], own["curve"])]}
    return out


def precision_text(runs: list[dict]) -> str:
    """What the runs trained in (training replaces the recipe's bf16 by float32 on a CPU without native bfloat16;
    runs recorded before the field existed were bf16 autocast)."""
    used = sorted({r.get("precision", "bf16 autocast") for r in runs if not r["diverged"]})
    return " and ".join(used) or "every run diverged"


def section(summary: dict, cfg: dict, command: str) -> str:
    runs = [r for s in summary["sweep"].values() for r in s["runs"]]
    tokens = cfg["steps"] * cfg["batch"] * cfg["block"]
    available = next((r["train_tokens_available"] for r in runs if r.get("train_tokens_available")), None)
    partial = summary["missing"]
    dataset = os.path.relpath(cfg["dataset"]) if os.path.isabs(cfg["dataset"]) else cfg["dataset"]
    lines = [f"## Convergence{cfg['title']}: tokens to GPT+'s final validation loss "
             "(the anGPT paper: anGPT 1.40×, nGPT 1.29× at 0.5B)", "",
             f"`{command}`", "", study.corpus_line(cfg["dataset"]), "",
             f"{cfg['machine']} Model (all three): d={cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads, "
             f"MLP 4d, vocab {cfg['vocab']} (byte-level BPE on the corpus), context {cfg['block']}; "
             f"{cfg['steps']} steps × {cfg['batch']}×{cfg['block']} = {tokens:,} training tokens per run"
             + (f" of the {available:,}-token training split of `{dataset}` ({tokens / available:.1%}: "
                "no block is seen twice)" if available else f" from `{dataset}`")
             + f"; {precision_text(runs)}; validation every {cfg['eval_steps']} steps on the same "
             f"{cfg['eval_batches'] * 2 * cfg['batch'] * cfg['block']:,} held-out tokens for every run. "
             f"{rf.counted(cfg['jobs'], 'run')} in parallel, {rf.counted(cfg['threads'], 'thread')} each.", ""]
    if cfg.get("changed"):
        lines += [f"Settings that differ from `--size {cfg.get('size', 'default')}`: "
                  + ", ".join(f"{k} {v} (default {d})" for k, (v, d) in cfg["changed"].items()) + ".", ""]
    if partial:
        lines += [f"**Partial**: {rf.counted(len(partial), 'planned run')} had not finished when this was written "
                  f"({', '.join(run_name(s) for s in partial[:8])}{', …' if len(partial) > 8 else ''})"
                  + (", and the seeds and ablations that follow an unsettled sweep are not counted"
                     if any(s["best"] is None for s in summary["sweep"].values()) else "")
                  + "; the tables show what had.", ""]
    lines += ["Learning-rate sweep (seed 0, final validation loss; ∞ = diverged):", "",
              "| architecture | sweep | best lr | best inside the sweep? |", "|---|---|---|---|"]
    for arch, s in summary["sweep"].items():
        cells = ", ".join(f"{r['lr']:g}: {r['final']:.3f}" if not r["diverged"] else f"{r['lr']:g}: ∞" for r in s["runs"])
        inside = "—" if s["best"] is None else ("**no: best at the edge after extending**" if s["edge"] else "yes")
        lines.append(f"| {arch} | {cells or '—'} | {'—' if s['best'] is None else format(s['best'], 'g')}"
                     f"{' (sweep unfinished)' if s['best'] is None and s['runs'] else ''} | {inside} |")
    lines += ["", f"At the best rate, {rf.counted(cfg['seeds'], 'seed')} (median, range over seeds); speed-up per "
              "seed = tokens GPT+ (same seed) needs to reach its final loss / tokens the architecture needs to reach "
              "it:", "",
              "| architecture | best lr | seeds done | final val loss | speed-up vs GPT+ |", "|---|---|---|---|---|"]
    for arch, by_seed in summary["seeds"].items():
        finals = [r["final"] for r in by_seed.values()]
        sp = summary["speedup"].get(arch, {"ratios": [], "not_reached": 0})
        speed = spread(sp["ratios"], ".2f", "×")
        if sp["not_reached"]:
            speed += f"; GPT+'s loss not reached in {sp['not_reached']} seed(s)"
        lines.append(f"| {arch} | {summary['sweep'][arch]['best']:g} | {len(by_seed)}/{cfg['seeds']} | "
                     f"{spread(finals, '.3f')} | {speed} |")
    if summary["ablations"] or cfg["ablations"]:
        lines += ["", *ablation_table(summary, cfg["ablation_seeds"])]
    lines += ["", f"![validation loss against tokens, seed band = min–max over seeds]({cfg['plot_link']})"]
    return "\n".join(lines)


def ablation_table(summary: dict, seeds: int) -> list[str]:
    """The anGPT ablations against anGPT's run of the same seed: one seed's figures, or median (range) over seeds."""
    baselines = summary["seeds"].get("angpt", {})
    base = [baselines[s]["final"] for s in range(seeds) if s in baselines]
    many = seeds > 1  # a "seeds done" column, and "(1 seed)" while the other seeds are still running

    def cell(values: list[float], fmt: str) -> str:
        return spread(values, fmt, mark_one=many)
    lines = [f"anGPT ablations at anGPT's best rate, {f'seeds 0–{seeds - 1}' if many else 'seed 0'} "
             "(baseline: the recipe's defaults, α init 0.05, ν(α) on, no warm-up, s_z speed 256, width rule"
             + (f", final loss {cell(base, '.3f')}" if base else "") + "; Δ and tokens against the baseline's run "
             "of the same seed):", "",
             "| ablation | " + "seeds done | " * many + "final val loss | Δ vs baseline | "
             "tokens to the baseline's final loss |", "|---|---|---|---|" + "---|" * many]
    for key, (name, _) in ABLATIONS.items():
        by_seed = summary["ablations"].get(key, {})
        if not by_seed:
            lines.append(f"| {name} | not run yet | | |" + " |" * many)
            continue
        runs = [by_seed[s] for s in sorted(by_seed)]
        stable = [r for r in runs if not r["diverged"]]
        final = cell([r["final"] for r in stable], ".3f") if stable else "diverged"
        if stable and len(stable) < len(runs):
            final += f"; diverged in {rf.counted(len(runs) - len(stable), 'seed')}"
        delta = cell([r["delta"] for r in stable], "+.3f")
        reached = [r["tokens_to_baseline"] for r in stable if r["tokens_to_baseline"]]
        reach = cell(reached, ",.0f") if reached else "not reached"
        if reached and len(reached) < len(stable):  # a diverged seed is counted once, in the loss column
            reach += f"; not reached in {rf.counted(len(stable) - len(reached), 'seed')}"
        done = f"{len(runs)}/{seeds} | " * many
        lines.append(f"| {name} | {done}{final} | {delta} | {reach} |")
    return lines


def parse_config(argv) -> dict:
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    study.add_size_arguments(parser, SIZES)
    for name in ("hidden", "layers", "heads", "vocab", "block", "batch", "steps", "eval_steps", "eval_batches"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help="override the size's value")
    parser.add_argument("--recipe", default=str(study.RECIPES / "bench_debian_cpu.yaml"))
    parser.add_argument("--dataset", default=str(study.CORPUS), help="built by experiments/common/build_corpus.sh")
    parser.add_argument("--archs", nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--grid-points", type=int, default=3, help="initial learning rates per architecture")
    parser.add_argument("--max-extend", type=int, default=2, help="extra rates past an edge, per architecture")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-ablations", dest="ablations", action="store_false")
    parser.add_argument("--ablation-seeds", type=int, default=1, help="seeds per anGPT ablation (0 to N−1)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--threads", type=int, help="torch threads per run (default: cores / jobs)")
    parser.add_argument("--output-dir", default="runs/convergence")
    parser.add_argument("--report-only", action="store_true", help="write the section from finished runs only")
    parser.add_argument("--section", default="convergence",
                        help="the section to write, and its plot's file name")
    parser.add_argument("--title", default="", help="added to the section's heading (a second section of this script)")
    rf.add_output_arguments(parser, results=HERE / "README.md", plots_dir=HERE / "plots")
    args = parser.parse_args(argv)
    cfg = study.sized_config(SIZES, args)
    defaults = {**SIZES[cfg["size"]],
                **{k: parser.get_default(k) for k in ("grid_points", "max_extend", "seeds", "ablation_seeds")}}
    cfg["changed"] = {k: [cfg[k], v] for k, v in defaults.items() if cfg[k] != v}
    cfg["threads"] = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    cfg["archs"] = [a for a in ARCHS if a in args.archs]
    if not 1 <= cfg["ablation_seeds"] <= cfg["seeds"]:
        parser.error(f"--ablation-seeds must be between 1 and --seeds ({cfg['seeds']}): each ablation is compared "
                     "with anGPT's run of the same seed")
    if "gptplus" not in cfg["archs"]:
        parser.error("--archs must include gptplus: speed-ups are measured against it")
    return cfg


OUTPUT_KEYS = ("results", "plots_dir", "no_write", "report_only", "output_dir")


def main(argv=None):
    cfg = parse_config(argv)
    output_dir = pathlib.Path(cfg["output_dir"])  # claim_output_dir creates it; --report-only only reads it
    # The run's own command and settings: --report-only reports them, whatever else it is given.
    saved, command_file = output_dir / "config.json", output_dir / "command.txt"
    if not cfg["report_only"]:
        study.claim_output_dir("convergence.py", output_dir, {k: cfg[k] for k in ("layers", *SETTINGS)})
        command_file.write_text(rf.command_line(__file__, argv))
        saved.write_text(json.dumps({k: v for k, v in cfg.items() if k not in OUTPUT_KEYS}))
    elif saved.is_file():
        cfg.update({k: v for k, v in json.loads(saved.read_text()).items() if k not in OUTPUT_KEYS})
    command = command_file.read_text() if command_file.exists() else rf.command_line(__file__, argv)
    png = pathlib.Path(cfg["plots_dir"]) / f"{cfg['section']}.png"
    cfg["plot_link"] = rf.plot_link(cfg["results"], png)

    import torch

    torch.set_num_threads(cfg["threads"])  # the machine line names the runs' thread count, not this process's

    def report(results: list[dict]) -> str:
        summary = summarise(results, cfg)
        cfg["machine"] = rf.machine_line()
        text = section(summary, cfg, command)
        if not cfg["no_write"]:
            plot(summary, png, ablations=cfg["ablations"])
            rf.update_section(cfg["section"], text, cfg["results"])
        return text

    if not cfg["report_only"]:
        prepare_data(cfg)
    results = load_results(output_dir) if cfg["report_only"] else execute(cfg, report)
    print(report(results))


if __name__ == "__main__":
    main()
