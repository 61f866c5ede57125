#!/usr/bin/env python
"""Needle retrieval (scale-invariant paper, Table 2): the models of the length-generalisation experiment, each
fine-tuned with the needle recipe at its training length L, then asked for three needles at L and 4L.

Paper (162M, fine-tuned 300 steps at 4k, tested at 64k): scale-invariant p-RoPE 0.969, LogN+p-RoPE 0.939, every
other variant ≤ 0.06; at 4k all are ≥ 0.9. Accuracy counts a needle only when city and number are both right.

The base models are the length-generalisation checkpoints (OUTPUT_DIR of that script, trained here first when
missing, with the same size options). Fine-tuning = `angpt train` on the needle recipe (--recipe: dataset_kind
needle, loss on the answer only) with init_from = the base checkpoint; evaluation = the needle evaluator
(`angpt eval --suite needle`) on haystacks built from held-out text. Beside the accuracy, the section reports
diagnostics per model: numbers recalled and cities named, answers that keep the answer format, and from the
fine-tuning's log its validation loss and the step at which its training loss left the plateau; and at each length
above L, accuracy and numbers recalled by the needle's distance from the question (within L, L to 2L, ...).

    python experiments/needle/needle.py --jobs 2 --threads 1   # the length models, 300 fine-tuning steps
    python experiments/needle/needle.py --size quick           # minutes
    python experiments/needle/needle.py --device               # on a GPU, the device-size models
    python experiments/needle/needle.py --jobs 2 --threads 1 --split-digits --output-dir runs/length_digits
                                              # base models whose tokenizer splits digits (own section)
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
# the length-generalisation models, the experiments' helpers and bench's
sys.path[:0] = [str(HERE.parent / "length_generalisation"), str(HERE.parent / "common"), str(HERE.parents[1] / "bench")]

import length_models as lm  # noqa: E402
import results_file as rf  # noqa: E402
import study  # noqa: E402

# Fine-tuning at the pretraining learning rate, as the paper does (the recipe's schedule: 10 % warm-up, linear decay).
FINETUNE = {"default": dict(ft_steps=300, ft_batch=8, examples=50, multiples=[1, 4]),
            "quick": dict(ft_steps=60, ft_batch=8, examples=10, multiples=[1, 4]),
            "device": dict(ft_steps=300, ft_batch=32, examples=100, multiples=[1, 4])}


def finetune_dir(cfg: dict, variant: str, seed: int) -> pathlib.Path:
    """Where a model's needle fine-tuning, its training log and its evaluation live."""
    return lm.checkpoint_dir(cfg, variant, seed) / "needle_finetune"


def finetune(cfg: dict, variant: str, seed: int, base: pathlib.Path) -> pathlib.Path:
    """Fine-tune one base checkpoint with the needle recipe (or reuse a finished fine-tuning of the same recipe)."""
    from modeling_angpt.training import load_recipe

    out = finetune_dir(cfg, variant, seed)
    overrides = [f"init_from={base}", f"dataset={cfg['dataset']}", f"block_size={cfg['length']}",
                 f"tokenizer_vocab_size={cfg['vocab']}", f"max_steps={cfg['ft_steps']}",
                 f"per_device_train_batch_size={cfg['ft_batch']}", f"learning_rate={cfg['ft_lr']}", f"seed={seed}",
                 f"output_dir={out}", f"eval_steps={max(1, cfg['ft_steps'] // 3)}", "eval_max_batches=2",
                 f"save_steps={cfg['ft_save_steps']}", f"save_total_limit={0 if cfg['ft_save_steps'] else 1}",
                 "disable_tqdm=true", "report_to=[jsonl]", "logging_steps=20"]
    return lm.trained(load_recipe(cfg["needle_recipe"], overrides))


def evaluate(cfg: dict, variant: str, seed: int, checkpoint: pathlib.Path) -> dict:
    """{multiple: accuracy} from the needle evaluator, cached beside the fine-tuned checkpoint."""
    from modeling_angpt.evaluation import EvalOptions
    from modeling_angpt.evaluation.needle import run_suite

    out = checkpoint.parent / "needle_eval"
    cached = out / "summary.json"
    if cached.is_file() and json.loads(cached.read_text()).get("examples") == cfg["examples"]:
        return {int(k): v for k, v in json.loads(cached.read_text())["acc"].items()}
    model, tokenizer = lm.load(checkpoint, cfg["torch_device"])
    options = EvalOptions(lengths=",".join(map(str, cfg["multiples"])), limit=cfg["examples"], seed=seed,
                          log_samples=True, train_length=cfg["length"])
    metrics = run_suite(model, tokenizer, checkpoint, options, out)
    accuracy = {m: metrics[f"needle_x{m}"]["needles_found"] for m in cfg["multiples"]}
    cached.write_text(json.dumps({"examples": cfg["examples"], "acc": accuracy}))
    return accuracy


def logged_samples(cfg: dict, variant: str, seed: int) -> dict:
    """{"needle_x<multiple>": [sample, ...]} from the evaluator's report of one model ({} when it has none)."""
    report = finetune_dir(cfg, variant, seed) / "needle_eval" / "needle.json"
    return json.loads(report.read_text()).get("samples", {}) if report.is_file() else {}


def target_pairs(sample: dict) -> list[list[str]]:
    """The needles of a logged sample as [city, number] pairs, in their order in the haystack."""
    return [pair.split("=") for pair in sample["target"].split(";")]


def digit_runs(line: str) -> set:
    """The whole runs of digits in an answer line: a needle's number counts as recalled when it is one of them."""
    return set(re.findall(r"\d+", line))


def recall(cfg: dict, variant: str, seed: int) -> dict:
    """{"numbers", "cities", "format"}: {multiple: share} from the evaluator's logged samples. Numbers: the share
    of needles whose 7-digit number appears in the answer line as a whole digit run, whatever city it is paired
    with; cities: the share whose city is named in it (`City=`); format: the share of answers whose line is exactly
    as many `City=number` pairs as there are needles, numbers as long as the needles'. Diagnostics, not the
    paper's metric: they tell retrieval of the numbers and of the cities apart from retrieval of the pairs (the
    strict accuracy needs both), and a model that has lost the answer format from one that fills it wrongly."""
    samples = logged_samples(cfg, variant, seed)
    shares = {"numbers": {}, "cities": {}, "format": {}}
    for m in cfg["multiples"]:
        found, needles, answers = {"numbers": 0, "cities": 0, "format": 0}, 0, 0
        for sample in samples.get(f"needle_x{m}", []):
            line = sample["answer"].split("\n")[0]
            runs = digit_runs(line)
            named = {name.strip() for name in re.findall(r"([^;=\d]+)=", line)}
            pairs = target_pairs(sample)
            found["numbers"] += sum(number in runs for _, number in pairs)
            found["cities"] += sum(city in named for city, _ in pairs)
            parts = line.strip().split(";")
            found["format"] += len(parts) == len(pairs) and all(
                re.fullmatch(rf"[^;=\d]+=\d{{{len(pairs[0][1])}}}", part) for part in parts)
            needles, answers = needles + len(pairs), answers + 1
        for kind, count in found.items():
            total = answers if kind == "format" else needles
            shares[kind][m] = count / total if total else float("nan")
    return shares


def distance_bands(multiple: int) -> list[tuple[int, int]]:
    """Bands of a needle's distance from the question in units of L, doubling: (0, 1], (1, 2], (2, 4], … up to
    `multiple`. The first band is the distance a model fine-tuned at L has seen between a needle and the question."""
    edges = [0, 1]
    while edges[-1] < multiple:
        edges.append(min(2 * edges[-1], multiple))
    return list(zip(edges, edges[1:]))


def band_label(band: tuple[int, int]) -> str:
    return f"{band[0]}–{band[1]}L away" if band[0] else f"≤ {band[1]}L away"


def pooled(by_seed: list, multiple: int, band: tuple[int, int]) -> list[int]:
    """[needles, found, numbers recalled] of one band, summed over the seeds that were evaluated at `multiple`."""
    return [sum(d[multiple][band][k] for d in by_seed if multiple in d) for k in range(3)]


def by_distance(cfg: dict, variant: str, seed: int) -> dict:
    """{multiple: {band: [needles, found, numbers recalled]}} for each multiple above 1, from the logged samples.
    A needle's distance from the question is the share of the haystack after it, (1 − depth) × multiple, in units
    of L (depth: the share of the filler's characters before it, so the distance in tokens is approximate). Found:
    city and number right, as the accuracy counts it (needle_hits); numbers recalled as in `recall`."""
    from modeling_angpt.tasks.needle import needle_hits

    samples, counts = logged_samples(cfg, variant, seed), {}
    for m in (m for m in cfg["multiples"] if m > 1):
        bands = counts[m] = {band: [0, 0, 0] for band in distance_bands(m)}
        for sample in samples.get(f"needle_x{m}", []):
            pairs = target_pairs(sample)
            hits = needle_hits(sample["answer"], [c for c, _ in pairs], [n for _, n in pairs])
            runs = digit_runs(sample["answer"].split("\n")[0])
            for (_, number), hit, depth in zip(pairs, hits, sample.get("depths", [])):
                distance = (1 - depth) * m
                band = next(b for b in bands if distance <= b[1])
                bands[band][0] += 1
                bands[band][1] += hit
                bands[band][2] += number in runs
    return counts


def distance_table(distances: dict, cfg: dict) -> list[str]:
    """Accuracy and numbers recalled at each length above L by the needle's distance from the question, pooled
    over seeds: does retrieval fail with the distance or with the length of the context?"""
    columns = [(m, band) for m in cfg["multiples"] if m > 1 for band in distance_bands(m)]
    if not columns:
        return []
    lines = ["By the needle's distance from the question (the share of the haystack after it, in units of L; the "
             "first band is what fine-tuning at L showed the model): accuracy · numbers recalled (needles), pooled "
             "over seeds.", "",
             "| variant | " + " | ".join(f"{m}L, {band_label(band)}" for m, band in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for variant, by_seed in distances.items():
        cells = []
        for m, band in columns:
            needles, found, numbers = pooled(by_seed, m, band)
            cells.append(f"{found / needles:.2f} · {numbers / needles:.2f} ({needles})" if needles else "–")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


# A fine-tuning has "left the plateau" at its first logged step with training loss below this. On the plateau the
# answer loss sits at 1.2-1.6 (the model writes the answer format with made-up numbers); once it retrieves, the
# loss is at 0.05 or less, and at a rate near the peak the fall between takes about 100 steps, so any threshold in
# between finds about the same step (a fall that starts as the rate decays to zero can take several hundred).
PLATEAU_EXIT_LOSS = 0.15


def finetune_curve(cfg: dict, variant: str, seed: int) -> dict:
    """The fine-tuning's loss curve from its `metrics.jsonl`: {"val": {step: validation loss}, "exit": (step, sum of
    the learning rates up to it) when the training loss left the plateau (PLATEAU_EXIT_LOSS) or None, "lowest":
    (lowest logged training loss, its step)}. Each logged rate stands for the steps since the previous log, so
    the sum is the area under the schedule to within one logging interval (a whole run sums to about
    peak lr × steps / 2 under the recipe's warm-up and linear decay)."""
    log = finetune_dir(cfg, variant, seed) / "metrics.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
    curve = {"val": {r["step"]: r["val_loss"] for r in rows if "val_loss" in r and r["step"] > 0},
             "exit": None, "lowest": None}
    area, previous = 0.0, 0
    for row in (r for r in rows if "loss" in r):
        area, previous = area + row["lr"] * (row["step"] - previous), row["step"]
        if curve["lowest"] is None or row["loss"] < curve["lowest"][0]:
            curve["lowest"] = (row["loss"], row["step"])
        if curve["exit"] is None and row["loss"] < PLATEAU_EXIT_LOSS:
            curve["exit"] = (row["step"], area)
    return curve


def curve_table(curves: dict, recalls: dict, cfg: dict) -> list[str]:
    """One row per fine-tuned model: validation loss at the evaluation steps, when it left the plateau, and the
    share of its answers in the answer format at each length."""
    ms = cfg["multiples"]
    steps = sorted({step for by_seed in curves.values() for curve in by_seed for step in curve["val"]})
    lines = ["Per model: the fine-tuning's validation loss (answer tokens), the first logged step with training loss "
             f"below {PLATEAU_EXIT_LOSS:g} (it has left the plateau where it writes the format with made-up numbers) "
             "with the sum of the learning rates up to that step, from `needle_finetune/metrics.jsonl`; and the "
             "share of answers that keep the format (as many `City=number` pairs as needles), from the logged samples.",
             "", "| variant | seed | validation loss at step " + " / ".join(map(str, steps))
             + f" | left the plateau: step (lr sum) | answers in the format at {' / '.join(f'{m}L' for m in ms)} |",
             "|---|---|---|---|---|"]
    for variant, by_seed in curves.items():
        for seed, curve, shares in zip(lm.seed_ids(cfg), by_seed, recalls[variant]):
            val = " / ".join(f"{curve['val'][s]:.2f}" if s in curve["val"] else "–" for s in steps)
            if curve["exit"]:
                left = f"step {curve['exit'][0]} ({curve['exit'][1]:.2f})"
            else:
                left = "not reached" + (f" (lowest {curve['lowest'][0]:.2f} at step {curve['lowest'][1]})"
                                        if curve["lowest"] else "")
            shape = " / ".join(f"{shares['format'][m]:.0%}" for m in ms)
            lines.append(f"| {variant} | {seed} | {val} | {left} | {shape} |")
    return lines


def section(results: dict, recalls: dict, curves: dict, distances: dict, cfg: dict, command: str,
            png_link: str) -> str:
    ms = cfg["multiples"]
    lines = ["## Needle retrieval after fine-tuning at L: accuracy at L and 4L (scale-invariant paper, Table 2)"
             + lm.title_suffix(cfg), "",
             f"`{command}`", "", rf.machine_line(cfg["torch_device"]), "",
             study.corpus_line(cfg.get("dataset_given", cfg["dataset"])), "",
             f"Base models: the length-generalisation models ({cfg['arch']}, d={cfg['hidden']}, {cfg['layers']} layers, "
             f"{lm.tokenizer_text(cfg)}, trained at L={cfg['length']} for {cfg['steps']} steps; seeds {lm.seed_ids(cfg)}). "
             f"Each fine-tuned {cfg['ft_steps']} steps × "
             f"{cfg['ft_batch']} needle examples of L tokens at lr {cfg['ft_lr']:g} (`{pathlib.Path(cfg['needle_recipe']).name}`: "
             "loss on the answer only), then evaluated by `modeling_angpt.evaluation.needle.run_suite` on "
             f"{cfg['examples']} held-out haystacks per length, three needles each, greedy decoding; accuracy = share "
             "of needles with city and number right. Paper at 64k after fine-tuning at 4k: scale-invariant p-RoPE "
             "0.969, LogN+p-RoPE 0.939, the others ≤ 0.06.", "",
             study.changed_settings(cfg, {**lm.SIZES[cfg["size"]], **lm.DEFAULTS, **FINETUNE[cfg["size"]],
                                       "ft_lr": lm.SIZES[cfg["size"]]["lr"]}, cfg["size"]), "",
             "| variant | " + " | ".join(f"accuracy at {m}L ({m * cfg['length']})" for m in ms) + " | "
             + " | ".join(f"numbers recalled at {m}L" for m in ms) + " | "
             + " | ".join(f"cities named at {m}L" for m in ms) + " |",
             "|---|" + "---|" * 3 * len(ms)]
    for variant, by_seed in results.items():
        cells = [f"{statistics.fmean(r[m] for r in by_seed):.3f}" + (f" (seeds: {', '.join(f'{r[m]:.2f}' for r in by_seed)})"
                                                                       if len(by_seed) > 1 else "") for m in ms]
        for kind in ("numbers", "cities"):
            cells += [f"{statistics.fmean(r[kind][m] for r in recalls[variant]):.3f}" for m in ms]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    lines += ["", "Numbers recalled: share of needles whose number appears anywhere in the answer line, whatever "
              "city it is paired with. Cities named: share of needles whose city the answer line names (`City=`). "
              "Both from the evaluator's logged samples, means over seeds; diagnostics, not the paper's metric."]
    lines += ["", *curve_table(curves, recalls, cfg)]
    by_band = distance_table(distances, cfg)
    lines += ["", *by_band] if by_band else []
    lines += ["", f"![needle accuracy against length]({png_link})"]
    return "\n".join(lines)


def plot(results: dict, recalls: dict, distances: dict, cfg: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = cfg["multiples"]
    farthest = max(ms)
    figure, axes = plt.subplots(1, 3 if farthest > 1 else 2, figsize=(16 if farthest > 1 else 11, 3.8), sharey=True)
    width = 0.8 / len(ms)
    names = list(results)
    numbers = {n: [r["numbers"] for r in recalls[n]] for n in names}
    for axis, values, label in ((axes[0], results, "needle accuracy (city and number)"),
                                (axes[1], numbers, "numbers recalled (any city)")):
        for i, m in enumerate(ms):
            axis.bar([j + i * width for j in range(len(names))],
                     [statistics.fmean(r[m] for r in values[n]) for n in names], width,
                     label=f"{m}L ({m * cfg['length']})")
        axis.set_xticks([j + width * (len(ms) - 1) / 2 for j in range(len(names))], names, rotation=20, fontsize=8)
        axis.set(ylabel=label, ylim=(0, 1.05), title=f"fine-tuned at L={cfg['length']}: {label.split(' (')[0]}")
        axis.legend()
    if farthest > 1:
        plot_distances(axes[2], names, distances, farthest)
    rf.save_figure(figure, path)


def plot_distances(axis, names: list, distances: dict, multiple: int) -> None:
    """At the longest length, per variant and distance band (seeds pooled): numbers recalled as a light bar, the
    accuracy as a dark bar over it (a needle found has its number recalled, so the dark bar never overtops)."""
    bands = distance_bands(multiple)
    width = 0.8 / len(bands)
    for i, band in enumerate(bands):
        totals = [pooled(distances[n], multiple, band) for n in names]
        xs = [j + i * width for j in range(len(names))]
        recalled = axis.bar(xs, [t[2] / t[0] if t[0] else 0 for t in totals], width, alpha=0.35)
        axis.bar(xs, [t[1] / t[0] if t[0] else 0 for t in totals], width, color=recalled.patches[0].get_facecolor(),
                 alpha=1.0, label=band_label(band))
    axis.set_xticks([j + width * (len(bands) - 1) / 2 for j in range(len(names))], names, rotation=20, fontsize=8)
    axis.set(title=f"at {multiple}L by distance from the question: accuracy (dark), numbers recalled (light)",
             ylim=(0, 1.05))
    axis.title.set_fontsize(9)
    axis.legend(fontsize=8)


def finetune_and_evaluate(cfg: dict, variant: str, seed: int) -> dict:
    return evaluate(cfg, variant, seed, finetune(cfg, variant, seed, lm.train_variant(cfg, variant, seed)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    lm.common_arguments(parser, HERE)
    for name in ("ft_steps", "ft_batch", "examples"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help="override the size's value")
    parser.add_argument("--ft-save-steps", type=int, default=0,
                        help="keep a fine-tuning checkpoint every N steps (all kept; default 0: only the final model)")
    parser.add_argument("--ft-lr", type=float, help="fine-tuning learning rate (default: the pretraining one)")
    parser.add_argument("--needle-recipe", default=str(study.RECIPES / "needle_finetune.yaml"))
    args = parser.parse_args(argv)
    size = study.chosen_size(args)
    for key, value in FINETUNE[size].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    cfg = lm.resolve(args)
    cfg.setdefault("ft_lr", cfg["lr"])
    results = lm.for_each_model(cfg, finetune_and_evaluate)
    png = pathlib.Path(cfg["plots_dir"]) / f"{lm.section_name('needle', cfg)}.png"
    # the diagnostics of every model, from the evaluator's logged samples and training logs, for the tables and the plot
    recalls = {variant: [recall(cfg, variant, seed) for seed in lm.seed_ids(cfg)] for variant in results}
    curves = {variant: [finetune_curve(cfg, variant, seed) for seed in lm.seed_ids(cfg)] for variant in results}
    distances = {variant: [by_distance(cfg, variant, seed) for seed in lm.seed_ids(cfg)] for variant in results}
    text = section(results, recalls, curves, distances, cfg, rf.command_line(__file__, argv),
                   rf.plot_link(cfg["results"], png))
    print(text)
    if not cfg["no_write"]:
        plot(results, recalls, distances, cfg, png)
        rf.update_section(lm.section_name("needle", cfg), text, cfg["results"])


if __name__ == "__main__":
    main()
