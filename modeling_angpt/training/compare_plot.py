"""The figure of `angpt compare`: training and validation loss against tokens seen, the target loss with where each
run reaches it, and, when any run logged them, a small panel of the norms its architecture's constants assume
(docs/architectures.md, "Watching the norms during training"). compare.py computes what it shows; `compare_runs`
writes the figure and the table."""
from __future__ import annotations

from pathlib import Path

from .compare import Comparison, compare, layer_mean, layer_values


def _plot_norms(ax, comparison, colors) -> None:
    """anGPT: ‖h‖ entering the blocks (mean over layers of each layer's mean, solid; largest per-token max, dotted)
    and the branch outputs ‖x_A‖ (dashed), ‖x_M‖ (dash-dot); nGPT: 1 + the largest |‖h‖ − 1|. Healthy: ‖h‖ near the
    line at 1 (the branch outputs grow as the weights align with the data)."""
    for run, color in zip(comparison.runs, colors):
        if not run.norms:
            continue
        tokens = [t for t, _ in run.norms]
        if layer_values(run.norms[0][1], "h", "mean"):
            ax.plot(tokens, [layer_mean(n, "h") for _, n in run.norms], "-", color=color, lw=1.2,
                    label=f"{run.architecture}: ‖h‖ mean")
            ax.plot(tokens, [max(layer_values(n, "h", "max")) for _, n in run.norms], ":", color=color, lw=1,
                    label=f"{run.architecture}: ‖h‖ max")
            for quantity, style, name in (("attn", "--", "x_A"), ("mlp", "-.", "x_M")):
                ax.plot(tokens, [layer_mean(n, quantity) for _, n in run.norms], style, color=color, lw=1,
                        label=f"{run.architecture}: ‖{name}‖ mean")
        else:
            ax.plot(tokens, [1 + max(layer_values(n, "h_dist", "max")) for _, n in run.norms], "--", color=color,
                    lw=1, label=f"{run.architecture}: 1 + max |‖h‖−1|")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("norm / derived norm")
    ax.set_title("norms the ν constants assume, at each evaluation (healthy: ‖h‖ ≈ 1)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")


def plot_comparison(comparison, output: Path, log_tokens: bool = False) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_norms = any(run.norms for run in comparison.runs)
    fig, axes = plt.subplots(2 if with_norms else 1, 1, figsize=(8, 7.5 if with_norms else 5), squeeze=False,
                             sharex=True, gridspec_kw={"height_ratios": [3, 1.3] if with_norms else [1]})
    ax = axes[0][0]
    colors = [f"C{i}" for i in range(len(comparison.runs))]
    for run, row, color in zip(comparison.runs, comparison.rows, colors):
        if run.train:
            ax.plot(*zip(*run.train), "-", color=color, lw=0.8, alpha=0.45)
        ax.plot(*zip(*run.val), "o-", color=color, lw=1.6, ms=3.5, label=f"{run.label}: validation (train: thin)")
        if row["tokens"] is not None:
            ax.plot([row["tokens"]], [comparison.target], "x", color=color, ms=9, mew=2)
    ax.axhline(comparison.target, color="grey", ls="--", lw=0.8, label=f"target {comparison.target:.4f}")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("loss against tokens seen (×: where each run reaches the target)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if with_norms:
        _plot_norms(axes[1][0], comparison, colors)
    bottom = axes[-1][0]
    bottom.set_xlabel("tokens seen")
    if log_tokens:
        bottom.set_xscale("log")  # shared: both panels; the untrained evaluation at 0 tokens is off a log axis
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return Path(output)


def compare_runs(run_dirs: list, target_loss: float | None = None, output: Path = Path("compare.png"),
                 log_tokens: bool = False) -> Comparison:
    """The comparison, its figure at `output` and its table as Markdown beside it (same name, .md)."""
    comparison = compare(run_dirs, target_loss)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    plot_comparison(comparison, output, log_tokens)
    output.with_suffix(".md").write_text(comparison.markdown())
    return comparison
