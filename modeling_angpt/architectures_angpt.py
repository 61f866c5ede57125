"""The three architectures as small strategy objects (docs/architectures.md), each with its folded inference form.

The decoder block is written once (modeling_angpt.py). An architecture supplies what differs: the branch-input
norm, the residual update, the q/k treatment, the softmax scale, the ν constants, the initialisation, the weight
constraint, the optimiser groups, its own config rules and the form it takes once its constants are folded into
the weights (docs/inference-fold.md). No other file asks which architecture it is running. `ARCHITECTURES` is the
one list of them: the config validates `architecture` against it, and a new architecture is one class plus one
`register_architecture` call. The interface they implement, with its shared defaults: architecture_base_angpt.py.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import nn

from .architecture_base_angpt import FOLDED_TRAINING_ERROR, PAPER_ALPHA_INIT, Architecture  # noqa: F401 (public names)
from .layers_angpt import AddResidual, ApproxLerp, NormalizedLerp, RMSNorm, gain_for


@lru_cache(maxsize=None)
def silu_second_moment(std: float) -> float:
    """E[SiLU(z)²] for z ~ N(0, std²), by the trapezoid rule over ±12 std in float64 (error < 1e-12).

    On the CPU explicitly: models are also built under `torch.device("meta")` (loading, shape checks)."""
    z = torch.linspace(-12 * std, 12 * std, 200_001, dtype=torch.float64, device="cpu")
    density = torch.exp(-0.5 * (z / std) ** 2) / (std * math.sqrt(2 * math.pi))
    return float(torch.trapezoid(torch.nn.functional.silu(z) ** 2 * density, z))


# anGPT has no exact norm on the residual stream: each MLP sublayer maps ‖h‖ = x to about (1 − α)x + α·c·x², an
# unstable fixed point at 1 whose perturbation compounds over the depth, so the initial α·L decides whether the first
# Adam steps blow up. ALPHA_DEPTH_LIMIT is the largest α·L at which a seed sweep of a 24-layer anGPT (d = 256, the demo
# recipe's first 40 steps) had 10 seeds of 10 clean; the next level, 0.12, failed in one seed
# (experiments/deep_alpha/README.md, docs/architectures.md "Deep models start with a smaller α"). Training warns above
# it (AnGPT.alpha_depth_warning).
ALPHA_DEPTH_LIMIT = 0.10


def _round_down(value: float, digits: int = 4) -> float:
    """value rounded down to `digits` significant digits."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    return math.floor(value * scale) / scale


class GPTPlus(Architecture):
    """Pre-norm GPT with QK-norm (docs/architectures.md, section `gptplus`): exactly Qwen3 (Llama with qk_norm off) at full
    rotation."""

    name = "gptplus"
    title = "GPT+ (pre-norm GPT with QK-norm)"

    def branch_norm(self, config) -> nn.Module:
        return RMSNorm(config.hidden_size, config.rms_norm_eps)

    def final_norm(self, config) -> nn.Module:
        return RMSNorm(config.hidden_size, config.rms_norm_eps)

    def qk_norm(self, config) -> nn.Module:
        return RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else nn.Identity()

    def qk_scale(self, config):
        return None

    def mlp_scales(self, config):
        return None, None

    def logit_scale(self, config):
        return None

    def softmax_scale(self, config) -> float:
        return 1.0 / math.sqrt(config.head_dim)

    def init_matrix(self, weight, config, residual_output):
        std = config.initializer_range
        if residual_output:  # GPT-2 / nanoGPT convention: keep the residual stream's variance O(1) in depth
            std = std / math.sqrt(2 * config.num_hidden_layers)
        return torch.randn_like(weight) * std

    def optimizer_param_groups(self, model, weight_decay):
        # Weight decay on matrices only (docs/architectures.md, section `gptplus`): gains and other vectors are not decayed.
        params = [p for p in model.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


class NGPT(Architecture):
    """Everything on the hypersphere (docs/architectures.md, section `ngpt`; NVIDIA's reference code)."""

    name = "ngpt"
    title = "nGPT (normalized GPT)"

    def validate(self, config):
        # ν_uz = √(d/4d) and ν_d = √(4d/d) (docs/architectures.md, section `angpt`) assume the 4d width; nGPT shares the shapes.
        if config.hidden_size * 4 != config.intermediate_size:
            raise ValueError(f"AnGPTConfig.intermediate_size={config.intermediate_size} is not valid for "
                             f"architecture={config.architecture!r}; expected 4*hidden_size={4 * config.hidden_size}")

    def residual(self, config):
        size = config.hidden_size if config.alpha_shape == "vector" else 1
        return NormalizedLerp(size, config.alpha_init, 1.0 / math.sqrt(config.hidden_size), config.alpha_abs)

    def constants(self, config):
        sqrt_d = math.sqrt(config.hidden_size)
        # √d on the gate keeps SiLU's input O(1) (entries of W_gate h have variance 1/d); the NVIDIA code
        # also scales u by √d [flag gate_sqrt_d="both"]; N(x_M) makes that a forward no-op.
        return dict(v=1.0, o=1.0, up=sqrt_d if config.gate_sqrt_d == "both" else 1.0, gate=sqrt_d, down=1.0)

    def init_matrix(self, weight, config, residual_output):
        return self._normalize(torch.randn_like(weight), residual_output)

    @staticmethod
    def _normalize(weight, residual_output):
        # Unit norm along d_model: rows (over the input) for every matrix reading the stream, columns
        # (over the output) for o_proj and down_proj, which write into it (docs/architectures.md, section `ngpt`).
        dim = 0 if residual_output else -1
        return weight / weight.norm(dim=dim, keepdim=True).clamp_min(1e-12)

    @torch.no_grad()
    def constrain(self, weight, residual_output):
        weight.copy_(self._normalize(weight.float(), residual_output).to(weight.dtype))

    @staticmethod
    def norm_axis(residual_output: bool) -> int:
        return 0 if residual_output else -1

    def project_stacked(self, weights, stacked, norms):
        normalized = (stacked / norms.clamp_min(1e-12)).to(weights[0].dtype)
        torch._foreach_copy_(weights, list(normalized.unbind(0)))


class AnGPT(Architecture):
    """Approximately normalized GPT (docs/architectures.md, section `angpt`): ν constants, LERP with ν(α), rows in the unit
    ball."""

    name = "angpt"
    title = "anGPT (approximately normalized GPT)"
    validate = NGPT.validate

    def default_logit_scale_speed(self, config):
        # The logit temperature the data asks for (a few nats) does not depend on the width, so neither does s_z's
        # speed; 256 was measured against √d and d at d = 256, 512 and 1024 (experiments/width_depth_stability).
        return 256.0

    def default_alpha_init(self, config) -> float:
        """The papers' 0.05 while α·L stays within ALPHA_DEPTH_LIMIT, else ALPHA_DEPTH_LIMIT / L (0.10 / L)
        (docs/architectures.md, "Deep models start with a smaller α")."""
        return min(PAPER_ALPHA_INIT, ALPHA_DEPTH_LIMIT / config.num_hidden_layers)

    def alpha_depth_warning(self, config) -> str | None:
        layers = config.num_hidden_layers
        product = config.alpha_init * layers
        if product <= ALPHA_DEPTH_LIMIT + 1e-9:
            return None
        # A product just over the limit (0.0167 x 24 = 0.4008) must not read "0.4 is above 0.4", so it gets the
        # digits that tell it apart; the values offered are rounded down to four significant digits so that each passes
        # this check itself (0.1 / 24 = 0.0041667 shown as 0.004167 would be above the limit).
        shown = next(text for text in (f"{product:.{digits}g}" for digits in range(4, 17))
                     if text != f"{ALPHA_DEPTH_LIMIT:g}")
        use = _round_down(self.default_alpha_init(config))
        largest = _round_down(ALPHA_DEPTH_LIMIT / layers)
        return (f"anGPT with alpha_init={config.alpha_init:g} and {layers} layers: alpha_init x layers = {shown} "
                f"is above {ALPHA_DEPTH_LIMIT:g}, the limit a seed sweep of 24-layer anGPTs set (experiments/deep_alpha), "
                f"and such runs tend to blow up in their first steps; use alpha_init={use:g} (the default at this "
                f"depth; leave alpha_init unset to get it)" + (f" or at most {largest:g}" if largest != use else ""))

    def blow_up_knobs(self, config) -> list[str]:
        return [f"alpha_init x layers = {config.alpha_init * config.num_hidden_layers:.4g} "
                f"(limit {ALPHA_DEPTH_LIMIT:g})"]

    def residual(self, config):
        size = config.hidden_size if config.alpha_shape == "vector" else 1
        return ApproxLerp(size, config.alpha_init, 1.0 / math.sqrt(config.hidden_size), config.alpha_abs,
                          nu=config.alpha_nu)

    def constants(self, config):
        d, d_h, m = config.hidden_size, config.head_dim, config.intermediate_size
        # The paper writes ν_qkv = √(d/d_h), ν_p = √(d_h/d) with d_h = d/H. With head_dim set freely (H·d_h ≠ d) and
        # grouped-query attention, d_h is config.head_dim, the per-head width, and both constants keep their form,
        # because each is derived from one head and from the width H·d_h of the concatenated output, not from d/H:
        # - ν_qkv: unit rows over d inputs and a unit input give E‖(W_v h)_head‖² = d_h/d for every key/value head,
        #   however many there are, so ν_qkv = √(d/d_h).
        # - ν_p: the H query heads' unit outputs concatenated have ‖y‖² = H over H·d_h channels; unit rows of W_o over
        #   those H·d_h inputs give E‖W_o y‖² = d·‖y‖²/(H·d_h) = d/d_h, so ν_p = √(d_h/d). Under GQA
        #   the output still has H heads (each query head reads its group's key/value head), so H_kv does not enter.
        nu_qkv = math.sqrt(d / d_h)
        nu_p = math.sqrt(d_h / d)
        nu_uz = math.sqrt(d / m)  # 0.5 at m = 4d
        nu_d = math.sqrt(m / d)  # 2 at m = 4d
        up_gain = nu_uz * (math.sqrt(d) if config.gate_sqrt_d == "both" else 1.0)
        gate_gain = nu_uz * math.sqrt(d)
        # ν_acf = 1/√E‖u ⊙ SiLU(z)‖² with ‖u‖² = m·up_gain²/d and z_i ~ N(0, gate_gain²/d) (docs/architectures.md):
        # for the paper's gate (variance 1/4) this is 1/√0.07225 = 3.720; the paper's 3.74 is a Monte-Carlo
        # estimate of the same quantity at small d.
        nu_acf = 1.0 / math.sqrt(m * up_gain**2 / d * silu_second_moment(gate_gain / math.sqrt(d)))
        # q and k get no ν_qkv: the exact QK norm that follows removes any positive factor.
        return dict(v=nu_qkv, o=nu_p * config.nu_att, up=up_gain * nu_acf, gate=gate_gain, down=nu_d)

    def init_matrix(self, weight, config, residual_output):
        # Gaussian rows rescaled to unit norm: the model starts on the boundary of its ball (docs/architectures.md).
        weight = torch.randn_like(weight)
        return weight / weight.norm(dim=-1, keepdim=True).clamp_min(1e-12)

    @torch.no_grad()
    def constrain(self, weight, residual_output):
        # w ← w / max(1, ‖w‖) per row, i.e. per output unit over its inputs (E per token, W_down over 4d).
        norms = weight.float().norm(dim=-1, keepdim=True)
        weight.div_(norms.clamp_min(1.0).to(weight.dtype))

    @staticmethod
    def norm_axis(residual_output: bool) -> int:
        return -1  # rows, whatever the matrix

    def project_stacked(self, weights, stacked, norms):
        torch._foreach_div_(weights, list(norms.clamp_min(1.0).to(weights[0].dtype).unbind(0)))


# --- the folded inference forms (docs/inference-fold.md) ---------------------------------------------------------
class _Folded:
    """Mixin: nothing to learn, nothing to constrain. The inference forms still build from a config alone."""

    def init_matrix(self, weight, config, residual_output):
        return torch.randn_like(weight) * config.initializer_range  # placeholder until the folded weights load

    def constrain(self, weight, residual_output):
        raise RuntimeError(FOLDED_TRAINING_ERROR)

    def constrain_all(self, matrices, reduce_group=None):
        raise RuntimeError(FOLDED_TRAINING_ERROR)

    def optimizer_param_groups(self, model, weight_decay):
        raise RuntimeError(FOLDED_TRAINING_ERROR)

    def constants(self, config):
        return Architecture.constants(self, config)  # all 1: every constant lives in the weights


class _FoldedUnitQK(_Folded):
    """Mixin of nGPT's and anGPT's folded forms: q and k are exactly L2-normalised, so all of their factors (√d_h,
    s_qk²) meet on q as one gain c_q; s_u, s_v, √d and s_z are in the matrices."""

    def qk_scale(self, config):
        return None

    def query_gain(self, config):
        # c_q = √d_h · s_qk² on the normalised q after RoPE; k gets nothing; softmax scale 1.
        return gain_for(config, config.num_attention_heads * config.head_dim)

    def mlp_scales(self, config):
        return None, None

    def logit_scale(self, config):
        return None

    def softmax_scale(self, config):
        return 1.0


class FoldedAnGPT(_FoldedUnitQK, AnGPT):
    """anGPT after the fold: h̃ ← h̃ + x̃ with every ν, s_u, s_v, s_z, β and 1/D in the matrices."""

    def residual(self, config):
        return AddResidual()


class FoldedNGPT(_FoldedUnitQK, NGPT):
    """nGPT after the fold: α and the norms stay (they cannot fold); s_u, s_v, √d, s_z, s_qk go."""

    def residual(self, config):
        # α stored as its effective value (init = scale = 1, so the stored vector is α itself), |α| baked in.
        size = config.hidden_size if config.alpha_shape == "vector" else 1
        return NormalizedLerp(size, 1.0, 1.0, alpha_abs=False)


class FoldedGPTPlus(_Folded, GPTPlus):
    """GPT+ after the fold: gain-less RMSNorms (gains in the next matrices' columns), 1/√d_h on the q side."""

    def branch_norm(self, config):
        return RMSNorm(config.hidden_size, config.rms_norm_eps, gain=False)

    def final_norm(self, config):
        return RMSNorm(config.hidden_size, config.rms_norm_eps, gain=False)

    def softmax_scale(self, config):
        return 1.0  # 1/√d_h is a scalar, so it commutes with RoPE and sits in q_norm's gain (or W_q)


# --- the registry --------------------------------------------------------------------------------------------------
ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(strategy: Architecture, folded: Architecture | None = None) -> Architecture:
    """Make `architecture=strategy.name` available to configs (and `folded` the form its exported checkpoints
    run; without one, such a model cannot be exported)."""
    strategy.folded_form = folded
    ARCHITECTURES[strategy.name] = strategy
    return strategy


register_architecture(GPTPlus(), FoldedGPTPlus())
register_architecture(NGPT(), FoldedNGPT())
register_architecture(AnGPT(), FoldedAnGPT())


def get_architecture(config) -> Architecture:
    """The strategy for `config.architecture` (its folded inference form when `config.folded`)."""
    strategy = ARCHITECTURES.get(config.architecture)
    if strategy is None:
        raise ValueError(f"no architecture registered as {config.architecture!r}; known: {sorted(ARCHITECTURES)}")
    if getattr(config, "folded", False):
        if strategy.folded_form is None:
            raise ValueError(f"architecture {config.architecture!r} has no folded inference form")
        return strategy.folded_form
    return strategy
