"""The convergence experiment's figure (convergence.py): validation curves at the best rates with seed bands,
the learning-rate sweeps, and the anGPT ablations as differences from the same seed's anGPT run."""
from __future__ import annotations

import pathlib
import statistics

import results_file as rf
from convergence_runs import ABLATIONS


def median_band(axis, curves: list[list], label: str) -> list[list[float]]:
    """Median over seeds as a line, min–max as a band; curves share their evaluation steps (cut to the shortest).
    Returns the values per evaluation, one per seed."""
    length = min(len(c) for c in curves)
    tokens = [t for t, _ in curves[0][:length]]
    values = [[c[i][1] for c in curves] for i in range(length)]
    line, = axis.plot(tokens, [statistics.median(v) for v in values], label=label)
    if len(curves) > 1:
        axis.fill_between(tokens, [min(v) for v in values], [max(v) for v in values], alpha=0.2,
                          color=line.get_color())
    return values


def plot(summary: dict, path: pathlib.Path, *, ablations: bool) -> None:
    """Validation curves at the best rates, the sweeps, and (unless the run has none) the anGPT ablations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = 3 if ablations else 2
    figure, (curves, sweep, *ablation_axes) = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
    finals = []
    for arch, by_seed in summary["seeds"].items():
        runs = [r for r in by_seed.values() if r["curve"] and not r["diverged"]]
        if runs:
            losses = median_band(curves, [r["curve"] for r in runs],
                                 f"{arch} lr {summary['sweep'][arch]['best']:g} ({rf.counted(len(runs), 'seed')})")
            finals += losses[-1] + [statistics.median(losses[len(losses) // 4])]
    if finals:
        curves.set_ylim(min(finals) - 0.1, max(finals) + 0.1)
    curves.set(xlabel="training tokens", ylabel="validation loss", title="best rate, median and seed range")
    for arch, s in summary["sweep"].items():
        points = [(r["lr"], r["final"]) for r in s["runs"] if not r["diverged"]]
        if points:
            sweep.plot(*zip(*points), "o-", label=arch)
    sweep.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss", title="sweep (seed 0)")
    rates = sorted({r["lr"] for s in summary["sweep"].values() for r in s["runs"]})
    if rates:  # the swept rates as plain ticks: log-axis minor labels overlap on a factor-2 grid
        sweep.set_xticks(rates, [f"{lr:g}" for lr in rates], minor=False)
        sweep.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    for ablation in ablation_axes:  # none when the run has no ablations
        plot_ablations(ablation, summary)
    for axis in figure.axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    rf.save_figure(figure, path)


def plot_ablations(axis, summary: dict) -> None:
    """Each ablation's validation loss minus that of anGPT's run of the same seed (summarise's "delta_curve"),
    median and range over its stable seeds: seed-to-seed differences in level cancel, the ablation's effect stays."""
    axis.axhline(0, color="black", linewidth=0.8, label="anGPT (same seed)")
    medians, extremes = [0.0], [0.0]
    for key, by_seed in summary["ablations"].items():
        stable = [r for _, r in sorted(by_seed.items()) if r["curve"] and not r["diverged"]]
        diverged = len(by_seed) - len(stable)
        label = f"{ABLATIONS[key][0]} ({rf.counted(len(stable), 'seed')}" + \
            (f"; diverged in {diverged})" if diverged else ")")
        if stable:  # the first quarter's large early gaps would flatten the rest: limits from the later evaluations
            values = median_band(axis, [r["delta_curve"] for r in stable], label)
            later = values[len(values) // 4:]
            medians += [statistics.median(v) for v in later]
            extremes += [x for v in later for x in v]
    # Limits from the medians, with room for ordinary seed ranges: one seed's brief spike (several nats in a run
    # that recovers) would otherwise squash every ablation's effect (hundredths) onto the zero line.
    low, high = min(medians), max(medians)
    pad = 0.5 * (high - low) + 0.03
    axis.set_ylim(low - pad, high + pad)
    lowest, highest = min(extremes), max(extremes)
    if lowest < low - pad or highest > high + pad:
        axis.text(0.98, 0.98, f"seed ranges clipped: they reach {lowest:+.2f} to {highest:+.2f}",
                  transform=axis.transAxes, fontsize=7, ha="right", va="top")
    axis.set(xlabel="training tokens", ylabel="Δ validation loss vs anGPT",
             title="anGPT ablations, median and seed range")
