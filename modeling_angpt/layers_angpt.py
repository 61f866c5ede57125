"""The building blocks the architecture strategies put into the one decoder block (architectures_angpt.py): norms,
reparameterised scales, and the three residual updates. Each block that holds constants also says how it folds
into the weights for inference (`fold*` methods, read by folding_angpt.py; docs/inference-fold.md)."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """N(x) = x/‖x‖₂ over `dim` (docs/architectures.md, notation)."""
    return F.normalize(x, dim=dim, eps=1e-12)


def linear(x: torch.Tensor, weight: torch.Tensor, row_scale=None) -> torch.Tensor:
    """`diag(row_scale) · W · x` with the scale applied to the weight, not the activation.

    Why: an elementwise pass over activations costs B·T·out, the same scale on the weight costs out·in,
    which is far smaller at training batch sizes (docs/architectures.md, "Where the constants are applied"). Gradients still reach a
    learnable `row_scale`. `row_scale` is None, a Python float or a tensor of shape [out] (or [1]).
    """
    if row_scale is None:
        return F.linear(x, weight)
    if isinstance(row_scale, torch.Tensor):
        row_scale = row_scale.to(weight.dtype).unsqueeze(-1)
    elif row_scale == 1.0:
        return F.linear(x, weight)
    return F.linear(x, weight * row_scale)


def is_plain_linear(module: nn.Module) -> bool:
    """A bias-free `nn.Linear` exactly (or a `Gain`/`LinearGain`, which add nothing to it), holding a plain weight and no hooks:
    reading its `.weight` computes what calling it would. Anything else (a PEFT LoRA layer, a bitsandbytes or
    torchao quantized layer, vLLM's layers, an FSDP2 shard unit, a DTensor of a tensor-parallel plan, a module with
    hooks) must be called, or it silently does nothing."""
    return (type(module) in (nn.Linear, *GAINS) and module.bias is None and type(module.weight) is nn.Parameter
            and not module._forward_hooks and not module._forward_pre_hooks)


def project(module: nn.Module, x: torch.Tensor, row_scale=None) -> torch.Tensor:
    """The projection `module` applied to x, its output rows scaled by `row_scale` (None, a float or a tensor [out]).

    Layers are called, never read (docs/architectures.md, "Where the constants are applied"): whatever replaced or
    wrapped the projection takes effect, and the scale multiplies its output. Only for a plain nn.Linear does the
    scale go onto the weight instead (`linear`: out·in multiplies instead of B·T·out, the same product).
    """
    if is_plain_linear(module):
        return linear(x, module.weight, row_scale)
    output = module(x)
    if row_scale is None or (not isinstance(row_scale, torch.Tensor) and row_scale == 1.0):
        return output
    if isinstance(row_scale, torch.Tensor):
        row_scale = row_scale.to(output.dtype)
    return output * row_scale


class RMSNorm(nn.Module):
    """Root-mean-square norm with an optional learnable gain (GPT+, docs/architectures.md "GPT+"); Llama/Qwen3
    numerics."""

    folds_away = True  # its gain moves into the next matrices' columns

    def __init__(self, size: int, eps: float = 1e-6, gain: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size)) if gain else None
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        x = x.to(dtype)
        return x if self.weight is None else self.weight * x

    def fold_gain(self) -> torch.Tensor | None:
        """The gain it hands to the next matrices' columns when folded (None: none)."""
        return None if self.weight is None else self.weight.detach().to(torch.float64)


class L2Norm(nn.Module):
    """Exact normalisation N(·) as a module (nGPT/anGPT QK-norm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2_normalize(x)


class Scale(nn.Module):
    """A learnable vector stored reparameterised (docs/architectures.md, section `ngpt`): s = (s_init / s_scale) · ŝ, ŝ
    starts at s_scale.

    A small s_scale gives the effective vector a larger learning rate under Adam while every stored value
    stays of similar magnitude.
    """

    folds_away = True  # its effective vector moves into a matrix

    def __init__(self, size: int, init: float, scale: float) -> None:
        super().__init__()
        self.init_value = float(init)
        self.scale = float(scale)
        self.weight = nn.Parameter(torch.full((size,), self.scale))

    def forward(self) -> torch.Tensor:
        return self.weight * (self.init_value / self.scale)

    def extra_repr(self) -> str:
        return f"size={self.weight.shape[0]}, init={self.init_value:g}, scale={self.scale:g}"

    def fold(self) -> torch.Tensor:
        """The effective vector, in float64."""
        return (self.weight.detach().to(torch.float64) * (self.init_value / self.scale))


class Gain(nn.Module):
    """A plain per-channel gain c of `size` channels (the folded form's c_q), held as the weight [size, 1] of a linear
    map from the constant 1: called on a one, it returns c. It is not an `nn.Linear`: torchao's `quantize_`, PEFT's
    `all-linear`, bitsandbytes and the GPTQ/AWQ-style walkers take every nn.Linear, and a map from 1 input is no
    layer to quantize or adapt. It keeps the interface transformers' `colwise` splits by (`weight` [out, in],
    `out_features`), so transformers' tensor-parallel plan splits it with q_proj; a runtime that splits only
    nn.Linear modules builds it as a `LinearGain` (`gain_for`; docs/architectures.md, "Tensor and pipeline
    parallelism"). Checkpoints saved when c was a vector [size] load unchanged (pretrained_angpt.py, LEGACY_SHAPES)."""

    in_features = 1

    def __init__(self, size: int) -> None:
        super().__init__()
        self.out_features = size
        self.weight = nn.Parameter(torch.ones(size, 1))
        self.register_parameter("bias", None)  # as a bias-free nn.Linear: the same state dict, the same checks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"size={self.out_features}"


class LinearGain(nn.Linear):
    """The same gain as an `nn.Linear`, for a runtime that splits only nn.Linear modules and leaves every other
    parameter whole (vLLM's Transformers backend: its ColumnParallelLinear splits it with q_proj by the plan's
    `colwise`). Built only where that runtime builds the model (`gain_for`)."""

    def __init__(self, size: int) -> None:
        super().__init__(1, size, bias=False)
        nn.init.ones_(self.weight)


GAINS = (Gain, LinearGain)

# Runtimes that split only nn.Linear modules and name themselves in config._attn_implementation before they build the
# model (vLLM's Transformers backend registers and sets "vllm"; docs/tools.md, "vLLM").
RUNTIMES_THAT_SPLIT_ONLY_LINEAR_LAYERS = ("vllm",)


def gain_for(config, size: int) -> Gain | LinearGain:
    """The folded c_q's module: a `LinearGain` where a runtime that splits only linear layers builds the model, so
    that it splits c_q with q_proj; a `Gain` everywhere else, which tools that take every nn.Linear leave alone."""
    if getattr(config, "_attn_implementation", None) in RUNTIMES_THAT_SPLIT_ONLY_LINEAR_LAYERS:
        return LinearGain(size)
    return Gain(size)


def gain_of(module: nn.Module, like: torch.Tensor) -> torch.Tensor:
    """The gain a `Gain` or `LinearGain` holds (this rank's part when split), in the dtype of `like`: read off a plain
    one's weight, else the module is called on a one, as whatever replaced or split it (vLLM's ColumnParallelLinear,
    transformers' tensor-parallel hooks) must be (is_plain_linear)."""
    if is_plain_linear(module):
        return module.weight.view(-1).to(like.dtype)
    return module(like.new_ones(1, dtype=getattr(module, "weight", like).dtype)).to(like.dtype)


# --- the residual updates (docs/architectures.md, "The residual update") ------------------------------------------
# The decoder layer asks its residual module for its `weights()` once per sublayer: a named tuple of that update's
# own weights (nGPT's α, anGPT's γ and β). The layer reads only `branch_scale`, the row scale it runs the branch's
# output projection with (None: the branch's own constant), then calls the module on (h, x, weights).
# `fold()` -> (β, γ, extra state): h_next = γ ⊙ h + β ⊙ x in the training form, and the folded module's own parameters.
class AddWeights(NamedTuple):
    """GPT+: nothing to weigh."""
    branch_scale: None = None


class LerpWeights(NamedTuple):
    """nGPT: the LERP weight α on N(x); the branch keeps its constant row scale (N(x) removes any positive factor)."""
    alpha: torch.Tensor
    branch_scale: None = None


class ApproxLerpWeights(NamedTuple):
    """anGPT: γ = ν(α)(1 − α) multiplies the stream h; β = ν(α)·α scales the branch's output rows."""
    gamma: torch.Tensor
    branch_scale: torch.Tensor


class AddResidual(nn.Module):
    """h ← h + x (GPT+, and the folded GPT+ and anGPT: docs/inference-fold.md)."""

    def weights(self) -> AddWeights:
        return AddWeights()

    def forward(self, h: torch.Tensor, x: torch.Tensor, weights: AddWeights | None = None) -> torch.Tensor:
        return h + x

    def fold(self):
        return None, None, {}


class NormalizedLerp(nn.Module):
    """nGPT: h ← N(h + α ⊙ (N(x) − h)) (docs/architectures.md, section `ngpt`). h is already unit-norm, so N(h) is
    skipped."""

    def __init__(self, size: int, alpha_init: float, alpha_scale: float, alpha_abs: bool) -> None:
        super().__init__()
        self.alpha = Scale(size, alpha_init, alpha_scale)
        self.alpha_abs = alpha_abs

    def weights(self) -> LerpWeights:
        alpha = self.alpha()
        return LerpWeights(alpha.abs() if self.alpha_abs else alpha)

    def forward(self, h: torch.Tensor, x: torch.Tensor, weights: LerpWeights) -> torch.Tensor:
        # Under autocast the branch output is bf16 while the stream stays in the parameters' dtype.
        return l2_normalize(torch.lerp(h, l2_normalize(x).to(h.dtype), weights.alpha.to(h.dtype)))

    def fold(self):
        """α cannot fold (N(x) sits between W_o and the LERP): it stays, stored as its effective value."""
        alpha = self.alpha.fold()
        return None, None, {"alpha.weight": alpha.abs() if self.alpha_abs else alpha}


def lerp_nu(alpha: torch.Tensor) -> torch.Tensor:
    """ν(α) = 1/√(mean_i(α_i² + (1 − α_i)²)) (docs/architectures.md, section `angpt`); equals 1/√(α² + (1−α)²) for a
    scalar α.

    The factor that keeps ‖(1−α)h + αx‖ ≈ 1 for independent unit-norm h and x.
    """
    return torch.rsqrt((alpha.square() + (1.0 - alpha).square()).mean())


class ApproxLerp(nn.Module):
    """anGPT: h ← ν(α) · ((1 − α) ⊙ h + α ⊙ x) (docs/architectures.md, section `angpt`), computed as γ ⊙ h + x̃ in one
    fused op.

    β = ν(α)·α is folded into the branch's output projection (the branch runs with the row scale β·constant and
    returns x̃ = β ⊙ x), so the residual itself is a single `addcmul` with γ = ν(α)(1 − α): the training-time half of
    the inference fold (docs/inference-fold.md). Gradients flow through ν(α) into α. `nu=False` drops the ν(α)
    factor (the paper's ablation, which it reports as unstable).
    """

    def __init__(self, size: int, alpha_init: float, alpha_scale: float, alpha_abs: bool, nu: bool = True) -> None:
        super().__init__()
        self.alpha = Scale(size, alpha_init, alpha_scale)
        self.alpha_abs = alpha_abs
        self.nu = nu

    def weights(self) -> ApproxLerpWeights:
        """γ = ν(α)(1 − α) on the stream and β = ν(α) α on the branch (docs/inference-fold.md)."""
        return ApproxLerpWeights(*self._split(self.alpha()))

    def _split(self, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(γ, β) of an effective α (the live one, or its float64 copy when folding)."""
        if self.alpha_abs:
            alpha = alpha.abs()
        if not self.nu:
            return 1.0 - alpha, alpha
        nu = lerp_nu(alpha)
        return nu * (1.0 - alpha), nu * alpha

    def forward(self, h: torch.Tensor, x: torch.Tensor, weights: ApproxLerpWeights) -> torch.Tensor:
        return torch.addcmul(x.to(h.dtype), h, weights.gamma.to(h.dtype))

    def fold(self):
        gamma, beta = self._split(self.alpha.fold())
        return beta, gamma, {}
