#!/usr/bin/env python
"""Whether a rotary pair's scores on the keys past the training length carry anything those keys earned.

length_rotary_pairs.py drops a pair on every key and finds that the fast pairs of scale-invariant p-RoPE cut
its loss growth past L by more than their share of S's spread explains, while the channels that do not turn give up
as much spread with no gain. This script edits S only on the keys at distance t ≥ L (the queries' keys within L keep
every part, so the 1× windows are untouched), for each pair that `--drop all` drops (the turning pairs and the
channels that do not turn, two at a time):

- dropped past L: the pair adds nothing to S on those keys. Beside the whole drop, this says whether the gain comes
  through the far keys;
- shuffled past L: each query's part from the pair moves to another of its keys past L (a random permutation per
  query). The query sees the same values, so the same mean and spread, but on keys that did not earn them. A part
  that carries information about its key (what content channels should do) costs loss when shuffled; a part that is
  noise with respect to its key costs nothing.

and, as the scale control, every part of S past L times √0.8 (its variance there × 0.8, no pair removed).

    python experiments/length_generalisation/length_rotary_past.py --jobs 2 --threads 1 --seeds 3 \\
        --variants "scale-invariant p-RoPE" \\
        --output-dir runs/length_default   # three default models, evaluated only
    python experiments/length_generalisation/length_rotary_past.py --size quick \\
        --variants "scale-invariant p-RoPE"   # minutes

It reads each model's intact losses, whole drops and spread from length_rotary_pairs.py's cache
(rotary_pairs.json, measured first when missing) and keeps its own beside it (rotary_past.json).
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
from length_attention import logit_spans, publish, resolve, section_head  # noqa: E402
from length_generalisation import position_bin_labels  # noqa: E402
from length_rotary_pairs import analyse_variant, check_rotary, losses, shrunk_label, variance_without  # noqa: E402
from rotary_pairs_probe import (STATIC, attention_calls, components, editing_past, spread_units,  # noqa: E402
                                static_pairs)

SHARE = 0.8  # the scale control past L: S's variance there × SHARE
SCALED = f"every part × {math.sqrt(SHARE):.3f}"
WHOLE_SCALED = shrunk_label(SHARE)  # the same scaling on every key: its row in length_rotary_pairs' --drop all
PAST, SHUFFLED = "past L", "past L shuffled"  # a unit's edits: dropped (or, for SCALED, scaled) past L; shuffled
EDITS = ("dropped", PAST, SHUFFLED)  # "dropped": on every key (length_rotary_pairs' drop, or the scaled query)
KINDS = ("turning ≥ half a turn within L", "turning < half a turn within L", "not turning", "scale control")


def kind(label: str, length: int) -> str:
    """Which of KINDS a row is: a pair that turns at least half a turn within L has values that do not depend on
    distance over ranges of keys (its mean over them ≈ 0); a slower one can make a penalty that turns back past L."""
    if label == SCALED:
        return KINDS[3]
    if label.startswith(STATIC):
        return KINDS[2]
    frequency = 1.0 if label == "1" else 1.0 / float(label.split("/")[1])
    return KINDS[0] if frequency * length >= math.pi else KINDS[1]


def changes(run: dict, label: str, windows: str, octave: int) -> dict:
    """{edit: (change in S's variance over the octave's keys, losses)} of one row, for each edit it has."""
    whole = WHOLE_SCALED if label == SCALED else label
    base = variance_without(run, "none", windows, octave)
    variances = {"dropped": variance_without(run, whole, windows, octave)}
    variances[PAST] = variances["dropped"]  # every key of the farthest octave is past L
    if label != SCALED:
        variances[SHUFFLED] = shuffled_variance(run, label, windows, octave)
    found = {"dropped": run["dropped"][whole], **run["past"][label]}
    return {edit: (variances[edit] - base, found[edit]) for edit in EDITS if edit in found}


def analyse_past(cfg: dict, variant: str, seed: int) -> dict:
    """One model's rotary_pairs.json analysis, with its losses under each edit past L added ("past": {label: {edit:
    losses}}), kept beside the checkpoint (rotary_past.json) as each is done."""
    from transformers import AutoConfig

    run = analyse_variant(cfg, variant, seed)
    checkpoint = lm.train_variant(cfg, variant, seed)  # trained already by analyse_variant: only found
    path = lm.checkpoint_dir(cfg, variant, seed) / "rotary_past.json"
    setting = {"windows": cfg["windows"], "eval": str(cfg["eval_file"])}
    found = json.loads(path.read_text()) if path.is_file() else {}
    if found.get("setting") != setting:
        found = {"setting": setting, "past": {}}
    labels, membership = components(AutoConfig.from_pretrained(checkpoint))
    unit_labels, units = spread_units(labels, membership)
    pairs = len(labels) - 1 + len(static_pairs(membership))  # the turning pairs, then the static ones
    edits = [(label, how, editing_past(cfg["length"], channels, shuffle=how == SHUFFLED, seed=seed))
             for label, channels in list(zip(unit_labels, units))[:pairs] for how in (PAST, SHUFFLED)]
    edits.append((SCALED, PAST, editing_past(cfg["length"], units[-1], factor=math.sqrt(SHARE))))
    missing = [edit for edit in edits if edit[1] not in found["past"].get(edit[0], {})]
    if missing:
        from modeling_angpt.evaluation.length import contiguous_blocks

        model, tokenizer = lm.load(checkpoint, cfg["torch_device"])
        blocks, _ = contiguous_blocks(pathlib.Path(cfg["eval_file"]), tokenizer, cfg["length"])
        for label, how, wrap in missing:
            with attention_calls(wrap):
                found["past"].setdefault(label, {})[how] = losses(model, blocks, cfg)
            path.write_text(json.dumps(found))
            print(f"{variant}, seed {seed}: {label}, {how} {found['past'][label][how]}", file=sys.stderr, flush=True)
    return {**run, "past": {label: found["past"][label] for label in dict.fromkeys(e[0] for e in edits)}}


def shuffled_variance(run: dict, label: str, windows: str, octave: int) -> float:
    """S's variance over an octave's keys with the unit's part shuffled among them: the part keeps its variance and
    loses its covariance with the rest, var(S − p) + var(p). The edit shuffles among all of a query's keys past L,
    which gives the same where the part's values do not depend on distance (fast pairs, channels that do not turn)."""
    spread, units = run["spread"][windows], run["spread_labels"]
    unit = units.index(label)
    s, p = spread["variance"][..., units.index("S"), octave], spread["variance"][..., unit, octave]
    return float((s - 2 * spread["covariance"][..., unit, octave] + 2 * p).mean())


def spread_and_shuffle(run: dict, label: str, windows: str, octave: int) -> float | None:
    """What dropping a pair past L would do at the farthest bin if its effect were the loss of its spread, at the
    rate the scale control past L gives per unit of S's variance, plus what moving its values among the keys does
    (its shuffle); None for the control itself."""
    found = changes(run, label, windows, octave)
    if SHUFFLED not in found:
        return None
    control, intact = changes(run, SCALED, windows, octave)[PAST], run["intact"]["excess"][-1]
    rate = (control[1]["excess"][-1] - intact) / control[0]
    return found["dropped"][0] * rate + found[SHUFFLED][1]["excess"][-1] - intact


def past_table(analyses: dict, cfg: dict) -> list[str]:
    """Per model and unit: the change in the loss excess at [2L, 4L) and at the farthest bin, dropped on every key
    (length_rotary_pairs.py's), dropped past L and shuffled past L, beside S's variance there after each."""
    m = cfg["multiples"][-1]
    bins = position_bin_labels(m)[1:]
    columns = (bins.index("[2L, 4L)"), len(bins) - 1)
    long, far_label, octave = logit_spans(cfg)[-1]
    lines = [f"The change in the loss excess of the {m}L windows over the 1× windows (the length evaluation's "
             f"windows and text) at [2L, 4L) and at {far_label}, against the intact model (its excess in the first "
             "row), with each pair dropped on every key (the section on which rotary pairs make the distance "
             "penalty), dropped only on the keys at t ≥ L, or shuffled among each query's keys at t ≥ L; last, "
             f"every part of S times {math.sqrt(SHARE):.3f} (its variance × {SHARE}), on every key (the query "
             "scaled) and past L only. Beside them, the change in S's variance over a query's keys at "
             f"{far_label} with the pair dropped (there, the same on every key or past L) and with it shuffled (from "
             "the intact model's spread; its value in the first row). Last, the sum of two parts, beside the drop past "
             f"L at {far_label}: the pair's loss of variance at the rate the scale control past L gives per unit "
             "of variance, and its shuffle. No edit past L changes the 1× windows.", "",
             f"| model | pair | Δ excess, [2L, 4L): dropped | {PAST} | {SHUFFLED} | Δ excess, {far_label}: dropped "
             f"| {PAST} | {SHUFFLED} | Δ var S: dropped | {SHUFFLED} | spread + shuffle |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant, runs in analyses.items():
        for seed, run in zip(lm.seed_ids(cfg), runs):
            name, intact = f"{variant}, seed {seed}", run["intact"]["excess"]
            lines.append(f"| {name} | none | " + " | | | ".join(f"{intact[c]:+.3f}" for c in columns)
                         + f" | | | {variance_without(run, 'none', long, octave):.3f} | | |")
            for label in run["past"]:
                found = changes(run, label, long, octave)
                cells = [f"{found[edit][1]['excess'][c] - intact[c]:+.3f}" if edit in found else "–"
                         for c in columns for edit in EDITS]
                variances = [f"{found[edit][0]:+.3f}" if edit in found else "–" for edit in ("dropped", SHUFFLED)]
                both = spread_and_shuffle(run, label, long, octave)
                lines.append(f"| {name} | {label} | " + " | ".join(cells + variances) + " | "
                             + ("–" if both is None else f"{both:+.3f}") + " |")
    return lines


def points(runs: list, cfg: dict) -> dict:
    """{kind: {edit: [(change in S's variance, change in the loss excess) at the farthest bin, per row]}} over the
    models `runs` of one variant."""
    long, _, octave = logit_spans(cfg)[-1]
    found = {}
    for run in runs:
        intact = run["intact"]["excess"][-1]
        for label in run["past"]:
            for edit, (variance, losses_) in changes(run, label, long, octave).items():
                found.setdefault(kind(label, cfg["length"]), {}).setdefault(edit, []).append(
                    (variance, losses_["excess"][-1] - intact))
    return found


def summary_table(analyses: dict, cfg: dict) -> list[str]:
    """Per variant and kind of row: the mean over its rows (pairs and models) of the changes in the table above at
    the farthest bin."""
    far_label = logit_spans(cfg)[-1][1]
    lines = [f"The same at {far_label}, averaged over the rows of each kind (pairs and seeds): the pairs that turn at "
             "least half a turn within L (their values over a range of far keys do not depend on distance), the "
             "slower ones, the channels that do not turn (two at a time), and the scale control.", "",
             f"| model | kind | rows | Δ excess: dropped | {PAST} | {SHUFFLED} | Δ var S: dropped | {SHUFFLED} "
             "| spread + shuffle |", "|---|---|---|---|---|---|---|---|---|"]
    long, _, octave = logit_spans(cfg)[-1]
    for variant, runs in analyses.items():
        found = points(runs, cfg)
        both = {}  # kind -> [spread_and_shuffle per row]
        for run in runs:
            for label in run["past"]:
                both.setdefault(kind(label, cfg["length"]), []).append(spread_and_shuffle(run, label, long, octave))
        for name in [k for k in KINDS if k in found]:
            edits = found[name]
            excess = [f"{np.mean([e for _, e in edits[edit]]):+.3f}" if edit in edits else "–" for edit in EDITS]
            variance = [f"{np.mean([v for v, _ in edits[edit]]):+.3f}" if edit in edits else "–"
                        for edit in ("dropped", SHUFFLED)]
            summed = "–" if None in both[name] else f"{np.mean(both[name]):+.3f}"
            lines.append(f"| {variant} | {name} | {len(edits['dropped'])} | " + " | ".join(excess + variance)
                         + f" | {summed} |")
    return lines


def plot(analyses: dict, cfg: dict, path) -> None:
    """One panel per variant, a point per model and pair: the change in the loss excess at the farthest bin against
    the change in S's variance there, for the pair dropped on every key, dropped past L and shuffled past L; and
    the scale control (every part of S × √0.8, on every key and past L) as the line a loss of spread alone gives."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    far_label = logit_spans(cfg)[-1][1]
    figure, axes = plt.subplots(1, len(analyses), figsize=(7 * len(analyses), 5), squeeze=False)
    markers = {"dropped": "o", PAST: "s", SHUFFLED: "^"}
    colours = dict(zip(KINDS, ("tab:blue", "tab:cyan", "tab:grey", "black")))
    for axis, (variant, runs) in zip(axes.flat, analyses.items()):
        for name, edits in points(runs, cfg).items():
            for edit, found in edits.items():
                xs, ys = zip(*found)
                shown = "every key" if name == KINDS[3] and edit == "dropped" else edit
                axis.scatter(xs, ys, marker=markers[edit], color=colours[name], alpha=0.7, label=f"{name}, {shown}")
        axis.axhline(0.0, color="grey", linewidth=1)
        axis.axvline(0.0, color="grey", linewidth=1)
        axis.set(title=variant, xlabel=f"change in S's variance over a query's keys, {far_label}",
                 ylabel=f"change in the loss excess, {far_label}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"each pair dropped (o), dropped past L (s), shuffled past L (^); L = {cfg['length']}",
                    fontsize=10)
    rf.save_figure(figure, path)


def section(analyses: dict, cfg: dict, command: str, png_link: str) -> str:
    return "\n".join([*section_head(cfg, "do the rotary pairs' scores past L carry information", command, "on"),
                      *past_table(analyses, cfg), "", *summary_table(analyses, cfg), "",
                      f"![each pair dropped and shuffled past L]({png_link})"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    lm.common_arguments(parser, HERE)
    parser.add_argument("--section", default="length_rotary_past",
                        help="the section to write, and its plot's file name")
    cfg = {**resolve(parser, argv), "drop": "all"}
    check_rotary(cfg)
    publish(lm.for_each_model(cfg, analyse_past), cfg, __file__, argv, section, plot)


if __name__ == "__main__":
    main()
