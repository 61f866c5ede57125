"""Logit-transform axis of attention (docs/attention.md, "Logit transform") as a registry of behaviour, keyed by config strings.

A transform is one `LogitTransform` registered under its `config.attention_logit_transform` name: the definition
below is all a backend needs, so a new transform (the package's or a user's) is one function plus one
`register_logit_transform` call, and it runs on eager, chunked eager, FlexAttention, in cached decoding and in the
folded model (attention_angpt.py reads only this registry; configuration_angpt.py validates against it).

`score(scores, query_pos, key_pos, head_value, config)` is elementwise over broadcastable tensors, so the same
code runs on a [b, h, q, kv] block of float32 scores (eager, chunked eager: positions [b, 1, q, 1] and
[b, 1, 1, kv], head_value [1, h, 1, 1]) and on the scalars of a FlexAttention `score_mod`. Positions are absolute
(a KV cache carries its keys' positions, left padding and packing change nothing), so t = i − j (or |i − j|
bidirectionally, `distance`). LogN is a query scaling (`query_scale`), which any kernel can run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class LogitTransform:
    """What the backends need to run one transform.

    score: (scores, query_pos, key_pos, head_value, config) -> scores, elementwise; None leaves the scores alone.
    head_values: config -> one float per query head, handed to `score` as head_value (ALiBi's slopes); else None.
    additive: score(S) = S + f(positions, head): SDPA runs it as a float bias (flash-attn only ALiBi, `flash_alibi`).
    query_scale: (per-head learnable scale [h], layout) -> [b, h, q, 1] factor on q; runs on every kernel (LogN).
    query_scale_init: config -> initial value of that learnable per-head scale (parameter `self_attn.query_head_scale`).
    """
    name: str
    score: Callable | None = None
    head_values: Callable | None = None
    additive: bool = False
    query_scale: Callable | None = None
    query_scale_init: Callable | None = None
    flash_alibi: bool = False


LOGIT_TRANSFORMS: dict[str, LogitTransform] = {}


def register_logit_transform(name: str, score: Callable | None = None, *, head_values: Callable | None = None,
                             additive: bool = False, query_scale: Callable | None = None,
                             query_scale_init: Callable | None = None, flash_alibi: bool = False) -> LogitTransform:
    """Make `attention_logit_transform=name` available to configs and every backend that can compute it (eager,
    angpt_chunked and flex_attention for any `score`; sdpa too when `additive`). Like transformers'
    `AttentionInterface.register`, callable from user code; a custom transform does not travel with a checkpoint
    (register it again before loading one)."""
    transform = LogitTransform(name, score, head_values, additive, query_scale, query_scale_init, flash_alibi)
    LOGIT_TRANSFORMS[name] = transform
    return transform


def distance(query_pos: torch.Tensor, key_pos: torch.Tensor, causal: bool) -> torch.Tensor:
    """t = i − j (clamped at 0, where causal masking hides it anyway) or |i − j| for bidirectional attention."""
    t = query_pos - key_pos
    return t.clamp(min=0) if causal else t.abs()


_head_tensors: dict = {}


def head_tensor(transform: LogitTransform, config, device) -> torch.Tensor | None:
    """transform.head_values(config) as a float32 [h] tensor, one stable object per distinct value list and device
    (FlexAttention captures it; the same object every forward means no recompilation)."""
    if transform.head_values is None:
        return None
    values = tuple(float(v) for v in transform.head_values(config))
    key = (values, str(device))
    if key not in _head_tensors:
        _head_tensors[key] = torch.tensor(values, dtype=torch.float32, device=device)
    return _head_tensors[key]


# --- the package's transforms: one definition and one registration each ------------------------------------------
register_logit_transform("none")


def alibi_slopes(num_heads: int) -> list[float]:
    """Press et al.'s slopes: for H a power of two, the geometric sequence 2^(−8/H), 2^(−16/H), …; otherwise the
    slopes of the closest lower power of two c, then every other slope of the 2c sequence (official ALiBi code)."""
    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]


def alibi_transform(scores, query_pos, key_pos, slope, config):
    """S − m_h·t."""
    return scores - slope * distance(query_pos, key_pos, config.is_causal).to(scores.dtype)


register_logit_transform("alibi", alibi_transform, head_values=lambda config: alibi_slopes(config.num_attention_heads),
                         additive=True, flash_alibi=True)


def scale_invariant_coefficients(t: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(a_t, m_t) of the scale-invariant transform L = a_t·S + m_t (docs/attention.md, α = β = e^0.5):
    ℓ_t = ln(1 + t/τ), a_t = √(1 + 2ℓ_t), m_t = −2ℓ_t."""
    log_term = torch.log1p(t.to(torch.float32) / tau)
    return torch.sqrt(1.0 + 2.0 * log_term), -2.0 * log_term


def scale_invariant_transform(scores, query_pos, key_pos, head_value, config):
    """√(1 + 2ℓ_t)·S − 2ℓ_t (multiplicative: eager, chunked eager or FlexAttention, not an additive mask)."""
    a, m = scale_invariant_coefficients(distance(query_pos, key_pos, config.is_causal), config.scale_invariant_tau)
    return scores * a.to(scores.dtype) + m.to(scores.dtype)


register_logit_transform("scale_invariant", scale_invariant_transform)


def logn_init_value(config) -> float:
    """s_h at init: config.logn_init, else 1/log(L_train) so that s·log(n) = 1 at the end of the training window
    (the paper gives no initial value)."""
    if config.logn_init is not None:
        return float(config.logn_init)
    return 1.0 / math.log(max(config.max_position_embeddings, 2))


def logn_query_scale(scale: torch.Tensor, layout) -> torch.Tensor:
    """SSMax/LogN (docs/attention.md, "Logit transform"): L = s_h·log(n)·S, applied as q ← s_h·log(n)·q. `scale` is s [h], n [b, q] is the
    number of keys the query can see (causal: its absolute position + 1). Returns a [b, h, q, 1] factor."""
    key_counts = layout.key_counts()
    return scale.view(1, -1, 1, 1) * torch.log(key_counts.to(scale.dtype).clamp_min(1.0))[:, None, :, None]


register_logit_transform("logn", query_scale=logn_query_scale, query_scale_init=logn_init_value)
