#!/usr/bin/env python
"""Do a rotary pair's scores on the keys past the training length carry anything those keys earned?

bench/length_rotary_pairs.py drops a pair on every key and finds that the fast pairs of scale-invariant p-RoPE cut
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

    python bench/length_rotary_past.py --jobs 2 --threads 1 --seeds 3 --variants "scale-invariant p-RoPE" \\
        --output-dir runs/length_default   # three default models, evaluated only
    python bench/length_rotary_past.py --size quick --variants "scale-invariant p-RoPE"   # minutes

It reads each model's intact losses, whole drops and spread from bench/length_rotary_pairs.py's cache
(rotary_pairs.json, measured first when missing) and keeps its own beside it (rotary_past.json).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import length_models as lm
import results_file as rf
from length_attention import logit_spans, publish, resolve, section_head
from length_generalisation import position_bin_labels
from length_rotary_pairs import SHRUNK, analyse_variant, losses, variance_without
from rotary_pairs_probe import STATIC, attention_calls, components, editing_past, spread_units, static_pairs

SHARE = 0.8  # the scale control past L: S's variance there × SHARE (the query-scaled row of SHRUNK on every key)
SCALED = f"every part × {math.sqrt(SHARE):.3f}"
PAST, SHUFFLED = "past L", "past L shuffled"  # a unit's edits: dropped (or, for SCALED, scaled) past L; shuffled


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
    loses its covariance with the rest, var(S − p) + var(p)."""
    spread, units = run["spread"][windows], run["spread_labels"]
    unit = units.index(label)
    s, p = spread["variance"][..., units.index("S"), octave], spread["variance"][..., unit, octave]
    return float((s - 2 * spread["covariance"][..., unit, octave] + 2 * p).mean())


def past_table(analyses: dict, cfg: dict) -> list[str]:
    """Per model and unit: the change in the loss excess at [2L, 4L) and at the farthest bin, dropped on every key
    (bench/length_rotary_pairs.py's), dropped past L and shuffled past L, beside S's variance there after each."""
    m = cfg["multiples"][-1]
    bins = position_bin_labels(m)[1:]
    columns = (bins.index("[2L, 4L)"), len(bins) - 1)
    long, far_label, octave = logit_spans(cfg)[-1]
    whole_scaled = next(label for label, share in SHRUNK.items() if share == SHARE)
    lines = [f"The change in the loss excess of the {m}L windows over the 1× windows (the length evaluation's "
             f"windows and text) at [2L, 4L) and at {far_label}, against the intact model (its excess in the first "
             "row), with each pair dropped on every key (the section on which rotary pairs make the distance "
             "penalty), dropped only on the keys at t ≥ L, or shuffled among each query's keys at t ≥ L; last, "
             f"every part of S times {math.sqrt(SHARE):.3f} (its variance × {SHARE}), on every key (the query "
             "scaled) and past L only. Beside them, S's variance over a query's keys at "
             f"{far_label} with the pair dropped and with it shuffled (from the intact model's spread). No edit past "
             "L changes the 1× windows.", "",
             f"| model | pair | Δ excess, [2L, 4L): dropped | {PAST} | {SHUFFLED} | Δ excess, {far_label}: dropped "
             f"| {PAST} | {SHUFFLED} | var S, dropped | var S, shuffled |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for variant, runs in analyses.items():
        for seed, run in zip(lm.seed_ids(cfg), runs):
            name, intact = f"{variant}, seed {seed}", run["intact"]["excess"]
            lines.append(f"| {name} | none | " + " | | | ".join(f"{intact[c]:+.3f}" for c in columns)
                         + f" | | | {variance_without(run, 'none', long, octave):.3f} | |")
            for label, edits in run["past"].items():
                whole = run["dropped"][whole_scaled if label == SCALED else label]
                found = (whole, edits[PAST], edits.get(SHUFFLED))
                cells = ["–" if f is None else f"{f['excess'][c] - intact[c]:+.3f}" for c in columns for f in found]
                variances = (f"{variance_without(run, whole_scaled, long, octave):.3f} | –" if label == SCALED else
                             f"{variance_without(run, label, long, octave):.3f} | "
                             f"{shuffled_variance(run, label, long, octave):.3f}")
                lines.append(f"| {name} | {label} | " + " | ".join(cells) + f" | {variances} |")
    return lines


def plot(analyses: dict, cfg: dict, path) -> None:
    """One panel per variant, a point per model and pair: the change in the loss excess at the farthest bin against
    the change in S's variance there, for the pair dropped on every key, dropped past L and shuffled past L; and
    the scale control (every part of S × √0.8, on every key and past L) as the line a loss of spread alone gives."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    long, far_label, octave = logit_spans(cfg)[-1]
    whole_scaled = next(label for label, share in SHRUNK.items() if share == SHARE)
    figure, axes = plt.subplots(1, len(analyses), figsize=(7 * len(analyses), 5), squeeze=False)
    for axis, (variant, runs) in zip(axes.flat, analyses.items()):
        points = {}  # (kind, edit) -> [(Δ variance, Δ excess)]
        for run in runs:
            base, intact = variance_without(run, "none", long, octave), run["intact"]["excess"][-1]
            for label, edits in run["past"].items():
                kind = "scale control" if label == SCALED else STATIC if label.startswith(STATIC) else "turning"
                for how, found in (("dropped", run["dropped"][whole_scaled if label == SCALED else label]),
                                   *edits.items()):
                    variance = (shuffled_variance(run, label, long, octave) if how == SHUFFLED else
                                variance_without(run, whole_scaled if label == SCALED else label, long, octave))
                    points.setdefault((kind, how), []).append((variance - base, found["excess"][-1] - intact))
        markers, colours = {"dropped": "o", PAST: "s", SHUFFLED: "^"}, {"turning": "tab:blue", STATIC: "tab:grey",
                                                                       "scale control": "black"}
        for (kind, how), found in points.items():
            xs, ys = zip(*found)
            axis.scatter(xs, ys, marker=markers[how], color=colours[kind], alpha=0.7,
                         label=f"{kind}, {'every key' if kind == 'scale control' and how == 'dropped' else how}")
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
                      *past_table(analyses, cfg), "", f"![each pair dropped and shuffled past L]({png_link})"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    lm.common_arguments(parser)
    parser.add_argument("--section", default="length_rotary_past", help="the RESULTS.md section to write")
    cfg = {**resolve(parser, argv), "drop": "all"}
    without = [v for v in cfg["variants"] if lm.VARIANTS[v]["rope_parameters"]["rope_type"] == "none"]
    if without:
        raise SystemExit(f"--variants {' '.join(without)}: expected variants with rotary pairs (not NoPE or ALiBi)")
    publish(lm.for_each_model(cfg, analyse_past), cfg, "length_rotary_past.py", argv, section, plot)


if __name__ == "__main__":
    main()
