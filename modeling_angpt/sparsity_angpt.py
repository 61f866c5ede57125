"""Sparsity axis of attention (docs/attention.md, "Sparsity"): which keys each query may see, as a registry of
behaviour keyed by `config.attention_sparsity` (`register_sparsity`).

A pattern is input-agnostic (elementwise over positions: every backend runs it, as a mask block, a dense SDPA mask
or a FlexAttention `mask_mod`); a `select` is input-dependent, on the logits (eager and chunked eager only).
`support` combines causality, padding, packing and the pattern; the eager backends and FlexAttention both call it
(attention_layout_angpt.AttentionLayout.visible, flex_angpt.mods). Nothing here branches on tensor values, so a forward
exports and compiles with fullgraph=True.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Sparsity:
    """pattern: (query_pos, key_pos, config, causal, lengths) -> bool, elementwise; `lengths` = real keys of the
    query's sequence (None when causal). select: (scores, visible, config) -> bool, after the logit transform and
    the causal/padding mask, before the softmax. Neither: every visible key."""
    name: str
    pattern: Callable | None = None
    select: Callable | None = None


SPARSITIES: dict[str, Sparsity] = {}


def register_sparsity(name: str, pattern: Callable | None = None, *, select: Callable | None = None) -> Sparsity:
    """Make `attention_sparsity=name` available to configs and every backend that can compute it (a `pattern`:
    all of eager, angpt_chunked, sdpa, flex_attention; a `select`: eager and angpt_chunked). Global tokens
    (`attention_global_tokens`) extend any `pattern`."""
    if (pattern is None) == (select is None) and name != "none":
        raise ValueError(f"register_sparsity({name!r}): give exactly one of pattern= or select=")
    sparsity = Sparsity(name, pattern, select)
    SPARSITIES[name] = sparsity
    return sparsity


# --- the package's sparsity patterns: one definition and one registration each -----------------------------------
register_sparsity("none")


def window_pattern(query_pos, key_pos, config, causal, lengths):
    """causal → the w most recent keys, self included; bidirectional → exactly w keys centred on the query, shifted
    inside [0, length) near the ends (semantic-focus paper)."""
    width = config.attention_window
    if causal:
        return query_pos - key_pos < width
    start = torch.minimum((query_pos - (width - 1) // 2).clamp(min=0), (lengths - width).clamp(min=0))
    return (key_pos >= start) & (key_pos < start + width)


register_sparsity("window", window_pattern)


def block_pattern(query_pos, key_pos, config, causal, lengths):
    """Disjoint blocks: same ⌊pos/m⌋ (and causal)."""
    size = config.attention_block_size
    return (query_pos // size) == (key_pos // size)


register_sparsity("block", block_pattern)


def topk_support(scores: torch.Tensor, visible: torch.Tensor, config) -> torch.Tensor:
    """Keep exactly the k largest visible logits per query and head (docs/attention.md, "Sparsity": transform →
    causal/padding mask → top-k → softmax). `topk` + scatter gives exactly k even with ties; a row with fewer than k visible keys keeps
    them all. The selection carries no gradient (none exists); the kept logits do."""
    k = config.attention_topk
    if k >= scores.shape[-1]:
        return visible
    with torch.no_grad():
        index = scores.masked_fill(~visible, float("-inf")).topk(k, dim=-1).indices
        keep = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, index, True)
    return keep & visible


register_sparsity("topk", select=topk_support)


def support(query_idx, key_idx, query_pos, key_pos, key_valid, query_seq, key_seq, lengths, config,
            causal: bool) -> torch.Tensor:
    """Elementwise: may the query see the key? Causality by index in the cache (so packed sequences never see the
    future, and a static cache's unwritten slots stay hidden), padding, the packed sequence, then the input-agnostic
    pattern by position (an input-dependent `select` is applied later, on the logits). Global tokens: the first g
    positions are seen by every query and see every key (within causality)."""
    allowed = key_idx <= query_idx if causal else key_idx >= 0
    if key_valid is not None:
        allowed = allowed & key_valid
    if key_seq is not None:
        allowed = allowed & (query_seq == key_seq)
    pattern = SPARSITIES[config.attention_sparsity].pattern
    if pattern is None:
        return allowed
    keep = pattern(query_pos, key_pos, config, causal, lengths)
    if config.attention_global_tokens:
        keep = keep | (key_pos < config.attention_global_tokens) | (query_pos < config.attention_global_tokens)
    return allowed & keep
