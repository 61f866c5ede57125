"""Small building blocks shared by every architecture: norms, reparameterised scales, residual updates."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """N(x) = x/‖x‖₂ over `dim` (SPEC notation)."""
    return F.normalize(x, dim=dim, eps=1e-12)


def linear(x: torch.Tensor, weight: torch.Tensor, row_scale=None) -> torch.Tensor:
    """`diag(row_scale) · W · x` with the scale applied to the weight, not the activation.

    Why: an elementwise pass over activations costs B·T·out, the same scale on the weight costs out·in,
    which is far smaller at training batch sizes (DESIGN.md, performance notes). Gradients still reach a
    learnable `row_scale`. `row_scale` is None, a Python float or a tensor of shape [out] (or [1]).
    """
    if row_scale is None:
        return F.linear(x, weight)
    if isinstance(row_scale, torch.Tensor):
        row_scale = row_scale.to(weight.dtype).unsqueeze(-1)
    elif row_scale == 1.0:
        return F.linear(x, weight)
    return F.linear(x, weight * row_scale)


class RowScaledLinear(nn.Linear):
    """nn.Linear whose call takes an optional `row_scale` (see `linear`). Calling the module rather than reading
    its `.weight` is what lets FSDP2 gather a weight that lives in its own shard unit (accelerate puts the LM head
    in one)."""

    def forward(self, x: torch.Tensor, row_scale=None) -> torch.Tensor:
        return linear(x, self.weight, row_scale)


class RMSNorm(nn.Module):
    """Root-mean-square norm with an optional learnable gain (GPT+, SPEC §1.1); Llama/Qwen3 numerics."""

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


class L2Norm(nn.Module):
    """Exact normalisation N(·) as a module (nGPT/anGPT QK-norm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2_normalize(x)


class Scale(nn.Module):
    """A learnable vector stored reparameterised (SPEC §1.2): s = (s_init / s_scale) · ŝ, ŝ starts at s_scale.

    A small s_scale gives the effective vector a larger learning rate under Adam while every stored value
    stays of similar magnitude.
    """

    def __init__(self, size: int, init: float, scale: float) -> None:
        super().__init__()
        self.init_value = float(init)
        self.scale = float(scale)
        self.weight = nn.Parameter(torch.full((size,), self.scale))

    def forward(self) -> torch.Tensor:
        return self.weight * (self.init_value / self.scale)

    def extra_repr(self) -> str:
        return f"size={self.weight.shape[0]}, init={self.init_value:g}, scale={self.scale:g}"


# A residual update takes the stream h, the branch as a callable `branch(output_scale) -> x` and the branch's
# constant row scale on its output projection; it decides what that projection's rows are multiplied by.


class AddResidual(nn.Module):
    """h ← h + x (GPT+, and every folded inference form, SPEC §2)."""

    def forward(self, h: torch.Tensor, branch, constant: float) -> torch.Tensor:
        return h + branch(constant)


class NormalizedLerp(nn.Module):
    """nGPT: h ← N(h + α ⊙ (N(x) − h)) (SPEC §1.2). h is already unit-norm, so N(h) is skipped."""

    def __init__(self, size: int, alpha_init: float, alpha_scale: float, alpha_abs: bool) -> None:
        super().__init__()
        self.alpha = Scale(size, alpha_init, alpha_scale)
        self.alpha_abs = alpha_abs

    def forward(self, h: torch.Tensor, branch, constant: float) -> torch.Tensor:
        x = branch(constant)  # any positive factor on x is removed by N(x)
        alpha = self.alpha()
        if self.alpha_abs:
            alpha = alpha.abs()
        # Under autocast the branch output is bf16 while the stream stays in the parameters' dtype.
        return l2_normalize(torch.lerp(h, l2_normalize(x).to(h.dtype), alpha.to(h.dtype)))


def lerp_nu(alpha: torch.Tensor) -> torch.Tensor:
    """ν(α) = 1/√(mean_i(α_i² + (1 − α_i)²)) (SPEC §1.3); equals 1/√(α² + (1−α)²) for a scalar α.

    The factor that keeps ‖(1−α)h + αx‖ ≈ 1 for independent unit-norm h and x (research note §5.5).
    """
    return torch.rsqrt((alpha.square() + (1.0 - alpha).square()).mean())


class ApproxLerp(nn.Module):
    """anGPT: h ← ν(α) · ((1 − α) ⊙ h + α ⊙ x) (SPEC §1.3), computed as γ ⊙ h + x̃ in one fused op.

    β = ν(α)·α is folded into the branch's output projection (the branch is called with the row scale
    β·constant and returns x̃ = β ⊙ x), so the residual itself is a single `addcmul` with γ = ν(α)(1 − α): this is the
    training-time half of the fold of SPEC §2. Gradients flow through ν(α) into α. `nu=False` drops the ν(α)
    factor (the paper's ablation, which it reports as unstable).
    """

    def __init__(self, size: int, alpha_init: float, alpha_scale: float, alpha_abs: bool, nu: bool = True) -> None:
        super().__init__()
        self.alpha = Scale(size, alpha_init, alpha_scale)
        self.alpha_abs = alpha_abs
        self.nu = nu

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(γ, β) with γ = ν(α)(1 − α) on the stream and β = ν(α) α on the branch (SPEC §2 notation)."""
        alpha = self.alpha()
        if self.alpha_abs:
            alpha = alpha.abs()
        if not self.nu:
            return 1.0 - alpha, alpha
        nu = lerp_nu(alpha)
        return nu * (1.0 - alpha), nu * alpha

    def forward(self, h: torch.Tensor, branch, constant: float) -> torch.Tensor:
        gamma, beta = self.coefficients()  # once per sublayer
        return torch.addcmul(branch(beta * constant).to(h.dtype), h, gamma.to(h.dtype))
