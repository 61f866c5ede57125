"""Optimiser and learning-rate schedule (docs/training.md; the anGPT paper's Table F.2).

The model decides which parameters get weight decay (`model.optimizer_param_groups`, matrices only);
GPT+ then trains with AdamW (decay 0.1, 20 % warm-up), nGPT/anGPT with Adam (= AdamW at decay 0, no
warm-up). All three decay the learning rate on a cosine to `min_lr_ratio` × peak (0.01).
"""
from __future__ import annotations

import math

import torch

SCHEDULES = ("cosine", "linear", "constant")
LR_WIDTH_RULES = ("none", "inverse_width")


def width_lr_scale(model, rule: str, base_width: int) -> float:
    """The factor on the learning rate of every matrix that multiplies an activation (not the input embedding).

    `inverse_width` (μP's Adam rule, capped at 1): base_width / hidden_size above the base width, 1 below it. Why:
    a first Adam step is sign-like and low-rank, so it moves a matrix's spectral norm by about lr·√(fan_out·fan_in),
    which grows linearly with width while anGPT's rows stay in the unit ball; without an exact norm after the
    branch, a larger singular value directly enlarges ‖h‖, and the MLP output grows with ‖h‖². Dividing the
    rate by the width keeps that step constant across widths (experiments/width_depth_stability/README.md).
    """
    if rule not in LR_WIDTH_RULES:
        raise ValueError(f"recipe key lr_width_rule={rule!r} is not supported; expected one of {list(LR_WIDTH_RULES)}")
    width = getattr(getattr(model, "config", None), "hidden_size", None)
    if rule == "none" or not width:
        return 1.0
    if base_width is None or base_width <= 0:
        raise ValueError(f"recipe key lr_base_width={base_width!r} must be > 0 with lr_width_rule={rule!r}")
    return min(1.0, base_width / width)


def param_groups(model, weight_decay: float) -> list[dict]:
    """The model's own groups when it has them (anGPT models); otherwise decay on ≥2-D tensors only,
    which is the same rule for a plain transformers model."""
    if hasattr(model, "optimizer_param_groups"):
        return model.optimizer_param_groups(weight_decay)
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def scaled_param_groups(model, groups: list[dict], lr: float, scale: float) -> list[dict]:
    """Split each group into (matrices that multiply activations, the rest); the first get lr × scale."""
    if scale == 1.0:
        return [{**g, "lr": lr} for g in groups]
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    out = []
    for group in groups:
        hidden = [p for p in group["params"] if p.ndim >= 2 and id(p) not in embeddings]
        rest = [p for p in group["params"] if p.ndim < 2 or id(p) in embeddings]
        out += [{**group, "params": params, "lr": lr * s} for params, s in ((hidden, scale), (rest, 1.0)) if params]
    return out


def build_optimizer(model, recipe) -> torch.optim.Optimizer:
    if recipe.optim not in ("adamw", "adam"):
        raise ValueError(f"recipe key optim={recipe.optim!r} is not supported; expected adamw or adam")
    weight_decay = 0.0 if recipe.optim == "adam" else recipe.weight_decay
    scale = width_lr_scale(model, recipe.lr_width_rule or "none", recipe.lr_base_width)
    groups = scaled_param_groups(model, param_groups(model, weight_decay), recipe.learning_rate, scale)
    # Decoupled weight decay with decay 0 is exactly Adam, so one class serves both recipes.
    return torch.optim.AdamW(groups, lr=recipe.learning_rate,
                             betas=(recipe.adam_beta1, recipe.adam_beta2), eps=recipe.adam_epsilon,
                             weight_decay=weight_decay)


def lr_multiplier(step: int, total: int, warmup: int, kind: str, min_ratio: float) -> float:
    """Linear warm-up from 0 over `warmup` steps, then decay from 1 to `min_ratio` at step `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if kind == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress)
    return 1.0


def build_scheduler(optimizer, recipe) -> torch.optim.lr_scheduler.LambdaLR:
    if recipe.lr_scheduler_type not in SCHEDULES:
        raise ValueError(f"recipe key lr_scheduler_type={recipe.lr_scheduler_type!r} is not supported; "
                         f"expected one of {list(SCHEDULES)}")
    warmup = int(round(recipe.warmup_ratio * recipe.max_steps))
    total, kind, floor = recipe.max_steps, recipe.lr_scheduler_type, recipe.min_lr_ratio
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, total, warmup, kind, floor))
