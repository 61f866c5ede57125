"""`angpt eval CHECKPOINT`: held-out loss on the checkpoint's own validation split, and lm-eval tasks.

The validation split is rebuilt from the recipe stored in `training_metadata.json` beside the weights
(same corpus, tokenizer, block size and split seed as training), so the figure is comparable to the
validation loss logged during training. `--tasks` runs lm-eval-harness on the in-memory model
(`HFLM(pretrained=model)`); benchmark data comes from the Hub at run time, local task YAMLs through
`--include-path`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint directory (training form or folded)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-batches", type=int, default=None, help="cap the number of validation batches")
    parser.add_argument("--tasks", default=None, help="comma-separated lm-eval task names (e.g. arc_easy,piqa)")
    parser.add_argument("--include-path", default=None, help="directory of extra lm-eval task YAMLs")
    parser.add_argument("--limit", type=float, default=None, help="lm-eval: examples per task")
    parser.add_argument("--output", default=None, help="write the results as JSON here")


def load_checkpoint(directory: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"not a checkpoint directory (no config.json): {directory}")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, trust_remote_code=True).eval()
    return model, AutoTokenizer.from_pretrained(directory)


@torch.no_grad()
def validation_loss(model, blocks, batch_size: int, max_batches: int | None) -> dict:
    """Mean next-token loss over the validation blocks (every block weighs the same, as in training)."""
    loader = torch.utils.data.DataLoader(blocks, batch_size=batch_size, shuffle=False)
    total, count = 0.0, 0
    for index, batch in enumerate(loader):
        if max_batches is not None and index >= max_batches:
            break
        ids = batch["input_ids"]
        logits = model(input_ids=ids, use_cache=False).logits
        losses = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none").mean(1)
        total += losses.double().sum().item()
        count += losses.numel()
    loss = total / max(count, 1)
    return {"val_loss": loss, "val_perplexity": math.exp(loss), "val_sequences": count}


def held_out_blocks(directory: Path):
    """The validation split of the run that produced the checkpoint (from training_metadata.json)."""
    from ..training.data import build_datasets, resolve_source
    from ..training.recipe import recipe_from_dict

    metadata_path = directory / "training_metadata.json"
    if not metadata_path.is_file():
        return None, None
    metadata = json.loads(metadata_path.read_text())
    recipe = recipe_from_dict(metadata["recipe"], where=str(metadata_path))
    _, _, val, info = build_datasets(recipe, resolve_source(recipe.dataset), contextlib.nullcontext)
    return val, info


def run_lm_eval(model, tokenizer, tasks: list[str], batch_size: int, include_path: str | None,
                limit: float | None) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    device = "cuda" if torch.cuda.is_available() else "cpu"
    lm = HFLM(pretrained=model.to(device), tokenizer=tokenizer, backend="causal", batch_size=batch_size,
              device=device, max_length=model.config.max_position_embeddings)
    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    results = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit, bootstrap_iters=0)
    return results["results"]


def run(args: argparse.Namespace) -> int:
    directory = Path(args.checkpoint)
    model, tokenizer = load_checkpoint(directory)
    report: dict = {"checkpoint": str(directory)}
    blocks, info = held_out_blocks(directory)
    if blocks is not None:
        report.update(validation_loss(model, blocks, args.batch_size, args.max_batches))
        report["dataset"] = info["dataset"]
        print(f"validation loss on {info['dataset']}: {report['val_loss']:.4f} "
              f"(perplexity {report['val_perplexity']:.1f}, {report['val_sequences']} sequences)")
    elif not args.tasks:
        print(f"{directory} has no training_metadata.json (no held-out split known): pass --tasks")
        return 2
    if args.tasks:
        report["lm_eval"] = run_lm_eval(model, tokenizer, args.tasks.split(","), args.batch_size,
                                        args.include_path, args.limit)
        for task, metrics in report["lm_eval"].items():
            shown = {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}
            print(f"{task}: {shown}")
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2, default=str))
    return 0
