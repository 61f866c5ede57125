"""Compare training runs: loss against tokens seen, tokens to a target loss, token ratios (docs/training.md,
"Comparing runs").

`compare(run_dirs, target_loss)` reads each run directory's recipe.json, model_config.json and metrics.jsonl
(nothing else, so unfinished and killed runs compare too) and refuses runs whose losses do not compare (another
tokenizer or another validation set); `compare_plot.compare_runs` also writes the figure and a Markdown table beside
it. The papers' claim, read off the user's own runs: how many tokens each run needs to reach a target
validation loss, and the ratio to the first run's tokens.

Tokens to reach the target: the first evaluation whose validation loss is at or below the target, linearly
interpolated with the evaluation before it (the loss is taken to fall linearly in tokens between two evaluations);
0 when the first evaluation is already there, None when no evaluation is. The default target is the highest final
validation loss among the runs, which every run reaches. Token ratio = the first run's tokens / this run's tokens:
above 1, this run needed fewer tokens than the first (the anGPT paper's "1.4× fewer tokens" is 1.4).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .recipe import ARCHITECTURE_DEFAULTS, Recipe
from .run_dir import MODEL_CONFIG_FILE, RECIPE_FILE
from .trackers import flat_config

# Which tokenizer a run used: named, or a byte-level BPE trained on its corpus (then the corpus keys decide it too).
TOKENIZER_KEYS = ("tokenizer", "tokenizer_vocab_size", "tokenizer_split_digits")
CORPUS_KEYS = ("dataset", "dataset_config", "dataset_split", "text_column", "max_corpus_chars")
# Which validation blocks a run's loss averages (data/blocks.py: the split and its order; data/loader.py: the scored count).
VALIDATION_KEYS = CORPUS_KEYS + ("streaming", "dataset_kind", "needle_examples", "block_size", "validation_fraction",
                                 "validation_blocks", "data_seed", "scored_validation_blocks")
# Keys that steer bookkeeping, not the training: never part of a label.
BOOKKEEPING_KEYS = ("output_dir", "data_cache_dir", "logging_steps", "eval_steps", "save_steps", "save_total_limit",
                    "report_to", "disable_tqdm", "dataloader_num_workers", "peak_flops", "architecture")


ARCHITECTURE_FILLED = frozenset(Recipe.ARCHITECTURE_KEYS.values())


class CompareError(ValueError):
    """Runs that cannot be compared, or a run directory that cannot be read."""


@dataclass
class RunCurves:
    path: Path
    architecture: str
    recipe: dict
    train: list = field(default_factory=list)  # (tokens, loss)
    val: list = field(default_factory=list)    # (tokens, loss)
    norms: list = field(default_factory=list)  # (tokens, {"norm/...": value})
    label: str = ""

    @property
    def final_val(self) -> float | None:
        return self.val[-1][1] if self.val else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CompareError(f"{path.parent} is not a training run directory (no {path.name})") from None
    except ValueError as error:
        raise CompareError(f"{path} is not valid JSON ({error})") from None


def _read_rows(metrics: Path) -> list[dict]:
    """metrics.jsonl's lines (read here, not with metrics.py, which imports torch); a last line cut short (a run
    killed while writing it) is left out."""
    lines = [line for line in metrics.read_text().splitlines() if line]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if number < len(lines):
                raise CompareError(f"{metrics}: line {number} is not valid JSON") from None
    return rows


def load_run(path: Path) -> RunCurves:
    """A run's curves against tokens seen. Evaluations log their token count (older runs: step × the tokens per step
    of their training lines)."""
    path = Path(path)
    recipe = {**Recipe().to_dict(), **_read_json(path / RECIPE_FILE)}  # keys newer than the run: their defaults
    config = _read_json(path / MODEL_CONFIG_FILE)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise CompareError(f"{path} has no metrics.jsonl (report_to must include jsonl to compare a run)")
    rows = _read_rows(metrics)
    per_step = next((r["tokens"] / r["step"] for r in rows if "loss" in r and r.get("step")), None)
    run = RunCurves(path, config.get("architecture") or recipe.get("architecture") or "?", recipe)
    for row in rows:
        tokens = row.get("tokens", row["step"] * per_step if per_step is not None else None)
        if tokens is None:
            continue
        if "loss" in row:
            run.train.append((tokens, row["loss"]))
        if "val_loss" in row:
            run.val.append((tokens, row["val_loss"]))
            norms = {k: v for k, v in row.items() if k.startswith("norm/")}
            if norms:
                run.norms.append((tokens, norms))
    if not run.val:
        raise CompareError(f"{path} has no validation loss in metrics.jsonl (eval_steps=0?); runs compare by it")
    return run


def _data_keys(recipe: dict) -> dict:
    values = dict(recipe)
    if values.get("eval_max_batches") is not None:  # the scored count, not how it is batched
        values["scored_validation_blocks"] = values["eval_max_batches"] * values["per_device_eval_batch_size"]
    else:
        values["scored_validation_blocks"] = None
    return values


def check_comparable(runs: list[RunCurves]) -> None:
    """Refuse, in one line, runs whose validation losses do not compare: another tokenizer (the loss is per token of
    a different vocabulary) or another validation set."""
    first = _data_keys(runs[0].recipe)
    for run in runs[1:]:
        other = _data_keys(run.recipe)
        trained_bpe = first.get("tokenizer") is None
        for what, keys in (("tokenizers", TOKENIZER_KEYS + (CORPUS_KEYS if trained_bpe else ())),
                           ("validation sets", VALIDATION_KEYS)):
            differ = [f"{k}: {first.get(k)!r} in {runs[0].path}, {other.get(k)!r} in {run.path}"
                      for k in keys if first.get(k) != other.get(k)]
            if differ:
                raise CompareError(f"runs with different {what} do not compare ({'; '.join(differ)})")


def _architecture_filled(run: RunCurves) -> dict:
    """The recipe keys this run's architecture fills by default (they follow from the architecture in the label)."""
    defaults = ARCHITECTURE_DEFAULTS.get(run.architecture, {})
    return {Recipe.ARCHITECTURE_KEYS[k]: v for k, v in defaults.items()}


def label_runs(runs: list[RunCurves]) -> None:
    """Each run's label: its architecture and the recipe keys in which the runs differ, leaving out the keys an
    architecture fills when they hold its value (or stay unset where it has none); the directory name where labels
    still tie."""
    flats = [flat_config(run.recipe) for run in runs]
    keys = sorted({k for flat in flats for k in flat if k not in BOOKKEEPING_KEYS
                   and len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1})
    for run, flat in zip(runs, flats):
        filled = _architecture_filled(run)
        shown = [f"{k}={flat.get(k)}" for k in keys if not (k in ARCHITECTURE_FILLED and flat.get(k) == filled.get(k))]
        run.label = run.architecture + (f" ({', '.join(shown)})" if shown else "")
    labels = [run.label for run in runs]
    for run in runs:
        if labels.count(run.label) > 1:
            run.label = f"{run.label} [{run.path.name}]"


def tokens_to_reach(curve: list, target: float) -> float | None:
    """First token count at which the loss reaches `target`, linear between evaluations (module docstring)."""
    if curve and curve[0][1] <= target:
        return float(curve[0][0])
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def layer_values(norms: dict, quantity: str, stat: str) -> list[float]:
    """One evaluation's QUANTITY_STAT, one value per layer (the keys of training/norm_health.py)."""
    return [v for k, v in norms.items() if k.startswith(f"norm/{quantity}_{stat}/")]


def layer_mean(norms: dict, quantity: str) -> float:
    """One evaluation's QUANTITY_mean averaged over the layers."""
    values = layer_values(norms, quantity, "mean")
    return sum(values) / len(values)


def norm_summary(run: RunCurves) -> str:
    """The last evaluation's norms over all layers: means averaged over the layers, the largest max
    (docs/architectures.md, "Watching the norms during training")."""
    if not run.norms:
        return "–"
    last = run.norms[-1][1]
    if layer_values(last, "h", "mean"):
        return (f"‖h‖ mean {layer_mean(last, 'h'):.3f}, max {max(layer_values(last, 'h', 'max')):.3f}; branch "
                f"outputs: ‖x_A‖ mean {layer_mean(last, 'attn'):.2f}, ‖x_M‖ mean {layer_mean(last, 'mlp'):.2f}")
    return f"max |‖h‖−1| {max(layer_values(last, 'h_dist', 'max')):.2e}"


@dataclass
class Comparison:
    runs: list
    target: float
    rows: list  # per run: dict(label, path, final_val, tokens, ratio, norms)

    def markdown(self) -> str:
        lines = [f"Target validation loss: {self.target:.4f}. Tokens to reach it: linear between evaluations; "
                 "token ratio = the first run's tokens / this run's (above 1: fewer tokens than the first run).", "",
                 "| run | final val loss | tokens to target | token ratio | norms at the last evaluation |",
                 "|---|---|---|---|---|"]
        for row in self.rows:
            tokens = "not reached" if row["tokens"] is None else f"{row['tokens']:,.0f}"
            ratio = "–" if row["ratio"] is None else f"{row['ratio']:.2f}×"
            lines.append(f"| {row['label']} `{row['path']}` | {row['final_val']:.4f} | {tokens} | {ratio} | "
                         f"{row['norms']} |")
        return "\n".join(lines) + "\n"


def compare(run_dirs: list, target_loss: float | None = None) -> Comparison:
    runs = [load_run(Path(p)) for p in run_dirs]
    check_comparable(runs)
    label_runs(runs)
    target = max(run.final_val for run in runs) if target_loss is None else target_loss
    reached = [tokens_to_reach(run.val, target) for run in runs]
    rows = []
    for run, tokens in zip(runs, reached):
        ratio = reached[0] / tokens if reached[0] is not None and tokens else None
        rows.append(dict(label=run.label, path=str(run.path), final_val=run.final_val, tokens=tokens, ratio=ratio,
                         norms=norm_summary(run)))
    return Comparison(runs, target, rows)
