"""Attention backends (SPEC.md §3) behind transformers' attention interface.

Every backend shares transformers' signature `fn(module, q, k, v, attention_mask, scaling, dropout, **kw)
-> (out [b, t, h, d_h], weights)` with q, k, v as [b, h, t, d_h]. `eager_attention_forward` is the reference
that every other path is tested against.
"""
from __future__ import annotations

import torch
from torch import nn


def eager_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [b, h, q, kv]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()  # [b, q, h, d_h]
    return output, probs
