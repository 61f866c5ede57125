"""The inference form (docs/inference-fold.md): fold the constants into the weights.

`fold_model(model)` returns a new model whose config says `folded: true`; it runs the architecture's folded
strategy (architectures_angpt.py). Its forward has, for anGPT, no ν, no reparameterised scale and no LERP: per
layer two L2 norms, one per-channel gain on q, RoPE, softmax, the SiLU gate and two plain adds. nGPT keeps its
normalised LERPs and norms; GPT+ keeps gain-less RMSNorms.

How: each module that holds constants says what it contributes (layers_angpt.py): a residual update's `fold()`
yields its branch factor β and its stream factor γ, a norm's `fold_gain()` the gain it hands to the next matrices'
columns, a `Scale`'s `fold()` its effective vector. `fold_state_dict` walks the one decoder block in order, carries
the cumulative stream rescaling D (h = D ⊙ h̃) and writes each folded matrix. Everything is computed in float64 and
cast once at the end. Parameters the fold does not know (an attention variant's own, e.g. a LogN scale) are copied
unchanged.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .architectures_angpt import FOLDED_TRAINING_ERROR, get_architecture
from .layers_angpt import L2Norm


# --- asking each module what it contributes ------------------------------------------------------------------------
def _norm_gain(norm: nn.Module, name: str):
    """The gain a branch/final norm hands to the next matrices' columns (None: nothing to hand on)."""
    if isinstance(norm, nn.Identity):
        return None
    if not hasattr(norm, "fold_gain"):
        raise TypeError(f"fold: the norm {name} of type {type(norm).__name__} has no fold_gain()")
    return norm.fold_gain()


def _residual_fold(residual: nn.Module, name: str):
    """(β, γ, folded state of the residual module): h_next = γ ⊙ h + β ⊙ x in the training form."""
    if not hasattr(residual, "fold"):
        raise TypeError(f"fold: the residual {name} of type {type(residual).__name__} has no fold()")
    return residual.fold()


def _scale(module, name: str):
    """The effective vector of a reparameterised scale (None when the architecture has none)."""
    if module is None:
        return None
    if not hasattr(module, "fold"):
        raise TypeError(f"fold: the scale {name} of type {type(module).__name__} has no fold()")
    return module.fold()


def _rows(weight: torch.Tensor, scale) -> torch.Tensor:
    """diag(scale) · W (scale: None, float or [out] / [1] vector)."""
    return weight if scale is None else weight * (scale.unsqueeze(-1) if isinstance(scale, torch.Tensor) else scale)


def _cols(weight: torch.Tensor, scale) -> torch.Tensor:
    """W · diag(scale)."""
    return weight if scale is None else weight * scale


def _mul(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a * b


class _Stream:
    """The cumulative rescaling D of the residual stream (h = D ⊙ h̃); stays None while D = 1."""

    def __init__(self) -> None:
        self.D = None

    def advance(self, gamma, name: str, target_dtype: torch.dtype, beta) -> torch.Tensor | None:
        """D ← D ⊙ γ; returns β / D_next (the branch output factor), refusing a fold that divides by ~0."""
        if gamma is None:
            return beta
        D_next = gamma if self.D is None else self.D * gamma
        tiny = torch.finfo(target_dtype).tiny
        bad = (D_next.abs() < tiny) | ~torch.isfinite(D_next)
        if bad.any():
            channels = bad.nonzero().flatten()[:8].tolist()
            raise ValueError(
                f"cannot fold {name}: the cumulative stream scale D = ∏(ν(α)(1 − α)) is 0 or below the smallest "
                f"{target_dtype} number in channels {channels} (1 − α is 0 there, or D underflowed); the fold "
                "would divide by it (docs/inference-fold.md). Refusing to write inf/NaN weights.")
        out = beta / D_next
        if not torch.isfinite(out.to(target_dtype)).all():
            raise ValueError(f"cannot fold {name}: β/D overflows {target_dtype} "
                             "(D underflowed; docs/inference-fold.md)")
        self.D = D_next
        return out


@torch.no_grad()
def fold_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The folded state dict (float64 values, keys of the folded model) of a causal-LM or classifier model."""
    config = model.config
    if getattr(config, "folded", False):
        raise ValueError("fold: the model is already folded (config.folded=True)")
    if not hasattr(model, "model") or not (hasattr(model, "lm_head") or hasattr(model, "score")):
        raise ValueError("fold: pass a model with a head (AnGPTForCausalLM or AnGPTForSequenceClassification); the "
                         "last stream rescaling and final-norm gain fold into the head, a bare AnGPTModel has none")
    dtype = dtype or next(model.parameters()).dtype
    arch = get_architecture(config)
    target = arch.folded_form
    if target is None:
        raise ValueError(f"fold: architecture {config.architecture!r} has no folded inference form")
    constants = arch.constants(config)
    heads, d_h = config.num_attention_heads, config.head_dim
    f64 = lambda t: t.detach().to(torch.float64)  # noqa: E731
    out: dict[str, torch.Tensor] = {}
    stream = _Stream()
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        # attention sublayer: x = n(D ⊙ h̃)
        if stream.D is not None and not isinstance(layer.input_layernorm, nn.Identity):
            raise ValueError(f"fold: {p}input_layernorm cannot take a per-channel stream scale")
        cols = _mul(_norm_gain(layer.input_layernorm, p + "input_layernorm"), stream.D)
        w_q = _cols(f64(attn.q_proj.weight), cols)
        s_qk = _scale(attn.qk_scale, p + "self_attn.qk_scale")
        if target.query_gain(config) is not None:  # exact L2 q/k norm: all of q's and k's factors meet on q
            if not isinstance(attn.q_norm, L2Norm):
                raise TypeError(f"fold: {p}self_attn.q_norm must be an exact L2 norm to merge s_qk onto q")
            c_q = torch.full((heads * d_h,), float(attn.scaling), dtype=torch.float64,
                             device=attn.q_proj.weight.device)
            if s_qk is not None:  # one s_qk per key channel, shared by the query heads of its group (GQA)
                s_qk = s_qk.view(-1, d_h).repeat_interleave(attn.num_key_value_groups, dim=0).flatten()
            c_q = c_q if s_qk is None else c_q * s_qk.square()
            out[p + "self_attn.query_gain.weight"] = c_q.unsqueeze(-1)  # a map from 1 (layers_angpt.Gain)
        elif s_qk is not None:
            raise ValueError(f"fold: {p}self_attn has s_qk but the folded form has no query gain")
        elif getattr(attn.q_norm, "weight", None) is not None:  # GPT+ QK-norm: gain stays, takes 1/√d_h
            out[p + "self_attn.q_norm.weight"] = f64(attn.q_norm.weight) * float(attn.scaling)
        else:  # no gain after W_q (Llama): the scalar goes into W_q's rows
            w_q = w_q * float(attn.scaling)
        out[p + "self_attn.q_proj.weight"] = w_q
        out[p + "self_attn.k_proj.weight"] = _cols(f64(attn.k_proj.weight), cols)
        out[p + "self_attn.v_proj.weight"] = _rows(_cols(f64(attn.v_proj.weight), cols), constants["v"])
        beta, gamma, extra = _residual_fold(layer.attn_residual, p + "attn_residual")
        out.update({p + "attn_residual." + k: v for k, v in extra.items()})
        o_scale = stream.advance(gamma, f"layer {i} attention ({p}attn_residual)", dtype, beta)
        out[p + "self_attn.o_proj.weight"] = _rows(_rows(f64(attn.o_proj.weight), o_scale), constants["o"])
        # MLP sublayer
        if stream.D is not None and not isinstance(layer.post_attention_layernorm, nn.Identity):
            raise ValueError(f"fold: {p}post_attention_layernorm cannot take a per-channel stream scale")
        cols = _mul(_norm_gain(layer.post_attention_layernorm, p + "post_attention_layernorm"), stream.D)
        s_u, s_v = _scale(mlp.up_scale, p + "mlp.up_scale"), _scale(mlp.gate_scale, p + "mlp.gate_scale")
        out[p + "mlp.up_proj.weight"] = _rows(_rows(_cols(f64(mlp.up_proj.weight), cols), s_u), constants["up"])
        out[p + "mlp.gate_proj.weight"] = _rows(_rows(_cols(f64(mlp.gate_proj.weight), cols), s_v), constants["gate"])
        beta, gamma, extra = _residual_fold(layer.mlp_residual, p + "mlp_residual")
        out.update({p + "mlp_residual." + k: v for k, v in extra.items()})
        d_scale = stream.advance(gamma, f"layer {i} MLP ({p}mlp_residual)", dtype, beta)
        out[p + "mlp.down_proj.weight"] = _rows(_rows(f64(mlp.down_proj.weight), d_scale), constants["down"])
    # head: W_head' = diag(s_z) W_head diag(g_f ⊙ D_final)
    cols = _mul(_norm_gain(model.model.norm, "model.norm"), stream.D)
    if hasattr(model, "lm_head"):
        s_z = _scale(getattr(model, "logit_scale", None), "logit_scale")
        out["lm_head.weight"] = _rows(_cols(f64(model.lm_head.weight), cols), s_z)
    else:  # pooling and dropout commute with a per-channel scale, so it folds into the classifier
        out["score.weight"] = _cols(f64(model.score.weight), cols)
    return out


def folded_config(config, dtype: torch.dtype | None = None):
    folded = copy.deepcopy(config)
    folded.folded = True
    folded.tie_word_embeddings = False  # the head's columns now differ from the embedding's rows
    if dtype is not None:
        folded.dtype = dtype
    return folded


@torch.no_grad()
def fold_model(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A new model of the same class in the inference form (config.folded=True, docs/inference-fold.md), in eval
    mode.

    Parameters the fold has no rule for (attention variants' own) are copied unchanged; a source parameter
    that would be silently dropped, or a folded parameter nobody computed, is an error.
    """
    source_dtype = next(model.parameters()).dtype
    dtype = dtype or source_dtype
    values = fold_state_dict(model, dtype)
    config = folded_config(model.config, dtype)
    folded = type(model)(config).to(dtype=dtype, device=next(model.parameters()).device)
    source = model.state_dict()
    state = {}
    for key, target in folded.state_dict().items():
        if key in values:
            value = values[key]
        elif key in source:
            value = source[key]
        else:
            raise KeyError(f"fold: the folded model has {key!r} but the fold produced no value for it")
        if value.shape != target.shape:
            raise ValueError(f"fold: {key} has shape {tuple(value.shape)}, the folded model expects {tuple(target.shape)}")
        value = value.to(dtype)
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise ValueError(f"fold: {key} is not finite after folding to {dtype}; refusing to write inf/NaN")
        state[key] = value
    dropped = [k for k in source if k not in state and not _consumed(k, model)]
    if dropped:
        raise KeyError(f"fold: no rule folds the source parameters {dropped}")
    folded.load_state_dict(state, strict=True)
    if getattr(model, "generation_config", None) is not None:
        folded.generation_config = copy.deepcopy(model.generation_config)
    return folded.eval()


def _consumed(key: str, model: nn.Module) -> bool:
    """Source parameters the fold absorbed into matrices: reparameterised scales (s_qk, s_u, s_v, s_z, α) and
    RMSNorm gains (modules marked `folds_away`; the folded model no longer has them)."""
    module_name = key.rpartition(".")[0]
    return getattr(model.get_submodule(module_name) if module_name else model, "folds_away", False)


__all__ = ["fold_state_dict", "fold_model", "folded_config", "FOLDED_TRAINING_ERROR"]
