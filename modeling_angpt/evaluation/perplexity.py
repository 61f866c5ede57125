"""The `perplexity` suite: held-out loss on the validation split of the run that produced the checkpoint.

The split is rebuilt from the recipe stored in `training_metadata.json` beside the weights (same corpus,
tokenizer, block size and split seed as training), and exactly the sequences training's own evaluation scored
are scored (eval_max_batches x per_device_eval_batch_size x processes, the first ones of the seeded random
validation order; the whole split when the recipe set eval_max_batches: null), so the figure is the one training
logged, up to training's bf16 autocast. `--limit` (meant for the lm-eval tasks) does not change it.
"""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from .options import EvalOptions

TASK = "angpt_heldout_loss"


def _metadata(checkpoint: Path) -> dict:
    path = Path(checkpoint) / "training_metadata.json"
    if not path.is_file():
        raise FileNotFoundError(f"the perplexity suite needs {path} (written by `angpt train`, kept by "
                                "`angpt export`); this checkpoint has no known validation split")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def _recipe_and_source(checkpoint: Path):
    from ..data.sources import resolve_corpus
    from ..training.recipe import recipe_from_dict

    where = str(Path(checkpoint) / "training_metadata.json")
    metadata = _metadata(checkpoint)
    if "recipe" not in metadata:
        raise ValueError(f"{where}: no 'recipe' entry")
    recipe = recipe_from_dict(metadata["recipe"], where=where)
    try:
        source = resolve_corpus(recipe)
    except ModuleNotFoundError as error:
        raise FileNotFoundError(f"training corpus of {checkpoint} ({recipe.dataset}): {error}") from None
    except FileNotFoundError as error:
        raise FileNotFoundError(f"training corpus of {checkpoint} has moved or is gone since training: {error} "
                                f"(recipe in {where})") from None
    return recipe, source, metadata


def preflight(checkpoint: Path, options: EvalOptions) -> None:
    """Everything the suite needs except the model, checked before the model is loaded."""
    _recipe_and_source(checkpoint)


def default_sequences(recipe, metadata: dict) -> int | None:
    if recipe.eval_max_batches is None:
        return None
    return recipe.eval_max_batches * recipe.per_device_eval_batch_size * int(metadata.get("num_processes") or 1)


@torch.no_grad()
def validation_loss(model, blocks, batch_size: int, max_sequences: int | None) -> dict:
    """Mean next-token loss over the first `max_sequences` validation blocks (each block weighs the same, as in
    training's evaluation)."""
    device = next(model.parameters()).device
    n = len(blocks) if max_sequences is None else min(len(blocks), max_sequences)
    total, count = 0.0, 0
    for start in range(0, n, batch_size):
        ids = torch.stack([blocks[i]["input_ids"] for i in range(start, min(n, start + batch_size))]).to(device)
        logits = model(input_ids=ids, use_cache=False).logits
        losses = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none").mean(1)
        total += losses.double().sum().item()
        count += losses.numel()
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(loss), "sequences": count}


def run_suite(model, tokenizer, checkpoint: Path, options: EvalOptions,
              output_dir: Path) -> dict[str, dict[str, float]]:
    from ..data.build import build_datasets

    recipe, source, metadata = _recipe_and_source(checkpoint)
    _, _, val, info = build_datasets(recipe, source, contextlib.nullcontext, examples=False)
    sequences = default_sequences(recipe, metadata)
    batch_size = options.batch_size if isinstance(options.batch_size, int) else recipe.per_device_eval_batch_size
    result = validation_loss(model, val, batch_size, sequences)
    result["val_blocks"] = len(val)
    if metadata.get("final_val_loss") is not None:   # what training logged last, for comparison
        result["training_final_val_loss"] = metadata["final_val_loss"]
    return {TASK: result}
