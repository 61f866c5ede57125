"""Which keys each query sees (SPEC.md §3.3), computed from absolute positions, never from a T×T tensor.

`AttentionLayout` carries O(T) facts per batch row: the absolute positions of the queries and of the keys (the
cache included) and which keys are real tokens. Every backend derives what it needs from it: the eager and
chunked paths a [b, 1, C, kv] boolean block per query chunk, SDPA one dense mask, FlexAttention a `mask_mod`
and a `score_mod` (the same elementwise functions on scalars). Positions count real tokens (with a 2-D padding
mask, position = number of real tokens before it, as `generate` does), so distances t = i − j and block
boundaries do not move under left padding, and a KV cache needs no offset bookkeeping (t = P − j at decode
position P).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def distance(query_pos: torch.Tensor, key_pos: torch.Tensor, causal: bool) -> torch.Tensor:
    """t = i − j (clamped at 0, where causal masking hides it anyway) or |i − j| for bidirectional attention."""
    t = query_pos - key_pos
    return t.clamp(min=0) if causal else t.abs()


def support(query_idx, key_idx, query_pos, key_pos, key_valid, length, config, causal: bool) -> torch.Tensor:
    """Elementwise: may the query see the key? Causality by index in the cache (so packed sequences with
    restarting position_ids never see the future), padding, then the input-agnostic patterns by position (top-k
    is input-dependent and applied later on the logits).

    window: causal → the w most recent keys, self included; bidirectional → exactly w keys centred on the query,
    shifted inside [0, length) near the ends (semantic-focus paper). block: same ⌊pos/m⌋ (and causal).
    Global tokens: the first g positions are seen by every query and see every key (within causality)."""
    allowed = key_idx <= query_idx if causal else key_idx >= 0
    if key_valid is not None:
        allowed = allowed & key_valid
    sparsity = config.attention_sparsity
    if sparsity not in ("window", "block"):
        return allowed
    if sparsity == "window":
        width = config.attention_window
        if causal:
            pattern = query_pos - key_pos < width
        else:
            start = torch.minimum((query_pos - (width - 1) // 2).clamp(min=0), (length - width).clamp(min=0))
            pattern = (key_pos >= start) & (key_pos < start + width)
    else:
        size = config.attention_block_size
        pattern = (query_pos // size) == (key_pos // size)
    if config.attention_global_tokens:
        pattern = pattern | (key_pos < config.attention_global_tokens) | (query_pos < config.attention_global_tokens)
    return allowed & pattern


def positions_from_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of each token = number of real tokens before it (padding gets 0; it is masked anyway)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class AttentionLayout:
    query_positions: torch.Tensor  # [b or 1, q] long
    query_offset: int  # cache index of the first query = number of keys before it (past length)
    key_positions: torch.Tensor  # [b or 1, kv] long
    key_valid: torch.Tensor | None  # [b, kv] bool; None = every key is a real token
    causal: bool
    dense_mask: torch.Tensor | None = None  # [b, 1, q, kv] bool: a caller's own 4-D mask, intersected
    # Per-forward results shared by every layer (the layout is built once per forward): whole-sequence masks and
    # distances, FlexAttention's BlockMask. Chunks are not kept, so the chunked path stays O(chunk × T).
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, config, attention_mask, position_ids: torch.Tensor, past_seen: int) -> "AttentionLayout":
        """From what AnGPTModel.forward has: a 2-D padding mask over cache + new tokens (or a 4-D mask, or None)."""
        dense_mask = key_valid = None
        if attention_mask is not None and attention_mask.dim() == 2:
            key_positions = positions_from_padding(attention_mask)
            key_valid = None if bool(attention_mask.all()) else attention_mask.bool()
            # The new keys are the queries themselves: give them the query positions (a caller's own
            # position_ids included), so t = i − j is measured in one frame; cached keys keep the mask's count.
            new = position_ids.shape[-1]
            key_positions = torch.cat([key_positions[:, :-new], position_ids.expand(key_positions.shape[0], new)], -1)
        else:
            if attention_mask is not None:
                dense_mask = as_bool_mask(attention_mask)
            if past_seen == 0:
                key_positions = position_ids
            else:
                key_positions = torch.arange(past_seen + position_ids.shape[-1], device=position_ids.device)[None]
        return cls(position_ids, past_seen, key_positions, key_valid, config.is_causal, dense_mask)

    @classmethod
    def from_shapes(cls, query: torch.Tensor, key: torch.Tensor, attention_mask, causal: bool) -> "AttentionLayout":
        """Fallback when a backend is called without a layout: queries are the last q of the kv positions."""
        q_len, kv_len = query.shape[-2], key.shape[-2]
        key_positions = torch.arange(kv_len, device=query.device)[None]
        dense = as_bool_mask(attention_mask) if attention_mask is not None and attention_mask.dim() == 4 else None
        return cls(key_positions[:, kv_len - q_len:], kv_len - q_len, key_positions, None, causal, dense)

    def lengths(self) -> torch.Tensor:
        """Number of real keys per row [b] (the bidirectional window's edge)."""
        if self.key_valid is None:
            return (self.key_positions.max(-1).values + 1).expand(self.batch)
        return self.key_valid.sum(-1)

    @property
    def batch(self) -> int:
        sizes = [self.query_positions.shape[0], self.key_positions.shape[0]]
        sizes += [m.shape[0] for m in (self.key_valid, self.dense_mask) if m is not None]
        return max(sizes)

    def key_counts(self) -> torch.Tensor:
        """n of LogN per query [b, q]: the number of keys it can see (causal: absolute position + 1)."""
        if self.causal:
            return self.query_positions + 1
        n = self.lengths()[:, None] if self.key_valid is not None else self.key_positions.shape[-1]
        return torch.zeros_like(self.query_positions) + n

    def remember(self, key: str, rows: slice, build):
        """`build()` once per forward for the whole sequence (every layer asks the same); chunks are recomputed."""
        if rows != slice(None):
            return build()
        if key not in self.memo:
            self.memo[key] = build()
        return self.memo[key]

    def distance(self, rows: slice = slice(None)) -> torch.Tensor:
        """t for a chunk of queries: [b, 1, c, kv] long."""
        return self.remember("distance", rows, lambda: distance(
            self.query_positions[:, rows, None], self.key_positions[:, None, :], self.causal)[:, None])

    def visible(self, config, rows: slice = slice(None)) -> torch.Tensor:
        """Which keys each query of a chunk may see: [b, 1, c, kv] bool. A row that sees nothing (a padding query)
        sees everything instead, so every backend gives finite values there (they are ignored)."""
        return self.remember("visible", rows, lambda: self._visible(config, rows))

    def _visible(self, config, rows: slice) -> torch.Tensor:
        device = self.key_positions.device
        valid = None if self.key_valid is None else self.key_valid[:, None, :]
        lengths = self.lengths()[:, None, None] if config.attention_sparsity == "window" and not self.causal else None
        query_idx = self.query_offset + torch.arange(self.query_positions.shape[-1], device=device)[rows, None]
        key_idx = torch.arange(self.key_positions.shape[-1], device=device)
        allowed = support(query_idx[None], key_idx[None, None], self.query_positions[:, rows, None],
                          self.key_positions[:, None, :], valid, lengths, config, self.causal)
        if self.dense_mask is not None:
            allowed = allowed & self.dense_mask[:, 0, rows]
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        return allowed[:, None]

    def is_plain(self, config) -> bool:
        """True when the visible set is exactly causal (or everything): SDPA can use is_causal / no mask."""
        return self.key_valid is None and self.dense_mask is None and config.attention_sparsity == "none"


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """A transformers 4-D mask (bool, or additive float with large negatives) as a bool 'visible' mask."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2
