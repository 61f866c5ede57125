"""Build the model a recipe names: a preset (configuration/presets/*.json, loadable by AutoConfig) or a
config JSON path, with the recipe's architecture and model_kwargs applied; or a training-form checkpoint
(`init_from`). Everything here is validated before any data is read."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from .. import register_auto_classes
from ..architectures_angpt import ARCHITECTURES
from ..inference.padding import set_pad_token_id
from .distributed import apply_weight_constraints
from .recipe import architecture_defaults_for

REPO_PRESETS = Path(__file__).resolve().parents[2] / "configuration" / "presets"


def preset_path(name: str) -> Path:
    path = Path(name).expanduser()
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"model config file not found: {path}")
        return path
    installed = Path(sys.prefix) / "share" / "angpt" / "presets"  # setup.cfg data_files (wheel installs)
    for root in (Path.cwd() / "configuration" / "presets", REPO_PRESETS, installed):
        if (root / f"{name}.json").is_file():
            return root / f"{name}.json"
    available = sorted(p.stem for p in REPO_PRESETS.glob("*.json"))
    raise FileNotFoundError(f"model preset {name!r} not found; available: {', '.join(available)}")


def build_config(recipe):
    """The model config; raises (naming the field) on an unknown architecture or a folded checkpoint."""
    from transformers import AutoConfig

    register_auto_classes()  # model_type "angpt"
    if recipe.init_from:
        if not Path(recipe.init_from).is_dir():
            raise FileNotFoundError(f"init_from checkpoint not found: {recipe.init_from}")
        config = AutoConfig.from_pretrained(recipe.init_from)
        if getattr(config, "folded", False):
            raise ValueError(f"init_from={recipe.init_from} is a folded (exported inference) checkpoint; "
                             "training needs the training form (the checkpoint before `angpt export`)")
        return config
    values = json.loads(preset_path(recipe.model).read_text())
    values.update(recipe.model_kwargs)
    if recipe.architecture is not None:
        values["architecture"] = recipe.architecture
    model_type = values.pop("model_type", "angpt")
    if "architecture" in values and model_type != "angpt":
        raise ValueError(f"recipe key architecture={values['architecture']!r} needs an anGPT preset, "
                         f"not model_type {model_type!r}")
    values.pop("transformers_version", None)
    config = AutoConfig.for_model(model_type, **values)
    depth_warning = alpha_depth_warning(config)
    if depth_warning:
        warnings.warn(depth_warning, stacklevel=2)
    if recipe.block_size > config.max_position_embeddings:
        raise ValueError(f"recipe key block_size={recipe.block_size} exceeds the model's "
                         f"max_position_embeddings={config.max_position_embeddings}")
    return config


def alpha_depth_warning(config) -> str | None:
    """A one-line warning when a fresh model's α init is too large for its depth (the architecture's rule:
    architectures_angpt.ALPHA_DEPTH_LIMIT for anGPT); None for configs that are not this library's."""
    if getattr(config, "model_type", None) != "angpt":
        return None
    return ARCHITECTURES[config.architecture].alpha_depth_warning(config)


def blow_up_knobs(model, optimizer) -> str:
    """The knobs a run that blew up should turn, for its stop message: the architecture's (anGPT: α init × layers)
    and the matrices' learning rate at this step (after the schedule and the width rule)."""
    config = getattr(model, "config", None)
    knobs = list(ARCHITECTURES[config.architecture].blow_up_knobs(config)
                 if getattr(config, "model_type", None) == "angpt" else [])
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    matrix_lrs = {group["lr"] for group in optimizer.param_groups  # the groups training/optim.py built
                  if any(p.ndim >= 2 and id(p) not in embeddings for p in group["params"])}
    if matrix_lrs:
        knobs.append(f"matrices' learning rate {'/'.join(f'{lr:.4g}' for lr in sorted(matrix_lrs))}")
    return ", ".join(knobs)


def build_model(recipe, config, tokenizer):
    """Fresh weights (seeded by the caller) or `init_from`; vocabulary sized to the tokenizer."""
    from transformers import AutoModelForCausalLM

    if recipe.init_from:
        model = AutoModelForCausalLM.from_pretrained(recipe.init_from, dtype=torch.float32)
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(f"init_from vocab_size={model.config.vocab_size} is smaller than the "
                             f"tokenizer's {len(tokenizer)}")
    else:
        config.vocab_size = len(tokenizer)
        config.eos_token_id = tokenizer.eos_token_id
        config.bos_token_id = tokenizer.bos_token_id
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    set_pad_token_id(model, tokenizer)  # batched generate() with the saved checkpoint needs no pad_token_id
    apply_weight_constraints(model)  # the constraint holds from step 0 (docs/architectures.md)
    return model


def compile_blocks(model, mode: str | None = None, **options) -> int:
    """Regional compilation: `torch.compile` each decoder block in place (nn.Module.compile), not the whole model.

    Every block has the same code and parameters of the same shapes, so dynamo traces one graph and reuses it
    for all of them (parameters are graph inputs): the warm-up is one block's, whatever the depth. Embedding,
    head and loss stay eager. Returns the number of blocks compiled; models without `model.layers` raise."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"torch_compile: {type(model).__name__} has no decoder blocks at .model.layers to compile")
    for layer in layers:
        layer.compile(mode=None if mode in (None, "default") else mode, **options)
    return len(layers)


def architecture_defaults(model) -> dict:
    """The optimiser keys the model's architecture fills (training/recipe.py, ARCHITECTURE_DEFAULTS)."""
    return architecture_defaults_for(getattr(model, "config", None))


def apply_constraints(model) -> None:
    """The weight constraint after an optimiser step: no-op for GPT+, unit norm for nGPT, row ball for
    anGPT (docs/architectures.md), also on FSDP2 shards. Call on the unwrapped model on every rank, so DDP
    replicas stay identical."""
    apply_weight_constraints(model)
