#!/usr/bin/env python
"""Where the attention goes past the training length: the models of length_generalisation.py, run on the same
16L windows of held-out text, with each layer's attention weights summed by the distance t = i − j of the keys
they fall on, and the raw logits S (before any logit transform) described by their mean and spread per distance.

The scale-invariant transform L = √(1 + 2ℓ_t)·S − 2ℓ_t (ℓ_t = ln(1 + t/τ)) is built so that, if the logits S at
distance t are unit-variance Gaussian noise, every octave of distance [t, 2t) gets the same share of the
attention: then context past L adds octaves of about the weight each octave had within L, and nothing grows
without bound. With mean μ_t and spread σ_t instead, one key at distance t weighs exp(a·μ_t + a²σ_t²/2 − 2ℓ_t)
on average (a = √(1 + 2ℓ_t)), so an octave's share grows like (t/τ)^(σ_t² − 1)·exp(a·μ_t): the premise can be
checked from the trained weights, octave by octave, and set beside where each model's loss grows.

Queries: positions [8L, 16L) of the 16L windows (they see distances up to 16L), and for reference positions
[L/2, L) of 1× windows (what training saw). Each model runs on the eager attention path with its own transform
wrapped in a probe (`probe_transform`) that computes the same softmax as the model and records it; the test
suite checks the probe's sums against the attention weights the model itself returns.

    python experiments/length_generalisation/length_attention.py --jobs 2 --threads 1 --seeds 2 \\
        --output-dir runs/length_default
                                         # the twelve default models, evaluated only (~15 min on 2 cores)
    python experiments/length_generalisation/length_attention.py --size quick   # trains quick models first (minutes)

The models are trained first when missing (the same checkpoints and arguments as length_generalisation.py).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "common"), str(HERE.parents[1] / "bench")]  # the experiments' and bench's helpers

import length_models as lm  # noqa: E402
import results_file as rf  # noqa: E402
import study  # noqa: E402

PROBE_PREFIX = "probe:"


class AttentionRecorder:
    """Per layer, head and distance octave of the recorded queries: summed attention weight, and the count, sum and
    sum of squares of the raw logits S. Octave 0 is t = 0, octave k ≥ 1 is t ∈ [2^(k−1), 2^k)."""

    def __init__(self, layers: int, heads: int, octaves: int):
        self.shape = (layers, heads, octaves)
        self.mass, self.count, self.total, self.squares = (np.zeros(self.shape) for _ in range(4))
        self.queries = np.zeros(layers)  # queries recorded per layer (each row's weights sum to 1)
        self.rows: slice | None = None  # the query rows of the next forward to record; None records nothing
        self.layer = 0
        self.layout = None  # (visible, octave index) of the recorded rows: the same in every layer of a forward

    def start(self, rows: slice) -> None:
        self.rows, self.layer, self.layout = rows, 0, None

    def record(self, scores, transformed, query_pos, key_pos, causal: bool) -> None:
        """One layer's [1, h, q, kv] raw and transformed scores: its queries in `rows`, softmax over visible keys."""
        import torch

        if self.rows is None:
            return
        rows = self.rows
        if self.layout is None:
            t = (query_pos - key_pos)[0, 0, rows]  # [r, kv]
            visible = t >= 0 if causal else torch.ones_like(t, dtype=torch.bool)
            t = t.abs()
            octave = torch.where(t > 0, torch.floor(torch.log2(t.clamp(min=1).double())).long() + 1, 0)
            octave = torch.where(visible, octave.clamp(max=self.shape[2] - 1), self.shape[2])  # hidden → dump bin
            self.layout = visible, octave.flatten()
        visible, octave = self.layout
        weights = torch.softmax(transformed[0, :, rows].float().masked_fill(~visible, -math.inf), dim=-1)
        raw = scores[0, :, rows].float() * visible  # hidden keys add 0 (their octave is the dump bin anyway)
        index = octave.expand(raw.shape[0], -1)
        for target, values in ((self.mass, weights), (self.count, visible.float().expand_as(raw)),
                               (self.total, raw), (self.squares, raw.square())):
            sums = torch.zeros(raw.shape[0], self.shape[2] + 1, device=raw.device)
            sums.scatter_add_(1, index, values.reshape(raw.shape[0], -1))
            target[self.layer] += sums[:, :-1].double().cpu().numpy()
        self.queries[self.layer] += rows.stop - rows.start
        self.layer += 1

    def summary(self) -> dict:
        """Mean weight per query and octave [layers, heads, octaves], and the logits' mean and spread there."""
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self.total / self.count
            spread = np.sqrt(np.maximum(self.squares / self.count - mean ** 2, 0.0))
        return {"mass": self.mass / self.queries[:, None, None], "mean": mean, "spread": spread}


RECORDER: AttentionRecorder | None = None


def probe_transform(name: str) -> str:
    """Register `probe:<name>`: the registered logit transform `name` unchanged (head values, LogN's query scale),
    with its raw and transformed scores handed to RECORDER. Returns the probe's name for the config."""
    from modeling_angpt.logit_transforms_angpt import LOGIT_TRANSFORMS, register_logit_transform

    original = LOGIT_TRANSFORMS[name]

    def score(scores, query_pos, key_pos, head_value, config):
        transformed = scores if original.score is None else original.score(scores, query_pos, key_pos, head_value,
                                                                            config)
        if RECORDER is not None and scores.dim() == 4:
            RECORDER.record(scores, transformed, query_pos, key_pos, config.is_causal)
        return transformed

    register_logit_transform(PROBE_PREFIX + name, score, head_values=original.head_values,
                             query_scale=original.query_scale, query_scale_init=original.query_scale_init)
    return PROBE_PREFIX + name


def octave_count(length: int) -> int:
    """Octaves of distance a window of `length` tokens holds: t = 0, then [1, 2), [2, 4), ... up to length − 1."""
    return int(math.log2(max(length - 1, 1))) + 2


def profile_model(checkpoint: pathlib.Path, cfg: dict) -> dict:
    """The recorder summaries of one checkpoint: "long" for queries [M/2·L, M·L) of the M·L windows (M the largest
    multiple), "short" for queries [L/2, L) of the 1× windows cut from the same tokens."""
    import torch
    from transformers import AutoConfig

    from modeling_angpt.evaluation.length import contiguous_blocks

    global RECORDER
    length, multiple = cfg["length"], cfg["multiples"][-1]
    probe = probe_transform(AutoConfig.from_pretrained(checkpoint).attention_logit_transform)
    model, tokenizer = lm.load(checkpoint, cfg["torch_device"], attn_implementation="eager",
                               attention_logit_transform=probe)
    blocks, _ = contiguous_blocks(pathlib.Path(cfg["eval_file"]), tokenizer, length)
    windows = min(cfg["windows"], len(blocks) // multiple)
    if windows == 0:
        raise SystemExit(f"--eval-corpus {cfg['eval_file']}: fewer than {multiple} blocks of {length} tokens")
    ids = torch.as_tensor(blocks[:windows * multiple], device=cfg["torch_device"])
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    found = {}
    for name, inputs, rows in (("long", ids.reshape(windows, -1), slice(multiple * length // 2, multiple * length)),
                               ("short", ids, slice(length // 2, length))):
        RECORDER = AttentionRecorder(layers, heads, octave_count(multiple * length))
        try:
            with torch.no_grad():
                for window in inputs:
                    RECORDER.start(rows)
                    model.model(input_ids=window[None], use_cache=False)
            found[name] = RECORDER.summary()
        finally:
            RECORDER = None
    return found


def distance_bins(cfg: dict) -> list[tuple[str, int, int]]:
    """(label, first octave, end octave) of the distance bins [0, L), [L, 2L), ... [M/2·L, M·L) in octaves."""
    first_past = int(math.log2(cfg["length"])) + 1  # octave of t ∈ [L, 2L)
    edges = [0, first_past] + [first_past + k for k in range(1, int(math.log2(cfg["multiples"][-1])) + 1)]
    labels = ["[0, L)"] + [f"[{2 ** k}L, {2 ** (k + 1)}L)".replace("[1L", "[L")
                           for k in range(len(edges) - 2)]
    return [(label, a, b) for label, a, b in zip(labels, edges, edges[1:])]


def loss_excess(cfg: dict, variant: str, seed: int) -> float | None:
    """The model's mean loss excess over 1× windows at positions [M/2·L, M·L), from its length evaluation
    (length_generalisation.py), when it has one of the same windows and text."""
    from length_generalisation import binned, cached_evaluation, position_curves

    cached = cached_evaluation(cfg, variant, seed)
    if cached is None:
        return None
    return binned(position_curves(cached[1], cfg["multiples"][-1])["excess"], cfg["length"])[-1]


def profile_variant(cfg: dict, variant: str, seed: int) -> dict:
    found = profile_model(lm.train_variant(cfg, variant, seed), cfg)
    return {**found, "excess": loss_excess(cfg, variant, seed)}


def weight_tables(profiles: dict, cfg: dict) -> list[str]:
    """Per model: the long windows' attention weight by distance bin (mean over layers and heads) beside the model's
    loss excess, then its weight past L per layer."""
    bins, m = distance_bins(cfg), cfg["multiples"][-1]
    lines = [f"Attention weight by the distance of the key, for queries at positions [{m // 2}L, {m}L) of the {m}L "
             "windows (mean over layers and heads; each query's weights sum to 1), beside the model's loss there "
             f"minus the same tokens' loss in their 1× windows (`length_eval/length.json` of "
             "length_generalisation.py; – where that model has none).", "",
             "| model | " + " | ".join(label for label, _, _ in bins) + f" | past L | loss excess, [{m // 2}L, {m}L) |",
             "|---|" + "---|" * (len(bins) + 2)]
    for variant, by_seed in profiles.items():
        for seed, found in by_seed.items():
            mass = found["long"]["mass"]
            cells = [mass[:, :, a:b].sum(-1).mean() for _, a, b in bins]
            excess = "–" if found["excess"] is None else f"{found['excess']:+.3f}"
            lines.append(f"| {variant}, seed {seed} | " + " | ".join(f"{c:.3f}" for c in cells)
                         + f" | {sum(cells[1:]):.3f} | {excess} |")
    first_past = bins[1][1]
    layers = next(found for by_seed in profiles.values() for found in by_seed.values())["long"]["mass"].shape[0]
    lines += ["", "The weight past L by layer (mean over heads), same queries:", "",
              "| model | " + " | ".join(f"layer {i}" for i in range(layers)) + " |", "|---|" + "---|" * layers]
    for variant, by_seed in profiles.items():
        for seed, found in by_seed.items():
            per_layer = found["long"]["mass"][:, :, first_past:].sum(-1).mean(-1)
            lines.append(f"| {variant}, seed {seed} | " + " | ".join(f"{v:.3f}" for v in per_layer) + " |")
    return lines


def logit_spans(cfg: dict) -> list[tuple[str, str, int]]:
    """(windows, column label, octave) of the columns of a table of raw logits by distance: the 1× windows' queries
    at [L/2, L), then the long windows' queries there and in each distance bin past L (one octave each)."""
    bins, m = distance_bins(cfg), cfg["multiples"][-1]
    edge = bins[1][1] - 1  # octave [L/2, L)
    return [("short", "1×, [L/2, L)", edge), ("long", f"{m}L, [L/2, L)", edge),
            *(("long", f"{m}L, {label}", first) for label, first, _ in bins[1:])]


def logit_table(profiles: dict, cfg: dict) -> list[str]:
    """Per model, the raw logits S by distance (the scale-invariant transform's premise: mean 0, spread 1): the 1×
    windows' queries at the farthest octave they saw, then the long windows' queries at that octave and at each
    distance bin past L (one octave each)."""
    m, spans = cfg["multiples"][-1], logit_spans(cfg)
    lines = ["The raw logits S (after QK-norm and 1/√d_h, before any transform; LogN's query scale included) by "
             "distance: their mean μ and spread σ over the keys of each layer and head at that distance, averaged "
             "over layers and heads, as μ, σ (the largest head's σ in brackets). First for the 1× windows' queries "
             f"at [L/2, L) (what training saw), then for the {m}L windows' queries above.", "",
             "| model | " + " | ".join(label for _, label, _ in spans) + " |", "|---|" + "---|" * len(spans)]
    for variant, by_seed in profiles.items():
        for seed, found in by_seed.items():
            cells = []
            for windows, _, octave in spans:
                mean, spread = found[windows]["mean"][:, :, octave], found[windows]["spread"][:, :, octave]
                cells.append(f"{mean.mean():+.2f}, {spread.mean():.2f} ({spread.max():.2f})")
            lines.append(f"| {variant}, seed {seed} | " + " | ".join(cells) + " |")
    return lines


def plot(profiles: dict, cfg: dict, path: pathlib.Path) -> None:
    """Left: attention weight per octave of distance (mean over seeds, layers, heads), long windows solid, 1×
    windows dashed. Middle and right: the mean μ and spread σ of the raw logits per octave in the long windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    octaves = octave_count(cfg["multiples"][-1] * cfg["length"])
    centres = np.array([0.5] + [1.5 * 2 ** (k - 1) for k in range(1, octaves)])  # t = 0 drawn at 0.5
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    for variant, by_seed in profiles.items():
        long = np.mean([f["long"]["mass"].mean(axis=(0, 1)) for f in by_seed.values()], axis=0)
        short = np.mean([f["short"]["mass"].mean(axis=(0, 1)) for f in by_seed.values()], axis=0)
        line, = left.plot(centres, long, ".-", label=variant)
        reach = octave_count(cfg["length"])
        left.plot(centres[:reach], short[:reach], "--", color=line.get_color(), linewidth=1)
        mean = np.mean([f["long"]["mean"].mean(axis=(0, 1)) for f in by_seed.values()], axis=0)
        middle.plot(centres[1:], mean[1:], ".-", color=line.get_color(), label=variant)
        spread = np.mean([f["long"]["spread"].mean(axis=(0, 1)) for f in by_seed.values()], axis=0)
        right.plot(centres[1:], spread[1:], ".-", color=line.get_color(), label=variant)
    for axis in (left, middle, right):
        axis.axvline(cfg["length"], color="grey", linestyle="--", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    m = cfg["multiples"][-1]
    left.set(xlabel="distance t of the key (octaves)", ylabel="attention weight per octave",
             title=f"solid: {m}L windows; dashed: 1× windows")
    figure.suptitle(f"queries at [{m // 2}L, {m}L) of {m}L windows and [L/2, L) of 1× windows, L={cfg['length']}; "
                    "mean over layers, heads and seeds", fontsize=10)
    middle.axhline(0.0, color="grey", linewidth=1)
    middle.set(xlabel="distance t of the key (octaves)", ylabel="mean μ of the raw logits S",
               title="the scale-invariant premise: μ = 0")
    right.axhline(1.0, color="grey", linewidth=1)
    right.set(xlabel="distance t of the key (octaves)", ylabel="spread σ of the raw logits S",
              title="the scale-invariant premise: σ = 1")
    left.legend(fontsize=8)
    rf.save_figure(figure, path)


def section_head(cfg: dict, title: str, command: str, how: str) -> list[str]:
    """The opening lines of a section about the length models' attention: title (with the run's seeds and own
    settings), command, machine, which checkpoints ran `how` on which windows, and the settings changed."""
    return [f"## Length generalisation: {title}{lm.title_suffix(cfg)}{lm.own_section_suffix(cfg)}", "",
            f"`{command}`", "", rf.machine_line(cfg["torch_device"]), "",
            f"The checkpoints of `length_generalisation.py` in `{cfg['output_dir']}` ({cfg['arch']}, "
            f"d={cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads, trained at L={cfg['length']} for "
            f"{cfg['steps']} steps), {how} {cfg['windows']} windows of {cfg['multiples'][-1]}L tokens of "
            f"`{lm.shown(cfg, cfg['eval_file'])}` (the length evaluation's text and windows), and on the same tokens "
            "cut into 1× windows.", "",
            study.changed_settings(cfg, {**lm.SIZES[cfg["size"]], **lm.DEFAULTS}, cfg["size"]), ""]


def section(profiles: dict, cfg: dict, command: str, png_link: str) -> str:
    return "\n".join([*section_head(cfg, "where the attention goes past L", command,
                                    "run on the eager attention path over"),
                      *weight_tables(profiles, cfg), "", *logit_table(profiles, cfg), "",
                      f"![attention weight and logit spread by distance]({png_link})"])


def resolve(parser: argparse.ArgumentParser, argv) -> dict:
    """The length models' settings, checked for a profile by distance: L a power of two (octaves start at L) and
    running text to evaluate on."""
    cfg = lm.resolve(parser.parse_args(argv))
    if cfg["length"] & (cfg["length"] - 1):
        raise SystemExit(f"--length {cfg['length']}: expected a power of two (the distance octaves start at L)")
    if not cfg["eval_file"]:
        raise SystemExit("--eval-corpus blocks: expected 'heldout' or a text file (running text, so that distance "
                         "past L is context)")
    return cfg


def publish(found, cfg: dict, script: str | pathlib.Path, argv, write_section, draw) -> None:
    """Print the section `write_section(found, cfg, command, png link)`; unless --no-write, draw its plot and write it
    into the results file."""
    png = pathlib.Path(cfg["plots_dir"]) / f"{cfg['section']}.png"
    text = write_section(found, cfg, rf.command_line(script, argv), rf.plot_link(cfg["results"], png))
    print(text)
    if not cfg["no_write"]:
        draw(found, cfg, png)
        rf.update_section(cfg["section"], text, cfg["results"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    lm.common_arguments(parser, HERE)
    parser.add_argument("--section", default="length_attention", help="the section to write, and its plot's file name")
    cfg = resolve(parser, argv)
    found = lm.for_each_model(cfg, profile_variant)
    profiles = {variant: dict(zip(lm.seed_ids(cfg), runs)) for variant, runs in found.items()}
    publish(profiles, cfg, __file__, argv, section, plot)


if __name__ == "__main__":
    main()
