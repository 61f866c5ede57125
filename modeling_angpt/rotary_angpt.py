"""Position axis of attention (SPEC.md §3.1): RoPE variants as transformers 5 spells them in `rope_parameters`.

Rotation follows NeoX "rotate half" on the first `rotary_dim` channels of each head; the rest pass through
(partial RoPE, default fraction 0.5 as in the anGPT paper). Frequencies come from transformers'
`ROPE_INIT_FUNCTIONS` wherever it has the rope type.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def default_inv_freq(config, device=None) -> torch.Tensor:
    """θ_i = base^(−2i/r) over the r = partial_rotary_factor·d_h rotated channels (rounded down to even)."""
    rope = config.rope_parameters
    dim = int(config.head_dim * rope["partial_rotary_factor"]) // 2 * 2
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / max(dim, 1)
    return 1.0 / (rope["rope_theta"] ** exponents)


def compute_inv_freq(config, device=None, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, cos/sin scaling) for `config.rope_parameters['rope_type']`."""
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "none":  # NoPE
        return torch.zeros(0, device=device), 1.0
    if rope_type == "default":
        return default_inv_freq(config, device), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_parameters['rope_type']={rope_type!r} has no frequency function; "
                         f"known: ['default', 'none', {', '.join(map(repr, sorted(ROPE_INIT_FUNCTIONS)))}]")
    return ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate the first cos.shape[-1] channels of q, k [b, h, t, d_h]; cos/sin are [b, t, r]."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == 0:
        return q, k
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate(x):
        if rotary_dim == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)

    return rotate(q), rotate(k)


class AnGPTRotaryEmbedding(nn.Module):
    """cos/sin tables for absolute positions; `inv_freq` is a non-persistent buffer re-filled in `_init_weights`."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.rope_type = config.rope_parameters["rope_type"]
        inv_freq, self.attention_scaling = compute_inv_freq(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_parameters(self) -> torch.Tensor:
        return compute_inv_freq(self.config, self.inv_freq.device)[0]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.float()  # [b, t, r/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)
