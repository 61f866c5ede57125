"""Position axis of attention (docs/attention.md, "Position"): the RoPE types, as transformers 5 spells them in
`rope_parameters`, in one registry (`ROPE_TYPES`) that the config validates against and the rotary embedding at
the end of this file reads. A new type is one frequency function plus one `register_rope_type` call.

Rotation follows NeoX "rotate half": channel c pairs with c + r/2 over the first r channels of each head, r being
2·len(inv_freq); the other channels pass through. `default` rotates r = partial_rotary_factor·d_h channels (NeoX
partial RoPE, the anGPT paper's 0.5). `proportional` and `scale_invariant_p` rotate the whole head with zero
frequencies on the non-rotating pairs, as their papers define them. Frequencies come from transformers'
`ROPE_INIT_FUNCTIONS` wherever it has the rope type (linear, dynamic, yarn, proportional). The model's rotary
embedding (`AnGPTRotaryEmbedding`, the cos/sin tables) and the rotation of q and k (`apply_rotary`) close the file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


@dataclass(frozen=True)
class RopeType:
    """inv_freq: (config, device, seq_len) -> (inverse frequencies [r/2], cos/sin scaling). defaults: keys of
    `rope_parameters` filled in when absent (they are then required by transformers' validation). positive: keys
    that must be positive numbers. length_dependent: the frequencies depend on the sequence length (dynamic NTK)."""
    name: str
    inv_freq: Callable
    defaults: dict = field(default_factory=dict)
    positive: tuple[str, ...] = ()
    length_dependent: bool = False


ROPE_TYPES: dict[str, RopeType] = {}


def register_rope_type(name: str, inv_freq: Callable, *, defaults: dict | None = None, positive: tuple = (),
                       length_dependent: bool = False) -> RopeType:
    """Make `rope_parameters={"rope_type": name, ...}` available to configs (like `register_logit_transform`, a
    custom type does not travel with a checkpoint: register it again before loading one)."""
    rope_type = RopeType(name, inv_freq, dict(defaults or {}), tuple(positive), length_dependent)
    ROPE_TYPES[name] = rope_type
    return rope_type


def default_inv_freq(config, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
    """θ_i = base^(−2i/r) over the r = partial_rotary_factor·d_h rotated channels (rounded down to even).
    partial_rotary_factor = 0 gives no rotated channel: NoPE."""
    rope = config.rope_parameters
    dim = int(config.head_dim * rope["partial_rotary_factor"]) // 2 * 2
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / max(dim, 1)
    return 1.0 / (rope["rope_theta"] ** exponents), 1.0


def scale_invariant_p_inv_freq(config, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
    """The scale-invariant paper's p-RoPE (docs/attention.md, "Position"; modded-nanogpt's "half-truncated RoPE"):
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


register_rope_type("default", default_inv_freq)
register_rope_type("none", no_rope)
register_rope_type("scale_invariant_p", scale_invariant_p_inv_freq, defaults={"effective_base": 1024.0},
                   positive=("effective_base",))  # ω from 1 down to 1/1024 (docs/attention.md, "Position")
register_rope_type("proportional", ROPE_INIT_FUNCTIONS["proportional"])
# dynamic NTK with factor 1 is the paper's θ·(L/L_train)^(d/(d−2))
register_rope_type("dynamic", ROPE_INIT_FUNCTIONS["dynamic"], defaults={"factor": 1.0}, positive=("factor",),
                   length_dependent=True)
register_rope_type("linear", ROPE_INIT_FUNCTIONS["linear"], defaults={"factor": 1.0}, positive=("factor",))
register_rope_type("yarn", ROPE_INIT_FUNCTIONS["yarn"], positive=("factor",))


def compute_inv_freq(config, device=None, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, cos/sin scaling) for `config.rope_parameters['rope_type']`."""
    rope_type = config.rope_parameters["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_parameters['rope_type']={rope_type!r} is not a registered rope type; "
                         f"registered: {sorted(ROPE_TYPES)}")
    inv_freq, scaling = ROPE_TYPES[rope_type].inv_freq(config, device, seq_len)
    return inv_freq.float(), float(scaling)


def per_sequence_inv_freq(config, positions: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
    """A length-dependent rope type (dynamic NTK) in a padding-free packed batch: each token's inverse frequencies
    [b, n, r/2] for L = its own sequence's length (the largest position in it + 1), as if each sequence ran alone,
    not the largest position of the whole flattened batch. One table per distinct length (a few per batch)."""
    largest = torch.zeros_like(positions).scatter_reduce(1, sequence, positions, "amax")  # [b, n], by sequence id
    lengths = largest.gather(1, sequence) + 1  # [b, n]
    distinct = lengths.unique()  # sorted
    table = torch.stack([compute_inv_freq(config, positions.device, int(n))[0] for n in distinct.tolist()])
    return table[torch.searchsorted(distinct, lengths)]  # [b, n, r/2]


# --- the rotary embedding the model runs (modeling_angpt.py) ------------------------------------------------------
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
    decoding then equals a full forward computed with the same L exactly. Called on its own without `seq_len`, the
    module takes L = max position + 1 of the positions it is given (as transformers' rotary modules do).
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.length_dependent = ROPE_TYPES[config.rope_parameters["rope_type"]].length_dependent
        inv_freq, self.attention_scaling = compute_inv_freq(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_parameters(self) -> torch.Tensor:
        return compute_inv_freq(self.config, self.inv_freq.device)[0]

    def sequence_length(self, position_ids: torch.Tensor, past_key_values=None, rope_seq_len: int | None = None,
                        packed: bool = False):
        """The L that fixes the dynamic NTK base for this forward (None for every other rope type, and for a packed
        batch, whose sequences each take their own: see forward's `sequence`)."""
        if not self.length_dependent or (packed and rope_seq_len is None):
            return None
        if rope_seq_len is None:
            rope_seq_len = getattr(past_key_values, "angpt_rope_seq_len", None)
        if rope_seq_len is None:
            rope_seq_len = int(position_ids.max()) + 1
        if past_key_values is not None:
            past_key_values.angpt_rope_seq_len = int(rope_seq_len)
        return int(rope_seq_len)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, seq_len: int | None = None,
                sequence: torch.Tensor | None = None):
        """`sequence` [b, t]: packed-sequence ids of a padding-free packed batch; dynamic NTK then gives each sequence
        the base of its own length, as if it ran alone (rotary_angpt.per_sequence_inv_freq)."""
        inv_freq = self.inv_freq
        if seq_len is None and self.length_dependent and sequence is not None:
            inv_freq = per_sequence_inv_freq(self.config, position_ids.expand_as(sequence), sequence)  # [b, t, r/2]
        elif seq_len is None and self.length_dependent:  # called on its own: L from the positions it is given
            seq_len = int(position_ids.max()) + 1
        if seq_len is not None:  # dynamic NTK: frequencies for this forward's fixed L (see the class docstring)
            inv_freq = compute_inv_freq(self.config, x.device, seq_len)[0]
        freqs = position_ids[..., None].float() * inv_freq.float()  # [b, t, r/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)
