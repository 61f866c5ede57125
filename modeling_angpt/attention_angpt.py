"""Attention backends (SPEC.md §3) behind transformers' attention interface.

Every backend shares transformers' signature `fn(module, q, k, v, attention_mask, scaling, dropout, **kw)
-> (out [b, t, h, d_h], weights)` with q, k, v as [b, h, t, d_h], and reads the positions it needs from the
`attention_layout` keyword (masks_angpt.AttentionLayout, built once per forward by AnGPTModel). The three axes:
positions are applied to q, k before any backend (rotary_angpt.py), LogN is a query scaling (AnGPTAttention),
the other logit transforms and the sparsity are computed here. `eager_attention_forward` is the reference every
other path is tested against; `chunked_attention_forward` (registered as "angpt_chunked") is the same math over
chunks of queries, so long contexts never hold a T×T tensor per head. Which backend computes which variant is
`configuration_angpt.ATTENTION_BACKEND_SUPPORT`; anything else raises, it never falls back to different math.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from .configuration_angpt import check_attention_backend
from .logit_transforms_angpt import LOGIT_TRANSFORM_FUNCTIONS, slopes_for
from .masks_angpt import AttentionLayout, distance, support

try:  # optional: only the [flash] extra installs it, and only on CUDA machines
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None

CHUNKED = "angpt_chunked"
FLEX_COMPILE = True  # compile flex_attention (fused kernel, no T×T scores); tests switch it off for speed


def _layout(module, query, key, attention_mask, kwargs) -> AttentionLayout:
    layout = kwargs.get("attention_layout")
    if layout is None:
        layout = AttentionLayout.from_shapes(query, key, attention_mask, getattr(module, "is_causal", True))
    return layout


def topk_support(scores: torch.Tensor, visible: torch.Tensor, k: int) -> torch.Tensor:
    """Keep exactly the k largest visible logits per query and head (SPEC §3.3: transform → causal/padding mask →
    top-k → softmax). `topk` + scatter gives exactly k even with ties; a row with fewer than k visible keys keeps
    them all. The selection carries no gradient (none exists); the kept logits do."""
    if k >= scores.shape[-1]:
        return visible
    with torch.no_grad():
        index = scores.masked_fill(~visible, float("-inf")).topk(k, dim=-1).indices
        keep = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, index, True)
    return keep & visible


def _attend(module, query, key, value, layout: AttentionLayout, rows: slice, scaling: float, dropout: float):
    """Eager math for one chunk of queries: [b, h, c, d_h] → (out [b, h, c, d_h], probs [b, h, c, kv])."""
    config = module.config
    groups = getattr(module, "num_key_value_groups", 1)  # GQA: query head h reads key/value head h // groups
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [b, h, c, kv]
    transform = config.attention_logit_transform
    if transform in ("alibi", "scale_invariant"):
        scores = scores.float()  # distances and log terms in float32 also under bf16 autocast (softmax is float32)
        slopes = slopes_for(config, scores.device)
        slopes = None if slopes is None else slopes.view(1, -1, 1, 1)
        scores = LOGIT_TRANSFORM_FUNCTIONS[transform](scores, layout.distance(rows), slopes, config.scale_invariant_tau)
    visible = layout.visible(config, rows)  # [b, 1, c, kv]
    if config.attention_sparsity == "topk":
        visible = topk_support(scores, visible, config.attention_topk)
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value), probs


def eager_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """The reference: every variant, the whole [b, h, T, T] score tensor at once (returns the probabilities)."""
    layout = _layout(module, query, key, attention_mask, kwargs)
    output, probs = _attend(module, query, key, value, layout, slice(None), scaling, dropout)
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
    """torch SDPA: ALiBi as an additive bias, window/block/global/padding as a boolean mask (LogN was applied to q)."""
    config = module.config
    layout = _layout(module, query, key, attention_mask, kwargs)
    q_len, kv_len = query.shape[-2], key.shape[-2]
    mask, is_causal = None, False
    if config.attention_logit_transform == "alibi":
        slopes = slopes_for(config, query.device).view(1, -1, 1, 1)
        bias = -(slopes * layout.distance().to(torch.float32)).to(query.dtype)  # [b, h, q, kv]
        mask = bias.masked_fill(~layout.visible(config), torch.finfo(query.dtype).min)
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


_compiled_flex = None


def _flex():
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention
    if not FLEX_COMPILE:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def flex_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """FlexAttention: the logit transform as `score_mod`, causal/padding/window/block/global as a BlockMask from
    `mask_mod` (the same elementwise functions as the eager path). Compiled it never materialises scores; on CPU
    it has no backward (train there with angpt_chunked)."""
    from torch.nn.attention.flex_attention import create_block_mask

    config = module.config
    if dropout:
        raise ValueError("flex_attention has no attention dropout; set attention_dropout=0 or use eager/angpt_chunked")
    layout = _layout(module, query, key, attention_mask, kwargs)
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[-2]
    query_pos = layout.query_positions.expand(batch, q_len).contiguous()
    key_pos = layout.key_positions.expand(batch, kv_len).contiguous()
    valid = None if layout.key_valid is None else layout.key_valid.expand(batch, kv_len).contiguous()
    lengths = layout.lengths().expand(batch).contiguous()
    dense = None if layout.dense_mask is None else layout.dense_mask.expand(batch, 1, q_len, kv_len)
    offset, causal = layout.query_offset, layout.causal

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = support(q_idx + offset, kv_idx, query_pos[b, q_idx], key_pos[b, kv_idx],
                          None if valid is None else valid[b, kv_idx], lengths[b], config, causal)
        return allowed if dense is None else allowed & dense[b, 0, q_idx, kv_idx]

    score_mod = None
    transform = config.attention_logit_transform
    if transform in ("alibi", "scale_invariant"):
        function, tau = LOGIT_TRANSFORM_FUNCTIONS[transform], config.scale_invariant_tau
        slopes = slopes_for(config, query.device)

        def score_mod(score, b, h, q_idx, kv_idx):
            t = distance(query_pos[b, q_idx], key_pos[b, kv_idx], causal)
            return function(score, t, None if slopes is None else slopes[h], tau)

    # One BlockMask per forward, shared by every layer (building it costs O(T²) work outside the kernel).
    block_mask = layout.remember("flex_block_mask", slice(None), lambda: create_block_mask(
        mask_mod, batch, None, q_len, kv_len, device=query.device, _compile=FLEX_COMPILE))
    output = _flex()(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling,
                     enable_gqa=getattr(module, "num_key_value_groups", 1) > 1)
    return output.transpose(1, 2).contiguous(), None


def flash_alibi_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """flash-attn 2 with its `alibi_slopes` (bias −m·|i + kv − q − j|, bottom-right aligned: KV caches work)."""
    if flash_attn_func is None:
        raise ImportError("attn_implementation='flash_attention_2' needs flash-attn (pip install .[flash] on CUDA)")
    layout = _layout(module, query, key, attention_mask, kwargs)
    if layout.key_valid is not None or layout.dense_mask is not None:
        raise ValueError("attention_logit_transform='alibi' on flash_attention_2 supports unpadded batches only; "
                         "use sdpa, flex_attention, eager or angpt_chunked for padded batches")
    slopes = slopes_for(module.config, query.device)
    output = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p=dropout,
                             softmax_scale=scaling, causal=layout.causal, alibi_slopes=slopes)
    return output, None


# Backends that read the AttentionLayout (AnGPTModel builds no transformers mask for them).
LAYOUT_BACKENDS = {"eager": eager_attention_forward, CHUNKED: chunked_attention_forward,
                   "sdpa": sdpa_attention_forward, "flex_attention": flex_attention_forward}

AttentionInterface.register(CHUNKED, chunked_attention_forward)
AttentionMaskInterface.register(CHUNKED, sdpa_mask)  # if anyone builds a transformers mask for it


def uses_layout(config) -> bool:
    return (config._attn_implementation or "eager") in LAYOUT_BACKENDS


def get_attention_function(config):
    """Our backend for `config._attn_implementation`, after checking that it computes this variant exactly;
    None means transformers' registered function of that name (ALL_ATTENTION_FUNCTIONS) computes it."""
    implementation = config._attn_implementation or "eager"
    check_attention_backend(config, implementation)
    if implementation in LAYOUT_BACKENDS:
        return LAYOUT_BACKENDS[implementation]
    if implementation == "flash_attention_2" and config.attention_logit_transform == "alibi":
        return flash_alibi_attention_forward
    return None
