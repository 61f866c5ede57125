"""Which keys each query sees (docs/attention.md, "Positions in cached decoding and packing"): `AttentionLayout`,
built once per forward by AnGPTModel and read by every backend (attention_angpt.py, flex_angpt.py).

`AttentionLayout` carries O(T) facts per batch row: the absolute positions of the queries and of the keys (a KV
cache carries its keys' positions, `cached_key_positions`), which keys are real tokens, and, for padding-free
packing, which packed sequence each key belongs to. Positions count real tokens (with a 2-D padding mask, position =
number of real tokens before it, as `generate` does), so distances t = i − j and block boundaries do not move under
left padding or a position offset, and cached decoding equals the full forward. The sparsity pattern comes from its
registry (sparsity_angpt.py); this file knows nothing of the backends.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .sparsity_angpt import SPARSITIES, support


def positions_from_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of each token = number of real tokens before it (padding gets 0; it is masked anyway)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sequence_ids(positions: torch.Tensor) -> torch.Tensor:
    """Packed sequence index of each token [b, n]: a new sequence starts wherever a position does not follow its
    predecessor (transformers' `find_packed_sequence_indices`, without its data-dependent early exit)."""
    step = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1)
    return (step != 1).cumsum(-1)


def cached_key_positions(cache, positions: torch.Tensor, past_seen, key_length: int) -> torch.Tensor:
    """Absolute positions of every key the attention sees [b, kv], kept on the cache next to the keys (distances
    are measured on absolute positions, so an offset or left padding survives decoding: docs/attention.md). A static
    (compileable) cache gets one [b, max_cache_len] buffer written in place like its keys; unwritten slots are
    hidden by causality-by-index. A dynamic cache grows it; one filled by other code counts its keys from 0."""
    batch, new = positions.shape
    stored = getattr(cache, "angpt_key_positions", None)
    if cache.is_compileable:
        if stored is None or tuple(stored.shape) != (batch, key_length) or stored.device != positions.device:
            stored = torch.zeros(batch, key_length, dtype=torch.long, device=positions.device)
            if not torch.compiler.is_compiling():
                torch._dynamo.mark_static_address(stored)
            cache.angpt_key_positions = stored
        stored.index_copy_(1, past_seen + torch.arange(new, device=positions.device), positions)
        return stored
    if stored is None or past_seen == 0 or stored.shape[0] != batch or stored.shape[1] < past_seen:
        stored = torch.arange(past_seen, device=positions.device).expand(batch, past_seen)
    stored = torch.cat([stored[:, :past_seen], positions], dim=-1)
    cache.angpt_key_positions = stored
    return stored


def every_row(rows: slice | None) -> slice:
    """A chunk's query rows, None meaning all of them. None rather than a default `slice(None)`: torch 2.11's
    dynamo stopped at the layout's default slice when compiling a decode step (fullgraph, SDPA backend)."""
    return slice(None) if rows is None else rows


@dataclass
class AttentionLayout:
    query_positions: torch.Tensor  # [b, q] long
    query_offset: torch.Tensor | int  # cache index of the first query = number of keys before it
    key_positions: torch.Tensor  # [b, kv] long
    key_valid: torch.Tensor | None  # [b, kv] bool; None = every key is a real token (no 2-D mask was given)
    causal: bool
    dense_mask: torch.Tensor | None = None  # [b, 1, q, kv] bool: a caller's own 4-D mask, intersected
    key_sequence: torch.Tensor | None = None  # [b, kv] packed-sequence ids (padding-free packing), else None
    static_keys: bool = False  # keys include a static cache's unwritten slots (no is_causal shortcut)
    # Per-forward results shared by every layer (the layout is built once per forward): whole-sequence masks,
    # FlexAttention's BlockMask. Chunks are not kept, so the chunked path stays O(chunk × T).
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, config, attention_mask, position_ids: torch.Tensor, cache, past_seen, batch: int,
              packed: bool) -> "AttentionLayout":
        """From what AnGPTModel.forward has: the query positions, a 2-D padding mask over cache + new tokens (or a
        4-D mask, or None), the cache. `packed`: the caller's position_ids may restart inside a row (no mask, no
        cache given; transformers' padding-free packing convention), so keys see only their own sequence."""
        query_positions = position_ids.expand(batch, -1)
        key_length = cache.get_mask_sizes(position_ids.shape[-1], 0)[0] if cache is not None else query_positions.shape[-1]
        key_positions = query_positions
        if cache is not None:
            key_positions = cached_key_positions(cache, query_positions, past_seen, key_length)
        dense_mask = key_valid = None
        if attention_mask is not None and attention_mask.dim() == 2:
            key_valid = attention_mask.bool()
            if key_valid.shape[-1] < key_length:  # a static cache's slots beyond the mask are not written yet
                key_valid = F.pad(key_valid, (0, key_length - key_valid.shape[-1]))
            key_valid = key_valid[:, :key_length]
        elif attention_mask is not None:
            dense_mask = as_bool_mask(attention_mask)
        key_sequence = sequence_ids(key_positions) if packed else None
        return cls(query_positions, past_seen, key_positions, key_valid, config.is_causal, dense_mask, key_sequence,
                   static_keys=cache is not None and cache.is_compileable)

    @classmethod
    def from_shapes(cls, query: torch.Tensor, key: torch.Tensor, attention_mask, causal: bool) -> "AttentionLayout":
        """Fallback when a backend is called without a layout: queries are the last q of the kv positions."""
        q_len, kv_len = query.shape[-2], key.shape[-2]
        key_positions = torch.arange(kv_len, device=query.device)[None].expand(query.shape[0], kv_len)
        dense = as_bool_mask(attention_mask) if attention_mask is not None and attention_mask.dim() == 4 else None
        return cls(key_positions[:, kv_len - q_len:], kv_len - q_len, key_positions, None, causal, dense)

    def query_indices(self, rows: slice | None = None) -> torch.Tensor:
        """Cache index of each query [q]."""
        device = self.key_positions.device
        return self.query_offset + torch.arange(self.query_positions.shape[-1], device=device)[every_row(rows)]

    def query_sequence(self, rows: slice | None = None) -> torch.Tensor | None:
        """Packed-sequence id of each query [b, q] (the key at the query's own cache index)."""
        if self.key_sequence is None:
            return None
        return self.key_sequence.index_select(1, self.query_indices(rows))

    def lengths(self, rows: slice | None = None) -> torch.Tensor:
        """Number of real keys in each query's sequence [b, q] (the bidirectional window's edge, LogN's n)."""
        valid = self.key_valid
        if self.key_sequence is None:
            total = valid.sum(-1) if valid is not None else self.key_positions.max(-1).values + 1
            return total[:, None].expand(-1, self.query_positions[:, every_row(rows)].shape[-1])
        same = self.query_sequence(rows)[:, :, None] == self.key_sequence[:, None, :]
        return (same if valid is None else same & valid[:, None, :]).sum(-1)

    def key_counts(self) -> torch.Tensor:
        """n of LogN per query [b, q]: the number of keys it can see (causal: absolute position + 1)."""
        if self.causal:
            return self.query_positions + 1
        if self.key_valid is None and self.key_sequence is None:
            return torch.full_like(self.query_positions, self.key_positions.shape[-1])
        return self.lengths()

    def remember(self, key: str, rows: slice | None, build):
        """`build()` once per forward for the whole sequence (rows None: every layer asks the same); chunks are
        recomputed."""
        if rows is not None:
            return build()
        if key not in self.memo:
            self.memo[key] = build()
        return self.memo[key]

    def visible(self, config, rows: slice | None = None) -> torch.Tensor:
        """Which keys each query of a chunk may see: [b, 1, c, kv] bool. A row that sees nothing (a padding query)
        sees everything instead, so every backend gives finite values there (they are ignored)."""
        return self.remember("visible", rows, lambda: self._visible(config, rows))

    def _visible(self, config, rows: slice | None) -> torch.Tensor:
        device = self.key_positions.device
        valid = None if self.key_valid is None else self.key_valid[:, None, :]
        lengths = None if self.causal else self.lengths(rows)[:, :, None]
        query_seq = self.query_sequence(rows)
        key_idx = torch.arange(self.key_positions.shape[-1], device=device)
        allowed = support(self.query_indices(rows)[None, :, None], key_idx[None, None],
                          self.query_positions[:, every_row(rows), None],
                          self.key_positions[:, None, :], valid, None if query_seq is None else query_seq[:, :, None],
                          None if self.key_sequence is None else self.key_sequence[:, None, :], lengths, config,
                          self.causal)
        if self.dense_mask is not None:
            allowed = allowed & self.dense_mask[:, 0, every_row(rows)]
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        return allowed[:, None]

    def is_plain(self, config) -> bool:
        """True when the visible set is exactly causal (or everything): SDPA can use is_causal / no mask."""
        return (self.key_valid is None and self.dense_mask is None and self.key_sequence is None
                and not self.static_keys and SPARSITIES[config.attention_sparsity].pattern is None)


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """A transformers 4-D mask (bool, or additive float with large negatives) as a bool 'visible' mask."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2
