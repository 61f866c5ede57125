"""Attention: the backends that compute it and their registry (which keys each query sees: attention_layout_angpt.py).

Every backend shares transformers' signature `fn(module, q, k, v, attention_mask, scaling, dropout, **kw)
-> (out [b, t, h, d_h], weights)` with q, k, v as [b, h, t, d_h], and reads the positions it needs from the
`attention_layout` keyword (an `AttentionLayout`), built once per forward by AnGPTModel. The three attention axes
(docs/attention.md): positions are applied to q and k before any backend (modeling_angpt.py, rotary_angpt.py), a
query-scaling transform (LogN) in AnGPTAttention, every other logit transform (logit_transforms_angpt.py) and the
sparsity pattern (sparsity_angpt.py) here, read from their registries only. `eager_attention_forward` is the reference
every other path is tested against; `chunked_attention_forward` ("angpt_chunked") is the same math over chunks of
queries, so long contexts never hold a T×T tensor per head.

`ATTENTION_BACKENDS` is the one list of backends: each declares which (logit transform, sparsity) it computes
exactly, the config validates against it, and anything else raises: a backend never falls back to other math.

The files import one way: sparsity and logit transforms → the layout → FlexAttention's helpers → this file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .attention_layout_angpt import AttentionLayout, every_row
from .flex_angpt import attend as flex_attend, block_mask as flex_block_mask, mods as flex_mods
from .logit_transforms_angpt import LOGIT_TRANSFORMS, LogitTransform, head_tensor
from .sparsity_angpt import SPARSITIES, Sparsity

try:  # optional: only the [flash] extra installs it, and only on CUDA machines
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None

CHUNKED = "angpt_chunked"
FLEX_COMPILE = True  # compile flex_attention (fused kernel, no T×T scores); tests switch it off for speed
CPU_FLEX_MIN_QUERIES = 16  # fewer queries on a CPU (decoding) take the chunked eager path (flex_attention_forward)


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


def register_attention_backend(name: str, computes: Callable, function: Callable, *,
                               reads_layout: bool = False) -> AttentionBackend:
    """Make `attn_implementation=name` compute the variants `computes` accepts (also registered with transformers'
    AttentionInterface, so transformers' own code finds it by name)."""
    backend = AttentionBackend(name, computes, function, reads_layout)
    ATTENTION_BACKENDS[name] = backend
    if name not in ("eager", "sdpa", "flex_attention", "flash_attention_2"):
        AttentionInterface.register(name, function)
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


def check_attention_backend(config, implementation: str) -> None:
    """Raise a one-line ValueError naming the variant and the backends that compute it, never fall back silently.

    Called once, where the backend is chosen, not in the forward (docs/attention.md, "Backends"): by the config when
    `_attn_implementation` is set (at init, by from_pretrained's `attn_implementation=`, or by a runtime such as
    vLLM's Transformers backend assigning its own name) and by the model when transformers resolves the choice
    (`__init__`, `set_attn_implementation`, continuous batching's switch to a paged kernel). A name this registry does
    not know is one of transformers' functions, which compute plain attention only."""
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


def get_attention_function(config):
    """The registered function for `config._attn_implementation` (checked where it was chosen, see above); None
    for a name this registry does not know (the caller takes transformers' function of that name)."""
    backend = ATTENTION_BACKENDS.get(config._attn_implementation or "eager")
    return None if backend is None else backend.function
