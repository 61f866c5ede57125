#!/usr/bin/env python
"""Length generalisation (scale-invariant paper, Table 1): identical small models trained at length L
with six position/logit variants, evaluated with the length evaluator (`angpt eval --suite length`) at L, 4L, 16L.

Paper (162M, L = 4k, val loss at 4k/16k/64k): RoPE 3.261/3.936/5.260, ALiBi 3.281/3.272/3.270,
LogN+p-RoPE 3.256/3.262/3.317, scale-invariant p-RoPE 3.244/3.235/3.247: scale-invariant best and nearly flat,
RoPE degrading sharply.

Every variant shares the architecture (--arch, GPT+ by default: the paper's modded-nanogpt base is a pre-norm
GPT with QK-norm), shape, data, seed and recipe; only the attention config differs (VARIANTS). Each trained
checkpoint is kept under OUTPUT_DIR/<variant>-s<seed>/final (experiments/needle/needle.py fine-tunes the same
ones), and a finished training or evaluation is reused when the script runs again. `--seeds N` trains N models per variant,
seeds 0 … N-1; `--first-seed K` starts them at K, so a later session can add seed K alone (the same model, in the
same directory, as in a run of more seeds). Beside the table of losses, the section splits the 16L windows' loss
by position ([0, L), [L, 2L), [2L, 4L), ...: how far past L the growth happens) from the per-position curves the
evaluator writes (length_eval/length.json), with a second plot; `--section NAME` writes a section of its own.

    python experiments/length_generalisation/length_generalisation.py --jobs 2 --threads 1
        # d=128, 4 layers, L=256, 1500 steps (~55 min, 2 cores)
    python experiments/length_generalisation/length_generalisation.py --size quick   # minutes
    python experiments/length_generalisation/length_generalisation.py --device       # d=768, 12 layers, L=1024 on a GPU

`--split-digits` trains the BPE with every digit its own token (the recipe key tokenizer_split_digits), for models
that copy numbers (experiments/needle/needle.py); those models need their own --output-dir and get their own sections.

Held-out text (--eval-corpus): by default the last HELDOUT_CHARS characters of one corpus file (linux_docs.txt
of experiments/corpus: the kernel's KVM API document) are split off, cut at a paragraph break, and the models train
on the rest (DATASET/.length_split/: the other files linked, that file's head copied), so every window
of the length evaluation is mL tokens of one running text none of the models trained on. `--eval-corpus FILE`
evaluates on FILE and trains on --dataset unchanged; `--eval-corpus blocks` is the earlier behaviour (training
on --dataset, windows made of m validation blocks in random order, so context past L is unrelated text).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "common"), str(HERE.parents[1] / "bench")]  # the experiments' and bench's helpers

import length_models as lm  # noqa: E402
import results_file as rf  # noqa: E402
import study  # noqa: E402

# Upper edges of the by-position table's bins of target positions, in units of L: [0, L), [L, 2L), [2L, 4L), ...
POSITION_BIN_EDGES = (1, 2, 4, 8, 16)


def evaluate_variant(cfg: dict, variant: str, seed: int, checkpoint: pathlib.Path) -> tuple[dict, dict]:
    """({multiple: loss}, the longest windows' per-position curves) from the length evaluator, cached beside the
    checkpoint: summary.json (the settings and losses) and the evaluator's length.json (the curves). An evaluation
    with other windows or text, or from before the evaluator wrote `position_excess`, is run again."""
    from modeling_angpt.evaluation import EvalOptions
    from modeling_angpt.evaluation.length import run_suite

    cached = cached_evaluation(cfg, variant, seed)
    if cached is None:
        out = lm.checkpoint_dir(cfg, variant, seed) / "length_eval"
        model, tokenizer = lm.load(checkpoint, cfg["torch_device"])
        options = EvalOptions(lengths=",".join(map(str, cfg["multiples"])), limit=cfg["windows"], batch_size=1,
                              train_length=cfg["length"], corpus=cfg["eval_file"])
        metrics = run_suite(model, tokenizer, checkpoint, options, out)
        (out / "summary.json").write_text(json.dumps({
            "windows": cfg["windows"], "eval": cfg["eval_file"] or "validation blocks",
            "loss": {m: metrics[f"length_x{m}"]["loss"] for m in cfg["multiples"]}}))
        cached = cached_evaluation(cfg, variant, seed)
    summary, report = cached
    return {int(k): v for k, v in summary["loss"].items()}, position_curves(report, cfg["multiples"][-1])


def cached_evaluation(cfg: dict, variant: str, seed: int) -> tuple[dict, dict] | None:
    """(summary.json, length.json) of the model's length evaluation when it was made with this run's windows and
    text by an evaluator that writes `position_excess`; else None (length_attention.py reads it too)."""
    out = lm.checkpoint_dir(cfg, variant, seed) / "length_eval"
    cached, written = out / "summary.json", out / "length.json"
    if not (cached.is_file() and written.is_file()):
        return None
    summary, report = json.loads(cached.read_text()), json.loads(written.read_text())
    source = cfg["eval_file"] or "validation blocks"
    if (summary.get("windows"), summary.get("eval", "validation blocks")) != (cfg["windows"], source) \
            or "position_excess" not in report:
        return None
    return summary, report


def position_curves(report: dict, multiple: int) -> dict[str, np.ndarray]:
    """The per-position curves of the `multiple`× windows in the evaluator's length.json (`report`); entry j is the
    token at position j + 1, predicted from the j + 1 before it. "loss": its mean loss; "excess": its mean loss
    minus the same token's loss in its 1× window (NaN where there is nothing to compare: positions below L and
    those starting a 1× window)."""
    key = f"x{multiple}"
    return {"loss": np.asarray(report["position_loss"][key], dtype=np.float64),
            "excess": np.asarray([np.nan if v is None else v for v in report["position_excess"][key]])}


def binned(curve: np.ndarray, length: int) -> list[float]:
    """A position curve's mean (NaN entries left out) in each bin of POSITION_BIN_EDGES that the window reaches."""
    from modeling_angpt.evaluation.length import bin_means

    edges = [1] + [e * length for e in POSITION_BIN_EDGES if e * length <= len(curve) + 1]
    return [float(mean) for mean in bin_means(curve, edges)]


def position_bin_labels(longest: int) -> list[str]:
    """'[0, L)', '[L, 2L)', '[2L, 4L)', ...: the bins of POSITION_BIN_EDGES that windows of `longest`·L reach."""
    return [f"[{a}L, {b}L)".replace("[0L", "[0").replace(" 1L)", " L)").replace("[1L", "[L")
            for a, b in zip((0,) + POSITION_BIN_EDGES, POSITION_BIN_EDGES) if b <= longest]


def by_position_tables(curves: dict, cfg: dict) -> list[str]:
    """The growth past L (the table above) split by how far past L a token stands: each variant's mean loss per bin
    of positions in the longest windows, and its mean loss there minus the same tokens' loss in 1× windows."""
    length, longest = cfg["length"], cfg["multiples"][-1]
    labels = position_bin_labels(longest)
    lines = [f"Where in the {longest}L windows the loss grows (the tokens of the last column above; mean over seeds). "
             "First the mean loss per bin of positions; each bin scores every variant on the same tokens, so "
             "variants compare within a column (across columns the text differs too, the same for every variant). "
             "A bin past L holds tokens that see more context than training gave.", "",
             "| variant | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for variant, by_seed in curves.items():
        if by_seed:
            bins = [binned(curve["loss"], length) for curve in by_seed]
            lines.append(f"| {variant} | " + " | ".join(cell([b[i] for b in bins]) for i in range(len(labels))) + " |")
    lines += ["", "Then each token's loss there minus its own loss in the 1× window that holds it: the text's "
              "difficulty cancels, and the bins split the growth of the table above by position. In its 1× window "
              "a token saw only the tokens since that window began, so a model that looks back exactly L tokens "
              "would come out below 0; above 0, the context past L costs more than it gives.", "",
              "| variant | " + " | ".join(labels[1:]) + " |", "|---|" + "---|" * (len(labels) - 1)]
    for variant, by_seed in curves.items():
        if by_seed:
            bins = [binned(curve["excess"], length)[1:] for curve in by_seed]
            lines.append(f"| {variant} | "
                         + " | ".join(cell([b[i] for b in bins], signed=True) for i in range(len(labels) - 1)) + " |")
    return lines


def mean_and_error(values: list[float]) -> tuple[float, float | None]:
    """Mean over seeds and its standard error (None for one seed): the table's cells and the plot's error bars."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def cell(values: list[float], signed: bool = False) -> str:
    """A table cell: the mean over seeds, with its standard error when there are several."""
    mean, error = mean_and_error(values)
    return f"{mean:{'+' if signed else ''}.3f}" + (f" ± {error:.3f}" if error is not None else "")


def summary_row(losses_by_seed: list[dict], multiples: list[int]) -> list[str]:
    return [cell([losses[m] for losses in losses_by_seed]) for m in multiples]


def section(results: dict, cfg: dict, command: str, png_link: str, curves: dict | None = None,
            position_png_link: str | None = None) -> str:
    ms = cfg["multiples"]
    lines = ["## Length generalisation: validation loss at L, 4L, 16L (scale-invariant paper, Table 1)"
             + lm.title_suffix(cfg) + lm.own_section_suffix(cfg), "",
             f"`{command}`", "", rf.machine_line(cfg["torch_device"]), "",
             study.corpus_line(cfg.get("dataset_given", cfg["dataset"]), cfg["eval_file"]), "",
             f"{cfg['arch']} models, d={cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads "
             f"(d_h={cfg['hidden'] // cfg['heads']}), {lm.tokenizer_text(cfg)}, trained at L={cfg['length']} for "
             f"{cfg['steps']} steps × {cfg['batch']}×{cfg['length']} tokens (lr {cfg['lr']:g}, the architecture's "
             f"recipe) on `{lm.shown(cfg, cfg['dataset'])}`, seeds {lm.seed_ids(cfg)}; identical except for the "
             "attention config. Evaluated by `modeling_angpt.evaluation.length.run_suite` "
             "(= `angpt eval --suite length`) on "
             + eval_description(cfg) + f", {cfg['windows']} windows of {ms[-1]}L tokens cut into windows of each "
             "length (the same tokens at every length). Paper at 4k/16k/64k: RoPE 3.261/3.936/5.260, "
             "ALiBi 3.281/3.272/3.270, LogN+p-RoPE 3.256/3.262/3.317, scale-invariant p-RoPE 3.244/3.235/3.247.", "",
             study.changed_settings(cfg, {**lm.SIZES[cfg["size"]], **lm.DEFAULTS}, cfg["size"]), "",
             "| variant | " + " | ".join(f"loss at {m}L ({m * cfg['length']})" for m in ms)
             + f" | {ms[-1]}L − L |", "|---|" + "---|" * (len(ms) + 1)]
    for variant, by_seed in results.items():
        if not by_seed:
            lines.append(f"| {variant} | " + " | ".join("not run" for _ in ms) + " | |")
            continue
        # per seed, then pooled: seeds differ in level more than in growth (a seed's own baseline cancels)
        growth = cell([losses[ms[-1]] - losses[ms[0]] for losses in by_seed], signed=True)
        lines.append(f"| {variant} | " + " | ".join(summary_row(by_seed, ms)) + f" | {growth} |")
    done = {v: statistics.fmean(r[ms[-1]] for r in s) for v, s in results.items() if s}
    if len(done) > 1:
        order = sorted(done, key=done.get)
        lines += ["", f"Ordering at {ms[-1]}L (best first): {' < '.join(order)}. Paper's claim: scale-invariant "
                  f"p-RoPE best and nearly flat, RoPE degrading sharply — here scale-invariant p-RoPE is "
                  f"{'best' if order[0] == 'scale-invariant p-RoPE' else 'not best'}"
                  + (f" and RoPE {'worst' if order[-1] == 'RoPE' else 'not worst'}" if "RoPE" in done else "") + "."]
    lines += ["", f"![validation loss against evaluation length]({png_link})"]
    if curves and any(curves.values()):
        lines += ["", *by_position_tables(curves, cfg), "",
                  f"![validation loss against position in the {ms[-1]}L windows]({position_png_link})"]
    return "\n".join(lines)


def eval_description(cfg: dict) -> str:
    if not cfg["eval_file"]:
        return ("the validation blocks in random order (a window of mL tokens is m unrelated blocks: "
                "`--eval-corpus blocks`)")
    where = lm.shown(cfg, cfg["eval_file"])
    if cfg["eval_corpus"] == "heldout":
        source = pathlib.Path(cfg["eval_file"]).name.removesuffix("_heldout.txt") + ".txt"  # held_out_split's name
        return (f"contiguous held-out text, `{where}` (the last {lm.HELDOUT_CHARS // 1000}k characters of "
                f"{source}, cut at a blank line; the models trained on the rest of the corpus, "
                f"`{lm.shown(cfg, cfg['dataset'])}`)")
    return f"contiguous text from `{where}` (`--eval-corpus`)"


def plot(results: dict, cfg: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for variant, by_seed in results.items():
        if by_seed:
            ms = cfg["multiples"]
            means, errors = zip(*(mean_and_error([r[m] for r in by_seed]) for m in ms))
            axis.errorbar([m * cfg["length"] for m in ms], means, yerr=None if None in errors else errors,
                          fmt="o-", capsize=3, label=variant)
    axis.axvline(cfg["length"], color="grey", linestyle="--", linewidth=1)
    axis.set(xscale="log", xlabel="evaluation length (tokens)", ylabel="validation loss",
             title=f"trained at L={cfg['length']}" + (", bars: ± standard error over seeds"
                                                     if any(len(s) > 1 for s in results.values()) else ""))
    axis.set_xscale("log", base=2)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    rf.save_figure(figure, path)


def plot_by_position(curves: dict, cfg: dict, path: pathlib.Path, bins_per_octave: int = 4) -> None:
    """Loss against position in the longest windows (left) and its excess over the same tokens' loss in 1× windows
    (right, from L on), one curve per variant (mean over seeds), in the bins of the length evaluator's own plot of
    one model (`binned_curve`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from modeling_angpt.evaluation.length import binned_curve

    length, seeds = cfg["length"], max(len(by_seed) for by_seed in curves.values())
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for variant, by_seed in curves.items():
        if by_seed:
            line, = left.plot(*binned_curve(np.mean([c["loss"] for c in by_seed], axis=0), length, bins_per_octave),
                              ".-", label=variant)
            excess = np.mean([c["excess"] for c in by_seed], axis=0)  # NaN below L: drawn from L on
            right.plot(*binned_curve(excess, length, bins_per_octave), ".-", color=line.get_color(), label=variant)
    left.axvline(length, color="grey", linestyle="--", linewidth=1)
    right.axhline(0.0, color="grey", linewidth=1)
    left.set(xlabel=f"position in the {cfg['multiples'][-1]}L windows (tokens)", ylabel="validation loss (binned)",
             title=f"trained at L={length}" + (f", mean over {seeds} seeds" if seeds > 1 else ""))
    right.set(xlabel="position (tokens)", ylabel="loss − the same token's loss in its 1× window",
              title="what context past L does to a token")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    left.legend(fontsize=8)
    rf.save_figure(figure, path)


def train_and_evaluate(cfg: dict, variant: str, seed: int) -> tuple[dict, dict]:
    return evaluate_variant(cfg, variant, seed, lm.train_variant(cfg, variant, seed))


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    lm.common_arguments(parser, HERE)
    parser.add_argument("--section", help="the section to write (default length_generalisation, "
                                          "or length_generalisation_split_digits); its title then names the seeds")
    cfg = lm.resolve(parser.parse_args(argv))
    evaluated = lm.for_each_model(cfg, train_and_evaluate)
    results = {variant: [losses for losses, _ in runs] for variant, runs in evaluated.items()}
    curves = {variant: [curve for _, curve in runs] for variant, runs in evaluated.items()}
    name = cfg.get("section") or lm.section_name("length_generalisation", cfg)
    png = pathlib.Path(cfg["plots_dir"]) / f"{name}.png"
    position_png = png.with_name(f"{name}_by_position.png")
    text = section(results, cfg, rf.command_line(__file__, argv), rf.plot_link(cfg["results"], png),
                   curves, rf.plot_link(cfg["results"], position_png))
    print(text)
    if not cfg["no_write"]:
        plot(results, cfg, png)
        plot_by_position(curves, cfg, position_png)
        rf.update_section(name, text, cfg["results"])


if __name__ == "__main__":
    main()
