#!/usr/bin/env python
"""Which rotary pairs make the distance penalty of the length models, and what each does past the training length.

The raw logit S = s·q·k (s the softmax scale, q and k after the rotation) is a sum over the head's channel pairs:
pair c (channels c and c + r/2, turning at ω_c radians per token) adds s·(q_c·k_c + q_{c+r/2}·k_{c+r/2}), and the
channels that do not turn add the rest. length_attention.py measured S's mean by distance of the key; this
script splits that mean into its pairs (the parts add up to it exactly), for the queries the profile uses:
positions [M/2·L, M·L) of M·L windows and [L/2, L) of 1× windows. A pair's part at distance t follows cos(ω_c·t + φ)
for keys whose content does not depend on t; a pair that turns less than half a turn within L can lower S
steadily over [0, L) (a distance penalty) but rises again once ω_c·t passes π.

Then the test of cause: each rotating pair is dropped in turn (its two query channels set to zero after the
rotation, in every layer and head, so that it adds nothing to S) and the model's length evaluation is run again
on the same windows (`length_generalisation` of the library, multiples 1 and M): its loss in the 1× windows, and its
loss excess over them by position in the M·L windows ([L, 2L), [2L, 4L), ...). A pair whose part rises past L and
whose removal cuts the excess there is a cause of the growth; its cost within L is the 1× loss.

    python experiments/length_generalisation/length_rotary_pairs.py --jobs 2 --threads 1 --seeds 2 \\
        --variants p-RoPE "scale-invariant p-RoPE" \\
        --output-dir runs/length_default   # four default models, evaluated only (~13 min per model on one core)
    python experiments/length_generalisation/length_rotary_pairs.py --size quick \\
        --variants "scale-invariant p-RoPE"   # minutes

It also measures each part's spread: its variance over the keys of an octave, each query's own (what one query's
softmax sees), and its covariance with S, so that the table of drops can show S's variance with each pair gone.
A smaller spread by itself weighs the far keys less under the scale-invariant transform (docs/attention.md), so
`--drop all` adds two controls: the channels that do not turn, dropped two at a time like a pair (no position, and
whatever spread they carry), and every query scaled so that S's variance falls by 10 % and by 20 % (spread taken
from every part alike, no pair removed).

The models are trained first when missing (the checkpoints and arguments of length_generalisation.py).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "common"), str(HERE.parents[1] / "bench")]  # the experiments' and bench's helpers

import length_models as lm  # noqa: E402
import results_file as rf  # noqa: E402
from length_attention import logit_spans, octave_count, publish, resolve, section_head  # noqa: E402
from length_generalisation import binned, position_bin_labels  # noqa: E402
from rotary_pairs_probe import (STATIC, PairRecorder, attention_calls, components, dropping, recording,  # noqa: E402
                                scaling, spread_units, static_pairs)

SPREAD_QUERIES = 256  # queries per window whose spread is measured (evenly spaced over the recorded ones)
SHRUNK_VARIANCE = (0.9, 0.8)  # --drop all's other control: S times √share, its spread's variance times share


def shrunk_label(share: float) -> str:
    return f"q × {math.sqrt(share):.3f} (S's variance × {share})"


SHRUNK = {shrunk_label(share): share for share in SHRUNK_VARIANCE}  # the control's rows, by label


def losses(model, blocks: np.ndarray, cfg: dict) -> dict:
    """The length evaluation of the library on `blocks` (multiples 1 and M): the 1× loss, and the mean excess of
    the M·L windows over the 1× windows per bin of positions [L, 2L), [2L, 4L), ..."""
    from modeling_angpt.evaluation.length import length_generalisation

    multiple = cfg["multiples"][-1]
    report = length_generalisation(model, blocks, cfg["length"], (1, multiple), windows=cfg["windows"])
    return {"single": report.loss(1), "excess": binned(report.position_excess[multiple], cfg["length"])[1:]}


def analyse_variant(cfg: dict, variant: str, seed: int) -> dict:
    """One model's parts of S by octave ("long", "short"), their spread ("spread"), and its losses intact and with
    each pair of --drop dropped (and, with --drop all, the controls), kept beside the checkpoint (rotary_pairs.json)
    as each is done, so that a stopped run goes on where it was and a finished one is only read."""
    from transformers import AutoConfig

    checkpoint = lm.train_variant(cfg, variant, seed)
    path = lm.checkpoint_dir(cfg, variant, seed) / "rotary_pairs.json"
    setting = {"windows": cfg["windows"], "eval": str(cfg["eval_file"])}
    found = json.loads(path.read_text()) if path.is_file() else {}
    if found.get("setting") != setting:  # made with other windows or text: measured again
        found = {"setting": setting, "dropped": {}}
    labels, membership = components(AutoConfig.from_pretrained(checkpoint))
    units = spread_units(labels, membership)  # the turning pairs first, then the static pairs --drop all drops
    droppable = len(labels) - 1 + (len(static_pairs(membership)) if cfg["drop"] == "all" else 0)
    drops = [(label, dropping(channels)) for label, channels in list(zip(*units))[:droppable]]
    if cfg["drop"] == "all":
        drops += [(label, scaling(math.sqrt(share))) for label, share in SHRUNK.items()]
    if "spread" not in found or any(label not in found["dropped"] for label, _ in drops):
        measure(cfg, f"{variant}, seed {seed}", checkpoint, (labels, membership, *units), drops, found, path)
    arrays = ("long", "short")
    return {**found, **{w: np.asarray(found[w]) for w in arrays},
            "spread": {w: {k: np.asarray(v) for k, v in found["spread"][w].items()} for w in arrays},
            "dropped": {label: found["dropped"][label] for label, _ in drops}}  # this run's, in order


def measure(cfg: dict, name: str, checkpoint: pathlib.Path, parts: tuple, drops: list, found: dict,
            path: pathlib.Path) -> None:
    """Fill `found` with what it lacks: the intact model's parts of S and their spread (`parts`: labels, membership,
    unit labels, unit channels) and its losses; the losses with each of `drops` (label, wrap of the attention call)
    applied. Writes it to `path` after each."""
    from modeling_angpt.evaluation.length import contiguous_blocks

    model, tokenizer = lm.load(checkpoint, cfg["torch_device"])
    length, multiple = cfg["length"], cfg["multiples"][-1]
    blocks, _ = contiguous_blocks(pathlib.Path(cfg["eval_file"]), tokenizer, length)
    if len(blocks) < multiple:
        raise SystemExit(f"--eval-corpus {cfg['eval_file']}: fewer than {multiple} blocks of {length} tokens")
    if "spread" not in found:  # the intact model: its parts of S (and their spread), and its losses
        labels, membership, unit_labels, units = parts
        layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
        windows = {"long": multiple, "short": 1}  # the recorded windows, by their length in L
        recorders = {w: PairRecorder(layers, heads, membership, octave_count(m * length),
                                     slice(m * length // 2, m * length), units,
                                     stride=max(1, m * length // 2 // SPREAD_QUERIES)) for w, m in windows.items()}
        with attention_calls(recording({windows[w] * length: r for w, r in recorders.items()})):
            found["intact"] = losses(model, blocks, cfg)
        found.update(labels=labels, spread_labels=unit_labels, **{w: r.mean().tolist() for w, r in recorders.items()},
                     spread={w: {k: v.tolist() for k, v in r.spread().items()} for w, r in recorders.items()})
        path.write_text(json.dumps(found))
        print(f"{name}: intact {found['intact']}", file=sys.stderr, flush=True)
    for label, wrap in drops:
        if label not in found["dropped"]:
            with attention_calls(wrap):
                found["dropped"][label] = losses(model, blocks, cfg)
            path.write_text(json.dumps(found))
            print(f"{name}: {label} {found['dropped'][label]}", file=sys.stderr, flush=True)


def parts_table(analyses: dict, cfg: dict) -> list[str]:
    """Per model and part: its mean part of S (over layers and heads) at the 1× windows' farthest octave, then at
    that octave and each distance bin past L for the long windows' queries; the last row adds them up."""
    m, spans = cfg["multiples"][-1], logit_spans(cfg)
    lines = ["The raw logit S split into its rotary pairs: each part's mean over the keys at that distance "
             "(mean over layers and heads), for the 1× windows' queries at [L/2, L) and the "
             f"{m}L windows' queries at [{m // 2}L, {m}L). A pair is named by its frequency in radians per token; "
             f"'{STATIC}' is every channel that does not turn; 'S' is their sum, S's mean in "
             "length_attention.py.", "",
             "| model | part | " + " | ".join(label for _, label, _ in spans) + " |", "|---|---|" + "---|" * len(spans)]
    for variant, runs in analyses.items():
        for seed, run in zip(lm.seed_ids(cfg), runs):
            for part, label in [*enumerate(run["labels"]), (None, "S")]:
                cells = []
                for windows, _, octave in spans:
                    parts = run[windows][..., octave]  # [layers, heads, parts]
                    cells.append(f"{(parts.sum(-1) if part is None else parts[..., part]).mean():+.3f}")
                lines.append(f"| {variant}, seed {seed} | {label} | " + " | ".join(cells) + " |")
    return lines


def spread_table(analyses: dict, cfg: dict) -> list[str]:
    """Per model and part: the variance of its part of S over the keys of a distance bin (each query's own, mean over
    queries, layers and heads); the row "between parts" is what S's variance has beyond the parts' own."""
    spans = logit_spans(cfg)
    lines = ["The spread of each part: its variance over the keys at that distance, each query's own (what the "
             f"softmax of one query sees), averaged over queries, layers and heads, for up to {SPREAD_QUERIES} evenly "
             "spaced queries of each window among the same queries. 'between parts' is S's variance minus the "
             "parts' own (twice their covariances).", "",
             "| model | part | " + " | ".join(label for _, label, _ in spans) + " |", "|---|---|" + "---|" * len(spans)]
    for variant, runs in analyses.items():
        for seed, run in zip(lm.seed_ids(cfg), runs):
            units = run["spread_labels"]
            shown = [units.index(label) for label in run["labels"]] + [units.index("S")]
            for row, label in [*((u, units[u]) for u in shown), (None, "between parts")]:
                cells = []
                for windows, _, octave in spans:
                    variance = run["spread"][windows]["variance"][..., octave].mean(axis=(0, 1))  # [units]
                    value = variance[row] if row is not None else variance[shown[-1]] - variance[shown[:-1]].sum()
                    cells.append(f"{value:.3f}")
                lines.append(f"| {variant}, seed {seed} | {label} | " + " | ".join(cells) + " |")
    return lines


def variance_without(run: dict, label: str, windows: str, octave: int) -> float:
    """S's variance over an octave's keys (mean over queries, layers and heads) once the row's change is made: a
    dropped part takes its variance and twice its covariance with the rest, a scaled query multiplies it."""
    spread, units = run["spread"][windows], run["spread_labels"]
    s = spread["variance"][..., units.index("S"), octave]
    if label == "none":
        return float(s.mean())
    if label in SHRUNK:
        return float(s.mean()) * SHRUNK[label]
    unit = units.index(label)
    return float((s - 2 * spread["covariance"][..., unit, octave] + spread["variance"][..., unit, octave]).mean())


def ablation_table(analyses: dict, cfg: dict) -> list[str]:
    """Per model: the 1× loss and the excess by position bin, intact and with each pair of --drop dropped, beside
    S's variance with the change made, within L (1×) and at the long windows' farthest bin."""
    m = cfg["multiples"][-1]
    labels = position_bin_labels(m)[1:]  # the excess starts at L
    (short, _, near), *_, (long, far_label, far) = logit_spans(cfg)
    control = (f"; then, as controls, each pair of the channels that do not turn ('{STATIC}: channels a, b'), "
               "dropped the same way, and every query scaled so that S's variance falls by 10 % and 20 %"
               ) if cfg["drop"] == "all" else ""
    lines = ["Each rotating pair dropped in turn (its query channels zeroed after the rotation in every layer and "
             f"head){control}: the loss on the 1× windows, and the loss excess of the {m}L windows over them by "
             "position (the length evaluation's windows and text; the first row of each model is the intact "
             "model); and S's variance with the change made, as in the table above, for the 1× windows at "
             f"[L/2, L) and at {far_label}.", "",
             "| model | dropped pair, or control | loss, 1× | " + " | ".join(f"excess, {label}" for label in labels)
             + f" | var S, 1×, [L/2, L) | var S, {far_label} |",
             "|---|---|---|" + "---|" * (len(labels) + 2)]
    for variant, runs in analyses.items():
        for seed, run in zip(lm.seed_ids(cfg), runs):
            for name, found in [("none", run["intact"]), *run["dropped"].items()]:
                excess = " | ".join("–" if math.isnan(v) else f"{v:+.3f}" for v in found["excess"])
                variances = " | ".join(f"{variance_without(run, name, w, o):.3f}" for w, o in ((short, near),
                                                                                              (long, far)))
                lines.append(f"| {variant}, seed {seed} | {name} | {found['single']:.3f} | {excess} | {variances} |")
    return lines


def plot(analyses: dict, cfg: dict, path: pathlib.Path) -> None:
    """One panel per variant: each rotating pair's part of S by distance octave (long windows, mean over layers,
    heads and seeds), and S itself."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    octaves = octave_count(cfg["multiples"][-1] * cfg["length"])
    centres = np.array([1.5 * 2 ** (k - 1) for k in range(1, octaves)])
    columns = min(2, len(analyses))
    rows = math.ceil(len(analyses) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(8 if columns == 1 else 13, 4.4 * rows), squeeze=False)
    for axis in axes.flat[len(analyses):]:
        axis.set_visible(False)
    for axis, (variant, runs) in zip(axes.flat, analyses.items()):
        long = np.mean([run["long"].mean(axis=(0, 1)) for run in runs], axis=0)  # [parts, octaves]
        labels = runs[0]["labels"]
        colours = plt.cm.viridis(np.linspace(0.0, 0.9, len(labels) - 1))  # fast pairs dark, slow ones light
        for part, label in enumerate(labels):
            colour = colours[part] if part < len(labels) - 1 else "grey"
            axis.plot(centres, long[part, 1:], ".-", color=colour, label=label, linewidth=1)
        axis.plot(centres, long.sum(0)[1:], "k.-", label="S", linewidth=2)
        axis.axvline(cfg["length"], color="grey", linestyle="--", linewidth=1)
        axis.axhline(0.0, color="grey", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.set(title=variant, xlabel="distance t of the key", ylabel="mean part of the raw logit S")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, ncol=2)
    m = cfg["multiples"][-1]
    figure.suptitle(f"queries at [{m // 2}L, {m}L) of {m}L windows; L = {cfg['length']} (dashed line); mean over "
                    "layers, heads and seeds", fontsize=10)
    rf.save_figure(figure, path)


def section(analyses: dict, cfg: dict, command: str, png_link: str) -> str:
    return "\n".join([*section_head(cfg, "which rotary pairs make the distance penalty", command, "on"),
                      *parts_table(analyses, cfg), "", *spread_table(analyses, cfg), "",
                      *ablation_table(analyses, cfg), "",
                      f"![each rotary pair's part of the raw logit by distance]({png_link})"])


def check_rotary(cfg: dict) -> None:
    """One clear line when a variant of --variants has no rotary pairs to split (NoPE, ALiBi)."""
    without = [v for v in cfg["variants"] if lm.VARIANTS[v]["rope_parameters"]["rope_type"] == "none"]
    if without:
        raise SystemExit(f"--variants {' '.join(without)}: expected variants with rotary pairs (not NoPE or ALiBi)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    lm.common_arguments(parser, HERE)
    parser.add_argument("--section", default="length_rotary_pairs",
                        help="the section to write, and its plot's file name")
    parser.add_argument("--drop", choices=("turning", "all"), default="turning",
                        help="the pairs dropped one at a time: the turning ones, or all (the channels that do not "
                             "turn too, two at a time, and the query scaled down, as controls)")
    cfg = resolve(parser, argv)
    check_rotary(cfg)
    publish(lm.for_each_model(cfg, analyse_variant), cfg, __file__, argv, section, plot)


if __name__ == "__main__":
    main()
