"""Logit-transform axis of attention (SPEC.md §3.2): functions of the scaled score S and the distance t ≥ 0.

Every transform is written elementwise over broadcastable tensors, so the same code runs on a [b, h, q, kv]
block of scores (eager, chunked eager) and on the scalars of a FlexAttention `score_mod`. `t` is the query
position minus the key position (absolute positions, so a KV cache and left padding change nothing); in
bidirectional attention it is |i − j|. LogN is not here: it is a query scaling (`logn_query_scale`), which any
kernel can run.
"""
from __future__ import annotations

import math

import torch


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


def scale_invariant_coefficients(t: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(a_t, m_t) of the scale-invariant transform L = a_t·S + m_t (research note §1.2, α = β = e^0.5):
    ℓ_t = ln(1 + t/τ), a_t = √(1 + 2ℓ_t), m_t = −2ℓ_t."""
    log_term = torch.log1p(t.to(torch.float32) / tau)
    return torch.sqrt(1.0 + 2.0 * log_term), -2.0 * log_term


def no_transform(scores, t, slope, tau):
    return scores


def alibi_transform(scores, t, slope, tau):
    """S − m_h·t."""
    return scores - slope * t.to(scores.dtype)


def scale_invariant_transform(scores, t, slope, tau):
    """√(1 + 2ℓ_t)·S − 2ℓ_t."""
    a, m = scale_invariant_coefficients(t, tau)
    return scores * a.to(scores.dtype) + m.to(scores.dtype)


# Registry keyed by config.attention_logit_transform; logn acts on the query before the kernel (see below).
LOGIT_TRANSFORM_FUNCTIONS = {"none": no_transform, "logn": no_transform, "alibi": alibi_transform,
                             "scale_invariant": scale_invariant_transform}


def slopes_for(config, device) -> torch.Tensor | None:
    """ALiBi slopes as a [h] float32 tensor (None for every other transform)."""
    if config.attention_logit_transform != "alibi":
        return None
    return torch.tensor(alibi_slopes(config.num_attention_heads), dtype=torch.float32, device=device)


def logn_init_value(config) -> float:
    """s_h at init: config.logn_init, else 1/log(L_train) so that s·log(n) = 1 at the end of the training window
    (research note §2.6: the paper gives no initial value)."""
    if config.logn_init is not None:
        return float(config.logn_init)
    return 1.0 / math.log(max(config.max_position_embeddings, 2))


def logn_query_scale(scale: torch.Tensor, key_counts: torch.Tensor) -> torch.Tensor:
    """SSMax/LogN (SPEC §3.2): L = s_h·log(n)·S, applied as q ← s_h·log(n)·q. `scale` is s [h], `key_counts` is n
    [b, q] (causal: the query's absolute position + 1). Returns a [b, h, q, 1] factor."""
    return scale.view(1, -1, 1, 1) * torch.log(key_counts.to(scale.dtype).clamp_min(1.0))[:, None, :, None]
