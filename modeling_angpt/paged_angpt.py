"""Continuous batching: transformers' paged KV cache (`PagedAttentionCache`), as `model.generate_batch(...)` and
`transformers serve --continuous-batching` use it (docs/tools.md, "continuous batching").

The batching manager hands the model one flattened row of every request's new tokens: `position_ids` restart at each
request, `cu_seq_lens_q`/`cu_seq_lens_k`, `read_index`/`write_index` into the cache's pages, a prepared 4-D mask for
"paged|eager"/"sdpa" (none for flash kernels), and the cache. The cache's `update` gathers each request's keys from
its pages and narrows those keyword arguments to the layer, so attention runs through transformers' own function for
the implementation the manager chose, with the keyword arguments passed through; our backends, which read an
`AttentionLayout` of positions, are not used on this path. Hence only plain attention runs here: a logit transform on
the scores (ALiBi, scale-invariant logits) or a sparsity pattern is refused in one line, as is what the paged cache
cannot carry (below). LogN is a query scaling and runs anywhere: its n = position + 1 comes from the positions.
"""
from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention_angpt import plain_attention_only
from .attention_layout_angpt import AttentionLayout
from .logit_transforms_angpt import LOGIT_TRANSFORMS
from .rotary_angpt import ROPE_TYPES
from .sparsity_angpt import SPARSITIES

try:  # transformers' continuous batching (5.x); without it no paged cache can reach the model
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
except ImportError:  # pragma: no cover - depends on the transformers version
    PagedAttentionCache = ()


def is_paged(cache) -> bool:
    return isinstance(cache, PagedAttentionCache)


def check_paged_support(config, is_causal: bool | None = None) -> None:
    """Raise a one-line ValueError when continuous batching cannot compute this model exactly. `is_causal`: the
    model's own (inside a forward, transformers' `merge_with_config_defaults` has set config.is_causal to the batching
    manager's `is_causal` keyword, which is False whenever it passes a mask)."""
    transform, sparsity = config.attention_logit_transform, config.attention_sparsity
    if not plain_attention_only(LOGIT_TRANSFORMS[transform], SPARSITIES[sparsity]):
        raise ValueError(f"continuous batching (paged KV cache) runs transformers' plain attention functions; "
                         f"attention_logit_transform={transform!r} with attention_sparsity={sparsity!r} needs this "
                         "model's own backends: use model.generate(...) instead")
    if not (config.is_causal if is_causal is None else is_causal):
        raise ValueError("continuous batching (paged KV cache) decodes causal models only; this config has "
                         "is_causal=False")
    if ROPE_TYPES[config.rope_parameters["rope_type"]].length_dependent:
        # generate fixes dynamic NTK's base from each request's prompt length (AnGPTRotaryEmbedding); a decoding step
        # of the paged batch carries one token per request and no prompt length to fix it from
        raise ValueError("continuous batching (paged KV cache) cannot fix dynamic NTK's rope base per request "
                         "(rope_parameters['rope_type']='dynamic'): use model.generate(...) instead")


def paged_layout(position_ids: torch.Tensor) -> AttentionLayout:
    """What the attention reads of the layout on this path: the queries' positions (LogN's n = position + 1). The
    keys live in the cache's pages, gathered per layer by `cache.update`, and no backend here reads them."""
    return AttentionLayout(position_ids, 0, position_ids, None, True)


def update_paged_cache(cache, key: torch.Tensor, value: torch.Tensor, layer_idx: int, kwargs: dict):
    """Write this layer's new keys/values into their pages and return every request's keys/values [1, h_kv, kv, d_h];
    the cache narrows `kwargs` (cu_seq_lens_k, max_length_k, ...) to this layer in place, as the attention expects."""
    return cache.update(key, value, layer_idx, kwargs=kwargs)


def paged_attention_function(config):
    """transformers' attention function for the implementation the batching manager set ("paged|eager", "sdpa", a
    flash kernel), not our registry's function of the same name (ours read the layout, which has no keys here)."""
    name = config._attn_implementation
    return ALL_ATTENTION_FUNCTIONS["paged|eager" if name in (None, "eager") else name]
