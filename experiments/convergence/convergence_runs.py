"""One run of the convergence experiment (convergence.py; experiments/residual_nu_depth reuses it): what a run
is called, the recipe it trains with, its data, and the training itself, in a worker process. A finished run
leaves OUTPUT_DIR/<run>/result.json (its validation curve); everything else it wrote is removed."""
from __future__ import annotations

import json
import math
import pathlib
import shutil
import time

import study

# What a finished run's result depends on beyond its name (architecture, lr, seed, ablation; a depth run's layers
# and α): one output folder, one setting (study.claim_output_dir).
SETTINGS = ("hidden", "heads", "vocab", "block", "batch", "steps", "eval_steps", "eval_batches", "recipe", "dataset")
# anGPT ablations (the paper's switches, docs/architectures.md), each one change from anGPT's recipe at its best
# learning rate.
ABLATIONS = {"alpha0.01": ("α init 0.01", ["model_kwargs.alpha_init=0.01"]),
             "no_nu": ("no ν(α) on the residual", ["model_kwargs.alpha_nu=false"]),
             "warmup": ("5 % linear warm-up", ["warmup_ratio=0.05"]),
             # the project's two departures (docs/architectures.md), each undone: the paper's s_z speed √d, no
             # width rule
             "spec_sz": ("s_z speed √d (nGPT's) instead of 256", ["model_kwargs.logit_scale_speed={sqrt_d}"]),
             "no_width_rule": ("no width rule on the matrices' lr", ["lr_width_rule=none"])}


def run_name(spec: dict) -> str:
    shape = f"-L{spec['layers']}-a{spec['alpha']:g}" if "layers" in spec else ""  # a depth run (residual_nu_depth.py)
    tail = f"-{spec['ablation']}" if spec.get("ablation") else ""
    return f"{spec['arch']}{shape}-lr{spec['lr']:g}-s{spec['seed']}{tail}"


def recipe_for(spec: dict, cfg: dict, out: pathlib.Path):
    """The architecture's recipe (docs/architectures.md) for one run: the shape, data and length of `cfg`, one
    ablation at most; a spec may set its own depth and α init ("layers", "alpha")."""
    from modeling_angpt.training import load_recipe

    d = cfg["hidden"]
    shape = {"hidden_size": d, "intermediate_size": 4 * d, "num_hidden_layers": spec.get("layers", cfg["layers"]),
             "num_attention_heads": cfg["heads"], "max_position_embeddings": cfg["block"]}
    overrides = [f"architecture={spec['arch']}", f"learning_rate={spec['lr']}", f"seed={spec['seed']}",
                 f"max_steps={cfg['steps']}", f"eval_steps={cfg['eval_steps']}", f"dataset={cfg['dataset']}",
                 f"tokenizer_vocab_size={cfg['vocab']}", f"block_size={cfg['block']}",
                 f"per_device_train_batch_size={cfg['batch']}", f"per_device_eval_batch_size={2 * cfg['batch']}",
                 f"eval_max_batches={cfg['eval_batches']}", f"output_dir={out}", "save_steps=0",
                 "save_total_limit=1", "disable_tqdm=true", "report_to=[jsonl]", "logging_steps=10",
                 *[f"model_kwargs.{k}={v}" for k, v in shape.items()],
                 *([f"model_kwargs.alpha_init={spec['alpha']}"] if "alpha" in spec else []),
                 *[o.format(sqrt_d=d ** 0.5) for o in ABLATIONS.get(spec.get("ablation"), ("", []))[1]]]
    return load_recipe(cfg["recipe"], overrides)


def prepare_data(cfg: dict) -> None:
    """Tokenizer and packed blocks, built once and cached before the workers start (they would race)."""
    study.build_data(recipe_for({"arch": "gptplus", "lr": 1.0, "seed": 0}, cfg, pathlib.Path(cfg["output_dir"])))


def run_one(spec: dict, cfg: dict) -> dict:
    """Train one run (in a worker process) and return its validation curve against tokens."""
    import torch

    from modeling_angpt.training import NonFiniteLossError, train
    from modeling_angpt.training.metrics import read_metrics

    torch.set_num_threads(cfg["threads"])
    out = pathlib.Path(cfg["output_dir"]) / run_name(spec)
    recipe = recipe_for(spec, cfg, out)
    tokens_per_step = recipe.per_device_train_batch_size * recipe.block_size * recipe.gradient_accumulation_steps
    start = time.perf_counter()
    diverged_at = None
    try:
        result = train(recipe, overwrite=True)  # an unfinished earlier run; refused if one is still live
        val, diverged = result.val_losses, False
        precision = ("bf16 autocast" if result.accelerator.mixed_precision == "bf16" else
                     "float32 (the recipe's bf16 replaced: this CPU has no native bfloat16)" if recipe.bf16 else
                     "float32")
    except NonFiniteLossError as error:
        val = [[r["step"], r["val_loss"]] for r in read_metrics(out / "metrics.jsonl") if "val_loss" in r]
        diverged, precision, diverged_at = True, None, error.step
    info = json.loads((out / "final" / "training_metadata.json").read_text())["data"] if not diverged else {}
    # a caller's measurement of the trained model (residual_nu_depth.py: the stream's norm after each layer)
    probed = cfg["probe"](result.model, recipe, info) if cfg.get("probe") and not diverged else {}
    curve = [(step * tokens_per_step, loss) for step, loss in val]
    final = curve[-1][1] if curve and not diverged else math.inf
    record = {**spec, "curve": curve, "final": final, "diverged": diverged, "diverged_at": diverged_at,
              "precision": precision, "wall_s": time.perf_counter() - start,
              "tokens": cfg["steps"] * tokens_per_step, "train_tokens_available": info.get("train_tokens"),
              "val_tokens_per_eval": cfg["eval_batches"] * 2 * cfg["batch"] * cfg["block"], **probed}
    for heavy in ("checkpoints", "final", ".tmp_final"):  # only the curve is needed; keep the disk free
        shutil.rmtree(out / heavy, ignore_errors=True)
    (out / "result.json").write_text(json.dumps(record))
    return record


def load_results(output_dir: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(output_dir.glob("*/result.json"))]
