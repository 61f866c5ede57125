"""Position axis of attention (SPEC.md §3.1): RoPE variants as transformers 5 spells them in `rope_parameters`.

Rotation follows NeoX "rotate half": channel c pairs with c + r/2 over the first r channels of each head, r being
2·len(inv_freq); the other channels pass through. `default` rotates r = partial_rotary_factor·d_h channels (NeoX
partial RoPE, the anGPT paper's 0.5). `proportional` and `scale_invariant_p` rotate the whole head with zero
frequencies on the non-rotating pairs, as their papers define them. Frequencies come from transformers'
`ROPE_INIT_FUNCTIONS` wherever it has the rope type (linear, dynamic, yarn, proportional, ...).
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def default_inv_freq(config, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
    """θ_i = base^(−2i/r) over the r = partial_rotary_factor·d_h rotated channels (rounded down to even).
    partial_rotary_factor = 0 gives no rotated channel: NoPE."""
    rope = config.rope_parameters
    dim = int(config.head_dim * rope["partial_rotary_factor"]) // 2 * 2
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / max(dim, 1)
    return 1.0 / (rope["rope_theta"] ** exponents), 1.0


def scale_invariant_p_inv_freq(config, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
    """The scale-invariant paper's p-RoPE (research note §2.2, modded-nanogpt's "half-truncated RoPE"):
    n = p·d_h/2 rotating pairs with ω_k = B^(−k/(n−1)), k = 0 … n−1 (from 1 down to 1/B, B = effective_base = 1024),
    and d_h/2 − n pairs with ω = 0. With the default p = 0.5 that is d_h/4 rotating pairs."""
    rope = config.rope_parameters
    pairs = config.head_dim // 2
    rotating = int(rope["partial_rotary_factor"] * pairs)
    steps = torch.arange(rotating, dtype=torch.float32, device=device) / max(rotating - 1, 1)
    omega = float(rope["effective_base"]) ** -steps
    return torch.cat([omega, torch.zeros(pairs - rotating, device=device)]), 1.0


def no_rope(config, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
    return torch.zeros(0, device=device), 1.0  # NoPE


# Registry keyed by config.rope_parameters["rope_type"]; transformers' functions fill in the rest.
ANGPT_ROPE_FUNCTIONS = {"default": default_inv_freq, "scale_invariant_p": scale_invariant_p_inv_freq, "none": no_rope}


def compute_inv_freq(config, device=None, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, cos/sin scaling) for `config.rope_parameters['rope_type']`."""
    rope_type = config.rope_parameters["rope_type"]
    function = ANGPT_ROPE_FUNCTIONS.get(rope_type) or ROPE_INIT_FUNCTIONS.get(rope_type)
    if function is None:
        raise ValueError(f"rope_parameters['rope_type']={rope_type!r} has no frequency function; "
                         f"known: {sorted(set(ANGPT_ROPE_FUNCTIONS) | set(ROPE_INIT_FUNCTIONS))}")
    inv_freq, scaling = function(config, device, seq_len)
    return inv_freq.float(), float(scaling)


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
    """cos/sin tables for absolute positions; `inv_freq` is a non-persistent buffer re-filled in `_init_weights`.

    Dynamic NTK: the base depends on a sequence length L (θ' = θ·(L/L_train)^(r/(r−2)) when L > L_train, computed by
    transformers' `ROPE_INIT_FUNCTIONS["dynamic"]`). Keys in a KV cache were rotated with the base of the forward
    that computed them, so a base that changes while decoding would make them inconsistent with new queries (and
    the hidden states of later layers would differ anyway). We therefore fix the base for a whole sequence:
    L = the `rope_seq_len` the caller passes (the total length known up front, e.g. prompt + new tokens), otherwise
    the length of the first forward that filled the cache (max position + 1), remembered on the cache. Cached
    decoding then equals a full forward computed with the same L exactly.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.rope_type = config.rope_parameters["rope_type"]
        inv_freq, self.attention_scaling = compute_inv_freq(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_parameters(self) -> torch.Tensor:
        return compute_inv_freq(self.config, self.inv_freq.device)[0]

    def sequence_length(self, position_ids: torch.Tensor, past_key_values=None, rope_seq_len: int | None = None):
        """The L that fixes the dynamic NTK base for this forward (None for every other rope type)."""
        if self.rope_type != "dynamic":
            return None
        if rope_seq_len is None:
            rope_seq_len = getattr(past_key_values, "angpt_rope_seq_len", None)
        if rope_seq_len is None:
            rope_seq_len = int(position_ids.max()) + 1
        if past_key_values is not None:
            past_key_values.angpt_rope_seq_len = int(rope_seq_len)
        return int(rope_seq_len)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, seq_len: int | None = None):
        inv_freq = self.inv_freq
        if seq_len is not None:  # dynamic NTK: frequencies for this forward's fixed L (see the class docstring)
            inv_freq = compute_inv_freq(self.config, x.device, seq_len)[0]
        freqs = position_ids[..., None].float() * inv_freq.float()  # [b, t, r/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)
