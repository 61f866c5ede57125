"""Conversion of NVIDIA nGPT reference checkpoints (github.com/NVIDIA/ngpt, `model.py`) into our nGPT
(docs/architectures.md).

Key mapping (per layer i, source prefix `transformer.h.{i}.`, target prefix `model.layers.{i}.`):

| NVIDIA/ngpt                        | angpt                                   | transformation                        |
|------------------------------------|-----------------------------------------|---------------------------------------|
| transformer.wte.weight             | model.embed_tokens.weight               | copy                                  |
| query.weight, key.weight           | self_attn.q_proj / k_proj.weight        | rows permuted per head (RoPE layout)  |
| value.weight                       | self_attn.v_proj.weight                 | copy                                  |
| att_c_proj.weight                  | self_attn.o_proj.weight                 | copy                                  |
| c_fc.weight [8d, d]                | mlp.up_proj (rows :4d), gate_proj (4d:) | split: `u, v = chunk(uv, 2)`, SiLU(v) |
| mlp_c_proj.weight                  | mlp.down_proj.weight                    | copy                                  |
| attn_alpha, mlp_alpha [d]          | attn_residual / mlp_residual.alpha      | effective α re-stored; `alpha_abs`    |
| sqk [d]                            | self_attn.qk_scale.weight               | effective s_qk re-stored; permuted    |
| suv [8d]                           | mlp.up_scale (:4d), mlp.gate_scale (4d:)| copy (√d on both: `gate_sqrt_d=both`) |
| lm_head.weight                     | lm_head.weight                          | copy (untied)                         |
| sz [V]                             | logit_scale.weight                      | effective s_z re-stored               |

The reference is multi-head attention only (its GPTConfig has no key/value head count and its s_qk has n_embd
entries), so the converted config has num_key_value_heads = n_head and head_dim = n_embd / n_head; grouped-query
nGPT models are built from a config, not converted.

Reparameterised vectors are converted through their effective values: the reference uses
`s = stored · init/base_scale` (α: init 0.05; s_qk, s_z: 1; s_uv: 1 with scaling 1, times √d), ours uses
`s = stored · init/scale` with scale 1/√d (Scale in layers_angpt.py), so any `base_scale` converts exactly.

RoPE: the reference pairs channels (2j, 2j+1) (GPT-J "interleaved" layout); ours rotates (j, j + d_h/2)
(NeoX "half" layout). Permuting the rows of W_q and W_k (and the entries of s_qk) inside each head,
new[j] = old[2j], new[j + d_h/2] = old[2j + 1], makes the two identical, since q·k, the L2 norm and the
shared s_qk are invariant under the same permutation of q and k. Caveat: the reference's
`apply_rotary_position_embeddings` as published is not a rotation (it unpacks sin/cos with `chunk` from an
interleaved table and never adds the cos term; NVIDIA/ngpt issue #10, open). A checkpoint trained with that
function learned a position encoding that no RoPE reproduces; the conversion is exact for checkpoints trained
with the corrected rotation (the one the issue proposes), and for those the logits match to float rounding.
"""
from __future__ import annotations

import math

import torch

from ..configuration_angpt import AnGPTConfig

LAYER_KEYS = ("query.weight", "key.weight", "value.weight", "att_c_proj.weight", "c_fc.weight", "mlp_c_proj.weight",
              "attn_alpha", "mlp_alpha", "sqk", "suv")


def strip_prefix(state: dict) -> dict:
    """torch.compile'd training saves keys as `_orig_mod.x` (nanoGPT strips it the same way)."""
    return {k.removeprefix("_orig_mod."): v for k, v in state.items()}


def config_from_model_args(args: dict, **overrides) -> AnGPTConfig:
    """Our config for the reference's GPTConfig fields (n_layer, n_head, n_embd, vocab_size, block_size)."""
    if args.get("use_nGPT", 1) != 1:
        raise ValueError("the checkpoint is the reference's baseline GPT (use_nGPT=0), not nGPT")
    if args.get("bias", False):
        raise ValueError("the checkpoint has biases (bias=True); nGPT here has none")
    fields = dict(architecture="ngpt", vocab_size=args["vocab_size"], hidden_size=args["n_embd"],
                  num_hidden_layers=args["n_layer"], num_attention_heads=args["n_head"],
                  intermediate_size=4 * args["n_embd"], max_position_embeddings=args.get("block_size", 1024),
                  alpha_init=0.05, alpha_abs=True, gate_sqrt_d="both", tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0})
    fields.update(overrides)
    return AnGPTConfig(**fields)


def interleaved_to_half(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder the first axis within each head: (0, 1, 2, 3, ...) pairs -> (0, 2, ..., 1, 3, ...)."""
    d_h = rows.shape[0] // heads
    order = torch.cat([torch.arange(0, d_h, 2), torch.arange(1, d_h, 2)])
    index = (torch.arange(heads)[:, None] * d_h + order[None]).flatten()
    return rows[index]


def convert_state_dict(state: dict, config: AnGPTConfig, base_scale: float | None = None,
                       rope_layout: str = "interleaved") -> dict:
    """Our nGPT state dict from a reference state dict; every source key must be used exactly once."""
    state = strip_prefix(state)
    d, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    base_scale = base_scale if base_scale is not None else 1.0 / math.sqrt(d)
    our_scale = 1.0 / math.sqrt(d)  # s_scale of α, s_qk and s_z in our Scale (architectures_angpt.py)
    permute = (lambda t: interleaved_to_half(t, heads)) if rope_layout == "interleaved" else (lambda t: t)
    if rope_layout not in ("interleaved", "half"):
        raise ValueError(f"rope_layout={rope_layout!r}; expected 'interleaved' (the reference) or 'half'")
    unused = set(state)

    def take(key):
        if key not in state:
            raise KeyError(f"NVIDIA nGPT checkpoint: missing {key!r}")
        unused.discard(key)
        return state[key].float() if state[key].dtype != torch.float64 else state[key]

    def restore(effective, init):  # our stored value for an effective vector, init/our_scale
        return effective * (our_scale / init)

    out = {"model.embed_tokens.weight": take("transformer.wte.weight"), "lm_head.weight": take("lm_head.weight"),
           "logit_scale.weight": restore(take("sz") * (1.0 / base_scale), 1.0)}
    m = config.intermediate_size
    for i in range(layers):
        src, dst = f"transformer.h.{i}.", f"model.layers.{i}."
        out[dst + "self_attn.q_proj.weight"] = permute(take(src + "query.weight"))
        out[dst + "self_attn.k_proj.weight"] = permute(take(src + "key.weight"))
        out[dst + "self_attn.v_proj.weight"] = take(src + "value.weight")
        out[dst + "self_attn.o_proj.weight"] = take(src + "att_c_proj.weight")
        out[dst + "self_attn.qk_scale.weight"] = permute(restore(take(src + "sqk") / base_scale, 1.0))
        c_fc, suv = take(src + "c_fc.weight"), take(src + "suv")
        if c_fc.shape[0] != 2 * m:
            raise ValueError(f"{src}c_fc.weight has {c_fc.shape[0]} rows, expected 2 × {m}")
        out[dst + "mlp.up_proj.weight"], out[dst + "mlp.gate_proj.weight"] = c_fc[:m], c_fc[m:]
        out[dst + "mlp.up_scale.weight"], out[dst + "mlp.gate_scale.weight"] = suv[:m], suv[m:]  # init = scale = 1
        out[dst + "mlp.down_proj.weight"] = take(src + "mlp_c_proj.weight")
        out[dst + "attn_residual.alpha.weight"] = restore(take(src + "attn_alpha") * (0.05 / base_scale), 0.05)
        out[dst + "mlp_residual.alpha.weight"] = restore(take(src + "mlp_alpha") * (0.05 / base_scale), 0.05)
    if unused:
        raise KeyError(f"NVIDIA nGPT checkpoint: keys with no counterpart {sorted(unused)[:8]} "
                       "(a baseline GPT has rmsnorm_* keys; biases are not supported)")
    return out


def ngpt_from_reference(state: dict, model_args: dict, rope_layout: str = "interleaved", **overrides):
    """An AnGPTForCausalLM (nGPT) from a reference state dict and its GPTConfig fields (`model_args`)."""
    from ..modeling_angpt import AnGPTForCausalLM

    config = config_from_model_args(model_args, **overrides)
    model = AnGPTForCausalLM(config)
    converted = convert_state_dict(state, config, model_args.get("base_scale"), rope_layout)
    dtype = next(iter(converted.values())).dtype
    model = model.to(dtype)
    expected = model.state_dict()
    for key, value in converted.items():
        if key not in expected or expected[key].shape != value.shape:
            raise ValueError(f"NVIDIA nGPT checkpoint: {key} has shape {tuple(value.shape)}, expected "
                             f"{tuple(expected[key].shape) if key in expected else 'no such parameter'}")
    model.load_state_dict(converted, strict=True)
    return model.eval()
