"""The one decoder block of the three architectures (SPEC.md §1): attention, MLP and the residual updates the
architecture strategy supplies. A model file: it imports only the other flat *_angpt.py files."""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .architectures_angpt import get_architecture
from .attention_angpt import eager_attention_forward, get_attention_function
from .configuration_angpt import AnGPTConfig
from .layers_angpt import linear
from .logit_transforms_angpt import LOGIT_TRANSFORMS
from .masks_angpt import AttentionLayout
from .rotary_angpt import apply_rotary


class AnGPTAttention(nn.Module):
    """Multi-head or grouped-query attention; the architecture decides the q/k treatment, softmax scale and ν
    constants. The cache holds num_key_value_heads heads; each backend lets a group of query heads share one."""

    def __init__(self, config: AnGPTConfig, layer_idx: int) -> None:
        super().__init__()
        arch = get_architecture(config)
        self.config, self.layer_idx = config, layer_idx
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.num_key_value_heads = config.num_key_value_heads
        # grouped-query attention: query head h reads key/value head h // groups (transformers' repeat_kv)
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.is_causal = config.is_causal
        self.scaling = arch.softmax_scale(config)
        constants = arch.constants(config)
        self.nu_v, self.nu_o = constants["v"], constants["o"]
        width, kv_width = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.o_proj.residual_output = True
        self.q_norm, self.k_norm = arch.qk_norm(config), arch.qk_norm(config)
        self.qk_scale = arch.qk_scale(config)
        self.query_gain = arch.query_gain(config)  # folded form only: c_q = √d_h·s_qk² (SPEC §2)
        # A query-scaling transform (LogN/SSMax, SPEC §3.2): one learnable s per head, q ← s_h·log(n)·q; filled in
        # _init_weights (the state-dict name stays `logn_scale`)
        self.logit_transform = LOGIT_TRANSFORMS[config.attention_logit_transform]
        self.logn_scale = None
        if self.logit_transform.query_scale is not None:
            self.logn_scale = nn.Parameter(torch.full((self.num_heads,), self.logit_transform.query_scale_init(config)))

    def forward(self, hidden_states: torch.Tensor, position_embeddings, attention_mask, past_key_values=None,
                output_scale=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length, _ = hidden_states.shape
        heads = (batch, length, self.num_heads, self.head_dim)
        kv_heads = (batch, length, self.num_key_value_heads, self.head_dim)
        query = self.q_norm(self.q_proj(hidden_states).view(heads)).transpose(1, 2)  # [b, h, t, d_h]
        key = self.k_norm(self.k_proj(hidden_states).view(kv_heads)).transpose(1, 2)  # [b, h_kv, t, d_h]
        value = linear(hidden_states, self.v_proj.weight, self.nu_v).view(kv_heads).transpose(1, 2)
        if position_embeddings is not None:
            query, key = apply_rotary(query, key, *position_embeddings)
        if self.qk_scale is not None:  # s_qk after RoPE (SPEC §1.2): one per key channel, shared by its query heads
            s_qk = self.qk_scale().view(self.num_key_value_heads, 1, self.head_dim).to(query.dtype)
            query, key = query * s_qk.repeat_interleave(self.num_key_value_groups, dim=0), key * s_qk
        if self.query_gain is not None:  # folded form: all of q's and k's factors merged onto q (SPEC §2)
            query = query * self.query_gain.weight.view(self.num_heads, 1, self.head_dim).to(query.dtype)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
        if self.logn_scale is not None:  # LogN as a query scaling, so every kernel runs it (SPEC §3.2)
            layout = kwargs.get("attention_layout") or AttentionLayout.from_shapes(query, key, attention_mask,
                                                                                   self.is_causal)
            query = query * self.logit_transform.query_scale(self.logn_scale, layout).to(query.dtype)
        # ours for the variants (raises if the backend cannot compute this one), else transformers' by name
        attend = get_attention_function(self.config) or ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward)
        output, weights = attend(self, query, key, value, attention_mask, scaling=self.scaling,
                                 dropout=self.config.attention_dropout if self.training else 0.0, **kwargs)
        output = output.reshape(batch, length, -1)
        scale = self.nu_o if output_scale is None else output_scale
        return linear(output, self.o_proj.weight, scale), weights


class AnGPTMLP(nn.Module):
    """SwiGLU x = ν_d W_down(ν_acf · u ⊙ SiLU(z)), u = ν_uz s_u ⊙ W_up h, z = ν_uz √d s_v ⊙ W_gate h (SPEC §1.3)."""

    def __init__(self, config: AnGPTConfig) -> None:
        super().__init__()
        arch = get_architecture(config)
        constants = arch.constants(config)
        self.nu_up, self.nu_gate, self.nu_down = constants["up"], constants["gate"], constants["down"]
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.down_proj.residual_output = True
        self.up_scale, self.gate_scale = arch.mlp_scales(config)

    def forward(self, x: torch.Tensor, output_scale=None) -> torch.Tensor:
        up_scale, gate_scale = self.nu_up, self.nu_gate
        if self.up_scale is not None:
            up_scale, gate_scale = self.up_scale() * up_scale, self.gate_scale() * gate_scale
        hidden = linear(x, self.up_proj.weight, up_scale) * nn.functional.silu(linear(x, self.gate_proj.weight, gate_scale))
        return linear(hidden, self.down_proj.weight, self.nu_down if output_scale is None else output_scale)


class AnGPTDecoderLayer(GradientCheckpointingLayer):
    """The one block: h ← R_A(h, Attn(n_A(h))), h ← R_M(h, MLP(n_M(h))), R and n from the architecture."""

    def __init__(self, config: AnGPTConfig, layer_idx: int) -> None:
        super().__init__()
        arch = get_architecture(config)
        self.self_attn = AnGPTAttention(config, layer_idx)
        self.mlp = AnGPTMLP(config)
        self.input_layernorm = arch.branch_norm(config)
        self.post_attention_layernorm = arch.branch_norm(config)
        self.attn_residual = arch.residual(config)
        self.mlp_residual = arch.residual(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_embeddings=None,
                past_key_values: Cache | None = None, **kwargs) -> torch.Tensor:
        def attention(output_scale):
            return self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask,
                                  past_key_values, output_scale, **kwargs)[0]

        hidden_states = self.attn_residual(hidden_states, attention, self.self_attn.nu_o)
        normed = self.post_attention_layernorm(hidden_states)
        return self.mlp_residual(hidden_states, lambda output_scale: self.mlp(normed, output_scale), self.mlp.nu_down)
