"""Attention: which keys each query sees (`AttentionLayout`), the backends that compute it, and their registry.

Every backend shares transformers' signature `fn(module, q, k, v, attention_mask, scaling, dropout, **kw)
-> (out [b, t, h, d_h], weights)` with q, k, v as [b, h, t, d_h], and reads the positions it needs from the
`attention_layout` keyword, built once per forward by AnGPTModel. The three attention axes (docs/attention.md):
positions are applied to q and k before any backend (modeling_angpt.py, rotary_angpt.py), a query-scaling transform
(LogN) in AnGPTAttention, every other logit transform (logit_transforms_angpt.py) and the sparsity pattern
(sparsity_angpt.py) here, read from their registries only. `eager_attention_forward` is the reference every other
path is tested against; `chunked_attention_forward` ("angpt_chunked") is the same math over chunks of queries, so
long contexts never hold a T×T tensor per head.

`ATTENTION_BACKENDS` is the one list of backends: each declares which (logit transform, sparsity) it computes
exactly, the config validates against it, and anything else raises: a backend never falls back to other math.

`AttentionLayout` carries O(T) facts per batch row: the absolute positions of the queries and of the keys (a KV
cache carries its keys' positions, `cached_key_positions`), which keys are real tokens, and, for padding-free
packing, which packed sequence each key belongs to. Positions count real tokens (with a 2-D padding mask, position =
number of real tokens before it, as `generate` does), so distances t = i − j and block boundaries do not move under
left padding or a position offset, and cached decoding equals the full forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .flex_angpt import attend as flex_attend, block_mask as flex_block_mask, mods as flex_mods
from .logit_transforms_angpt import LOGIT_TRANSFORMS, LogitTransform, _on_register as _transform_hooks, head_tensor
from .sparsity_angpt import SPARSITIES, Sparsity, _on_register as _sparsity_hooks, support

try:  # optional: only the [flash] extra installs it, and only on CUDA machines
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None

CHUNKED = "angpt_chunked"
FLEX_COMPILE = True  # compile flex_attention (fused kernel, no T×T scores); tests switch it off for speed
CPU_FLEX_MIN_QUERIES = 16  # fewer queries on a CPU (decoding) take the chunked eager path (flex_attention_forward)


# --- which keys each query sees ------------------------------------------------------------------------------------
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


# --- the backends ---------------------------------------------------------------------------------------------------
def _layout(module, query, key, attention_mask, kwargs) -> AttentionLayout:
    layout = kwargs.get("attention_layout")
    if layout is None:
        layout = AttentionLayout.from_shapes(query, key, attention_mask, getattr(module, "is_causal", True))
    return layout


def _transformed_scores(config, scores: torch.Tensor, layout: AttentionLayout, rows: slice | None) -> torch.Tensor:
    """The registered logit transform on a [b, h, c, kv] block of scores (float32 also under bf16 autocast)."""
    transform = LOGIT_TRANSFORMS[config.attention_logit_transform]
    if transform.score is None:
        return scores
    head = head_tensor(transform, config, scores.device)
    return transform.score(scores.float(), layout.query_positions[:, None, every_row(rows), None],
                           layout.key_positions[:, None, None, :], None if head is None else head.view(1, -1, 1, 1),
                           config)


def _attend(module, query, key, value, layout: AttentionLayout, rows: slice | None, scaling: float, dropout: float):
    """Eager math for one chunk of queries: [b, h, c, d_h] → (out [b, h, c, d_h], probs [b, h, c, kv])."""
    config = module.config
    groups = getattr(module, "num_key_value_groups", 1)  # GQA: query head h reads key/value head h // groups
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scores = _transformed_scores(config, torch.matmul(query, key.transpose(2, 3)) * scaling, layout, rows)
    visible = layout.visible(config, rows)  # [b, 1, c, kv]
    select = SPARSITIES[config.attention_sparsity].select
    if select is not None:
        visible = select(scores, visible, config)
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value), probs


def eager_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """The reference: every variant, the whole [b, h, T, T] score tensor at once (returns the probabilities)."""
    layout = _layout(module, query, key, attention_mask, kwargs)
    output, probs = _attend(module, query, key, value, layout, None, scaling, dropout)
    return output.transpose(1, 2).contiguous(), probs


def chunked_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """The eager math over chunks of `config.attention_query_chunk_size` queries: at most [b, h, C, T] scores at a time.
    With gradients each chunk is recomputed in backward (activation checkpointing), so training memory stays
    O(C·T) per head too. Exact: softmax and top-k are per query row."""
    layout = _layout(module, query, key, attention_mask, kwargs)
    size, length = module.config.attention_query_chunk_size, query.shape[-2]
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))

    def chunk(q, k, v, start):
        return _attend(module, q, k, v, layout, slice(start, start + q.shape[-2]), scaling, dropout)[0]

    outputs = []
    for start in range(0, length, size):
        q = query[:, :, start:start + size]
        if recompute and length > size:
            outputs.append(checkpoint(chunk, q, key, value, start, use_reentrant=False))
        else:
            outputs.append(chunk(q, key, value, start))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def sdpa_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """torch SDPA: an additive transform (ALiBi) as a float bias, window/block/global/padding/packing as a boolean
    mask (LogN was applied to q)."""
    config = module.config
    layout = _layout(module, query, key, attention_mask, kwargs)
    q_len, kv_len = query.shape[-2], key.shape[-2]
    mask, is_causal = None, False
    if LOGIT_TRANSFORMS[config.attention_logit_transform].additive:
        bias = _transformed_scores(config, query.new_zeros((), dtype=torch.float32), layout, None)
        mask = bias.to(query.dtype).masked_fill(~layout.visible(config), torch.finfo(query.dtype).min)
    elif not layout.is_plain(config):
        mask = layout.visible(config)
    elif layout.causal and q_len == kv_len:
        is_causal = True
    elif layout.causal and q_len > 1:  # a chunk of new queries after a cache: bottom-right causal
        mask = layout.visible(config)
    output = nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=scaling,
        enable_gqa=getattr(module, "num_key_value_groups", 1) > 1)
    return output.transpose(1, 2).contiguous(), None


def flex_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """FlexAttention: the logit transform as `score_mod`, causal/padding/window/block/global as a BlockMask from
    `mask_mod` (the same elementwise functions as the eager path; flex_angpt.py). Compiled (FLEX_COMPILE) it never
    materialises scores and compiles once for every length, batch size and layer; on CPU it has no backward
    (train there with angpt_chunked)."""
    config = module.config
    if dropout:
        raise ValueError("flex_attention has no attention dropout; set attention_dropout=0 or use eager/angpt_chunked")
    batch, _, q_len, _ = query.shape
    if FLEX_COMPILE and query.device.type == "cpu" and q_len < CPU_FLEX_MIN_QUERIES:
        # torch 2.13's compiled CPU FlexAttention kernel is wrong by up to 1e-2 for a few queries at a time on an
        # AVX2-only CPU (decoding, small chunked-prefill pieces; 16 and more queries match the eager path, as does
        # uncompiled flex_attention). There the chunked eager path is cheap anyway: q × T scores.
        return chunked_attention_forward(module, query, key, value, attention_mask, scaling, **kwargs)
    layout = _layout(module, query, key, attention_mask, kwargs)
    kv_len = key.shape[-2]
    # One BlockMask and one score_mod per forward, shared by every layer (the BlockMask costs O(T²) mask_mod
    # evaluations outside the kernel).
    mask_mod, score_mod = layout.remember("flex_mods", None, lambda: flex_mods(
        config, layout, query.device, batch, q_len, kv_len))
    block_mask = layout.remember("flex_block_mask", None, lambda: flex_block_mask(
        mask_mod, batch, q_len, kv_len, query.device))
    output = flex_attend(query, key, value, score_mod, block_mask, scaling,
                         getattr(module, "num_key_value_groups", 1) > 1, FLEX_COMPILE)
    if output is None:  # the compiler failed (warned once): the same math, chunk by chunk
        return chunked_attention_forward(module, query, key, value, attention_mask, scaling, **kwargs)
    return output.transpose(1, 2).contiguous(), None


def flash_alibi_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """flash-attn 2 with its `alibi_slopes` (bias −m·|i + kv − q − j|, bottom-right aligned: KV caches work)."""
    if flash_attn_func is None:
        raise ImportError("attn_implementation='flash_attention_2' needs flash-attn (pip install .[flash] on CUDA)")
    layout = _layout(module, query, key, attention_mask, kwargs)
    if layout.key_valid is not None or layout.dense_mask is not None or layout.key_sequence is not None:
        raise ValueError("attention_logit_transform='alibi' on flash_attention_2 supports unpadded, unpacked batches "
                         "only; use sdpa, flex_attention, eager or angpt_chunked for padded or packed batches")
    transform = LOGIT_TRANSFORMS[module.config.attention_logit_transform]
    slopes = head_tensor(transform, module.config, query.device)
    output = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p=dropout,
                             softmax_scale=scaling, causal=layout.causal, alibi_slopes=slopes)
    return output, None


def flash_attention_forward(module: nn.Module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                            **kwargs):
    """flash-attn 2: ALiBi through its own `alibi_slopes`, plain attention through transformers' function."""
    if LOGIT_TRANSFORMS[module.config.attention_logit_transform].flash_alibi:
        return flash_alibi_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    plain = ALL_ATTENTION_FUNCTIONS["flash_attention_2"]
    return plain(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


# --- the registry --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionBackend:
    """computes: (LogitTransform, Sparsity) -> whether this backend computes that variant exactly.
    function: transformers' attention signature. reads_layout: it reads the AttentionLayout, so AnGPTModel builds
    no transformers mask for it."""
    name: str
    computes: Callable[[LogitTransform, Sparsity], bool]
    function: Callable
    reads_layout: bool = False


ATTENTION_BACKENDS: dict[str, AttentionBackend] = {}
_checked: set = set()  # (implementation, transform, sparsity) already checked: once, not per layer and forward
_transform_hooks.append(_checked.clear)
_sparsity_hooks.append(_checked.clear)


def register_attention_backend(name: str, computes: Callable, function: Callable, *,
                               reads_layout: bool = False) -> AttentionBackend:
    """Make `attn_implementation=name` compute the variants `computes` accepts (also registered with transformers'
    AttentionInterface, so transformers' own code finds it by name)."""
    backend = AttentionBackend(name, computes, function, reads_layout)
    ATTENTION_BACKENDS[name] = backend
    if name not in ("eager", "sdpa", "flex_attention", "flash_attention_2"):
        AttentionInterface.register(name, function)
    _checked.clear()
    return backend


def plain_attention_only(transform: LogitTransform, sparsity: Sparsity) -> bool:
    """What a backend that knows nothing of the variants computes (transformers' others: paged, vLLM, ...)."""
    return transform.score is None and sparsity.pattern is None and sparsity.select is None


# Positions are applied to q and k outside every kernel and a query scaling (LogN) runs anywhere, so a backend
# declares only which scores and which sparsity it computes.
register_attention_backend("eager", lambda transform, sparsity: True, eager_attention_forward, reads_layout=True)
register_attention_backend(CHUNKED, lambda transform, sparsity: True, chunked_attention_forward, reads_layout=True)
register_attention_backend(  # an additive score as a float bias, any pattern as a boolean mask
    "sdpa", lambda transform, sparsity: (transform.score is None or transform.additive) and sparsity.select is None,
    sdpa_attention_forward, reads_layout=True)
register_attention_backend(  # any elementwise score as score_mod, any pattern as a BlockMask
    "flex_attention", lambda transform, sparsity: sparsity.select is None, flex_attention_forward, reads_layout=True)
register_attention_backend(  # ALiBi natively, no sparsity
    "flash_attention_2", lambda transform, sparsity: ((transform.score is None or transform.flash_alibi)
                                                      and sparsity.pattern is None and sparsity.select is None),
    flash_attention_forward)
AttentionMaskInterface.register(CHUNKED, sdpa_mask)  # if anyone builds a transformers mask for it


def backend_computes(implementation: str, transform: str, sparsity: str) -> bool:
    """Whether `attn_implementation=implementation` computes this (logit transform, sparsity) exactly."""
    backend = ATTENTION_BACKENDS.get(implementation)
    rule = backend.computes if backend is not None else plain_attention_only
    return rule(LOGIT_TRANSFORMS[transform], SPARSITIES[sparsity])


def attention_backends_supporting(transform: str, sparsity: str) -> list[str]:
    return [name for name in ATTENTION_BACKENDS if backend_computes(name, transform, sparsity)]


def check_attention_backend(config, implementation: str | None) -> None:
    """Raise a ValueError naming the variant and the backends that compute it, never fall back silently."""
    implementation = implementation or "eager"
    transform, sparsity = config.attention_logit_transform, config.attention_sparsity
    if not backend_computes(implementation, transform, sparsity):
        raise ValueError(
            f"attention_logit_transform={transform!r} with attention_sparsity={sparsity!r} cannot run on "
            f"attn_implementation={implementation!r}; backends that compute it: "
            f"{attention_backends_supporting(transform, sparsity)} (set it with "
            f"model.set_attn_implementation(...) or from_pretrained(..., attn_implementation=...))")


def uses_layout(config) -> bool:
    backend = ATTENTION_BACKENDS.get(config._attn_implementation or "eager")
    return backend is not None and backend.reads_layout


def check_attention_backend_once(config) -> None:
    """check_attention_backend, memoised per (backend, transform, sparsity). AnGPTModel.forward calls it once per
    forward, outside the decoder blocks, so blocks compiled on their own (training's compile_blocks) never guard on
    the memo."""
    key = (config._attn_implementation or "eager", config.attention_logit_transform, config.attention_sparsity)
    if key not in _checked:
        check_attention_backend(config, key[0])
        _checked.add(key)


def get_attention_function(config):
    """The registered function for `config._attn_implementation` (checked by the model's forward, see above); None
    for a name this registry does not know (the caller takes transformers' function of that name)."""
    backend = ATTENTION_BACKENDS.get(config._attn_implementation or "eager")
    return None if backend is None else backend.function
