#!/usr/bin/env python
"""Which rotary pairs make the distance penalty of the length models, and what each does past the training length.

The raw logit S = s·q·k (s the softmax scale, q and k after the rotation) is a sum over the head's channel pairs:
pair c (channels c and c + r/2, turning at ω_c radians per token) adds s·(q_c·k_c + q_{c+r/2}·k_{c+r/2}), and the
channels that do not turn add the rest. bench/length_attention.py measured S's mean by distance of the key; this
script splits that mean into its pairs (the parts add up to it exactly), for the queries the profile uses:
positions [M/2·L, M·L) of M·L windows and [L/2, L) of 1× windows. A pair's part at distance t follows cos(ω_c·t + φ)
for keys whose content does not depend on t; a pair that turns less than half a turn within L can lower S
steadily over [0, L) (a distance penalty) but rises again once ω_c·t passes π.

Then the test of cause: each rotating pair is dropped in turn (its two query channels set to zero after the
rotation, in every layer and head, so that it adds nothing to S) and the model's length evaluation is run again
on the same windows (`length_generalisation` of the library, multiples 1 and M): its loss in the 1× windows, and its
loss excess over them by position in the M·L windows ([L, 2L), [2L, 4L), ...). A pair whose part rises past L and
whose removal cuts the excess there is a cause of the growth; its cost within L is the 1× loss.

    python bench/length_rotary_pairs.py --jobs 2 --threads 1 --seeds 2 --variants p-RoPE "scale-invariant p-RoPE" \\
        --output-dir runs/length_default   # four default models, evaluated only (~13 min per model on one core)
    python bench/length_rotary_pairs.py --size quick --variants "scale-invariant p-RoPE"   # minutes

`--drop all` also drops the channels that do not turn, two at a time, as a control: dropping any pair takes its
share of S's spread away, and a smaller spread alone weighs the far keys less (docs/attention.md).

The models are trained first when missing (the checkpoints and arguments of bench/length_generalisation.py).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import pathlib
import sys

import numpy as np

import length_models as lm
import results_file as rf
from length_attention import logit_spans, octave_count, publish, resolve, section_head
from length_generalisation import binned, position_bin_labels

STATIC = "ω = 0"  # the label of the channels that do not turn


def components(config) -> tuple[list[str], np.ndarray]:
    """(labels, membership [d_h, parts]) for a model's config: one part per rotating pair (channels c and c + r/2 with
    ω_c > 0), labelled by its frequency ("1/141": 1/141 radians per token), then one part for every channel that does
    not turn. The frequencies are the library's own (`compute_inv_freq`, what the model's rotary table holds)."""
    from modeling_angpt.rotary_angpt import compute_inv_freq

    inv_freq = compute_inv_freq(config)[0].double().numpy()
    half, head_dim = len(inv_freq), config.head_dim
    rotating = [c for c in range(half) if inv_freq[c] > 0]
    membership = np.zeros((head_dim, len(rotating) + 1))
    for part, c in enumerate(rotating):
        membership[[c, c + half], part] = 1.0
    membership[:, -1] = 1.0 - membership[:, :-1].sum(1)
    labels = [("1" if inv_freq[c] == 1 else f"1/{1 / inv_freq[c]:.0f}") for c in rotating] + [STATIC]
    return labels, membership


def static_pairs(membership: np.ndarray) -> list[tuple[str, list[int]]]:
    """(label, channels) of the channels that do not turn, two at a time (the i-th with the i-th of their second
    half: the partners the rotation would give them). Dropped like a turning pair, one carries no position: the
    control for what dropping any pair does."""
    channels = [int(c) for c in np.flatnonzero(membership[:, -1])]
    half = len(channels) // 2
    return [(f"{STATIC}: channels {channels[i]}, {channels[i + half]}", [channels[i], channels[i + half]])
            for i in range(half)]


class PairRecorder:
    """Per layer, head, part and distance octave (0: t = 0; k ≥ 1: t ∈ [2^(k−1), 2^k)): the summed part of the raw
    logits over the visible keys of the recorded queries, and the number of those keys. The keys of an octave are
    a contiguous range of positions, so their sum comes from prefix sums of k: no [queries, keys] matrix is formed."""

    def __init__(self, layers: int, heads: int, membership: np.ndarray, octaves: int, rows: slice):
        self.total = np.zeros((layers, heads, membership.shape[1], octaves))
        self.count = np.zeros((layers, octaves))
        self.membership, self.rows, self.layer = membership, rows, 0

    def record(self, query, key, scaling: float) -> None:
        """One causal layer's query [b, h, T, d_h] and key [b, h_kv, T, d_h], as the attention call gets them."""
        for window in range(query.shape[0]):
            self._record(query[window], key[window], scaling)
        self.layer += 1

    def _record(self, query, key, scaling: float) -> None:
        import torch

        q = query[:, self.rows].double()  # [h, r, d]
        k = key.double().repeat_interleave(query.shape[0] // key.shape[0], dim=0)  # [h, T, d]
        prefix = torch.cat([torch.zeros_like(k[:, :1]), k.cumsum(1)], dim=1)  # prefix[:, n] = Σ_{j<n} k_j
        position = torch.arange(self.rows.start, self.rows.stop, device=q.device)
        membership = torch.as_tensor(self.membership, device=q.device)
        layer = self.layer % self.total.shape[0]
        for octave in range(self.total.shape[-1]):
            near, far = (0, 0) if octave == 0 else (2 ** (octave - 1), 2 ** octave - 1)  # t ∈ [near, far]
            first, last = (position - far).clamp(min=0), position - near  # keys j ∈ [first, last], none if last < 0
            stop = (last + 1).clamp(min=0)
            keys = prefix[:, stop] - prefix[:, first.clamp(max=stop)]  # [h, r, d]: Σ of the octave's keys
            self.total[layer, :, :, octave] += ((q * keys).sum(1) * scaling @ membership).cpu().numpy()
            self.count[layer, octave] += float((stop - first).clamp(min=0).sum())

    def mean(self) -> np.ndarray:
        """Mean part of S per layer, head, part and octave."""
        with np.errstate(invalid="ignore"):
            return self.total / self.count[:, None, None, :]


@contextlib.contextmanager
def attention_calls(wrap):
    """Route the decoder's attention calls through `wrap(attend)`: the one place where q and k are seen after the
    rotation and LogN's query scale (the test suite's oracle for bench/length_attention.py taps the same call)."""
    import modeling_angpt.decoder_angpt as decoder
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = decoder.get_attention_function

    def wrapped(config):
        attend = original(config) or ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation,
                                                                           decoder.eager_attention_forward)
        return wrap(attend)

    decoder.get_attention_function = wrapped
    try:
        yield
    finally:
        decoder.get_attention_function = original


def recording(recorders: dict):
    """A wrap for attention_calls: hands each call's q and k to the recorder for its window length."""
    def wrap(attend):
        def run(module, query, key, value, attention_mask, scaling, **kwargs):
            recorder = recorders.get(query.shape[-2])
            if recorder is not None:
                recorder.record(query, key, scaling)
            return attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        return run
    return wrap


def dropping(channels: list[int]):
    """A wrap for attention_calls: the query's `channels` set to zero, so their pair adds nothing to S."""
    def wrap(attend):
        def run(module, query, key, value, attention_mask, scaling, **kwargs):
            query = query.clone()
            query[..., channels] = 0
            return attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        return run
    return wrap


def losses(model, blocks: np.ndarray, cfg: dict) -> dict:
    """The length evaluation of the library on `blocks` (multiples 1 and M): the 1× loss, and the mean excess of
    the M·L windows over the 1× windows per bin of positions [L, 2L), [2L, 4L), ..."""
    from modeling_angpt.evaluation.length import length_generalisation

    multiple = cfg["multiples"][-1]
    report = length_generalisation(model, blocks, cfg["length"], (1, multiple), windows=cfg["windows"])
    return {"single": report.loss(1), "excess": binned(report.position_excess[multiple], cfg["length"])[1:]}


def analyse_variant(cfg: dict, variant: str, seed: int) -> dict:
    """One model's parts of S by octave ("long", "short") and its losses intact and with each pair of --drop dropped,
    kept beside the checkpoint (rotary_pairs.json) as each is done, so that a stopped run goes on where it was and a
    finished one is only read."""
    from transformers import AutoConfig

    checkpoint = lm.train_variant(cfg, variant, seed)
    path = lm.checkpoint_dir(cfg, variant, seed) / "rotary_pairs.json"
    setting = {"windows": cfg["windows"], "eval": str(cfg["eval_file"])}
    found = json.loads(path.read_text()) if path.is_file() else {}
    if found.get("setting") != setting:  # made with other windows or text: measured again
        found = {"setting": setting, "dropped": {}}
    labels, membership = components(AutoConfig.from_pretrained(checkpoint))
    drops = [(label, [int(c) for c in np.flatnonzero(membership[:, part])]) for part, label in enumerate(labels[:-1])]
    drops += static_pairs(membership) if cfg["drop"] == "all" else []
    if "intact" not in found or any(label not in found["dropped"] for label, _ in drops):
        measure(cfg, f"{variant}, seed {seed}", checkpoint, (labels, membership), drops, found, path)
    return {**found, "long": np.asarray(found["long"]), "short": np.asarray(found["short"]),
            "dropped": {label: found["dropped"][label] for label, _ in drops}}  # this run's, in order


def measure(cfg: dict, name: str, checkpoint: pathlib.Path, parts: tuple, drops: list, found: dict,
            path: pathlib.Path) -> None:
    """Fill `found` with what it lacks (the intact model's `parts` of S and losses, the losses with each of `drops`
    dropped), writing it to `path` after each."""
    from modeling_angpt.evaluation.length import contiguous_blocks

    model, tokenizer = lm.load(checkpoint, cfg["torch_device"])
    length, multiple = cfg["length"], cfg["multiples"][-1]
    blocks, _ = contiguous_blocks(pathlib.Path(cfg["eval_file"]), tokenizer, length)
    if len(blocks) < multiple:
        raise SystemExit(f"--eval-corpus {cfg['eval_file']}: fewer than {multiple} blocks of {length} tokens")
    if "intact" not in found:
        labels, membership = parts
        layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
        recorders = {multiple * length: PairRecorder(layers, heads, membership, octave_count(multiple * length),
                                                     slice(multiple * length // 2, multiple * length)),
                     length: PairRecorder(layers, heads, membership, octave_count(length), slice(length // 2, length))}
        with attention_calls(recording(recorders)):
            found["intact"] = losses(model, blocks, cfg)
        found.update(labels=labels, long=recorders[multiple * length].mean().tolist(),
                     short=recorders[length].mean().tolist())
        path.write_text(json.dumps(found))
        print(f"{name}: intact {found['intact']}", file=sys.stderr, flush=True)
    for label, channels in drops:
        if label not in found["dropped"]:
            with attention_calls(dropping(channels)):
                found["dropped"][label] = losses(model, blocks, cfg)
            path.write_text(json.dumps(found))
            print(f"{name}: pair {label} dropped {found['dropped'][label]}", file=sys.stderr, flush=True)


def parts_table(analyses: dict, cfg: dict) -> list[str]:
    """Per model and part: its mean part of S (over layers and heads) at the 1× windows' farthest octave, then at
    that octave and each distance bin past L for the long windows' queries; the last row adds them up."""
    m, spans = cfg["multiples"][-1], logit_spans(cfg)
    lines = ["The raw logit S split into its rotary pairs: each part's mean over the keys at that distance "
             "(mean over layers and heads), for the 1× windows' queries at [L/2, L) and the "
             f"{m}L windows' queries at [{m // 2}L, {m}L). A pair is named by its frequency in radians per token; "
             f"'{STATIC}' is every channel that does not turn; 'S' is their sum, S's mean in "
             "bench/length_attention.py.", "",
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


def ablation_table(analyses: dict, cfg: dict) -> list[str]:
    """Per model: the 1× loss and the excess by position bin, intact and with each pair of --drop dropped."""
    m = cfg["multiples"][-1]
    labels = position_bin_labels(m)[1:]  # the excess starts at L
    control = (f"; then, as a control, each pair of the channels that do not turn ('{STATIC}: channels a, b'), "
               "dropped the same way") if cfg["drop"] == "all" else ""
    lines = ["Each rotating pair dropped in turn (its query channels zeroed after the rotation in every layer and "
             f"head){control}: the loss on the 1× windows, and the loss excess of the {m}L windows over them by "
             "position (the length evaluation's windows and text; the first row of each model is the intact "
             "model).", "",
             "| model | dropped pair | loss, 1× | " + " | ".join(f"excess, {label}" for label in labels) + " |",
             "|---|---|---|" + "---|" * len(labels)]
    for variant, runs in analyses.items():
        for seed, run in zip(lm.seed_ids(cfg), runs):
            for name, found in [("none", run["intact"]), *run["dropped"].items()]:
                excess = " | ".join("–" if math.isnan(v) else f"{v:+.3f}" for v in found["excess"])
                lines.append(f"| {variant}, seed {seed} | {name} | {found['single']:.3f} | {excess} |")
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
                      *parts_table(analyses, cfg), "", *ablation_table(analyses, cfg), "",
                      f"![each rotary pair's part of the raw logit by distance]({png_link})"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    lm.common_arguments(parser)
    parser.add_argument("--section", default="length_rotary_pairs", help="the RESULTS.md section to write")
    parser.add_argument("--drop", choices=("turning", "all"), default="turning",
                        help="the pairs dropped one at a time: the turning ones, or all (the channels that do not "
                             "turn too, two at a time, as a control)")
    cfg = resolve(parser, argv)
    without = [v for v in cfg["variants"] if lm.VARIANTS[v]["rope_parameters"]["rope_type"] == "none"]
    if without:
        raise SystemExit(f"--variants {' '.join(without)}: expected variants with rotary pairs (not NoPE or ALiBi)")
    publish(lm.for_each_model(cfg, analyse_variant), cfg, "length_rotary_pairs.py", argv, section, plot)


if __name__ == "__main__":
    main()
