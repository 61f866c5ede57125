"""The interface every architecture implements, with the defaults they share (docs/architectures.md): the config
rules, the modules a decoder block asks for, the tensor-parallel plan, the ν constants, the initialisation, the weight
constraint and the optimiser groups. The three architectures and their folded forms override what differs
(architectures_angpt.py); the decoder block (modeling_angpt.py) asks only this interface.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn

from .layers_angpt import AddResidual, L2Norm, Scale

FOLDED_TRAINING_ERROR = (
    "this model is a folded inference checkpoint (config.folded=True, docs/inference-fold.md): its weights carry the "
    "ν constants, scales and residual rescaling of the training form, so they no longer satisfy the "
    "architecture's weight constraint and cannot be trained. Train the unfolded checkpoint and export again.")

PAPER_ALPHA_INIT = 0.05  # the nGPT and anGPT papers' initial LERP weight


class Architecture:
    """Defaults shared by all three; subclasses override what differs."""

    name: str = ""
    title: str = ""  # what a model card calls it
    folded_form: "Architecture | None" = None  # the strategy of this architecture's folded checkpoints

    # --- config ----------------------------------------------------------------------------------
    def validate(self, config) -> None:
        """Raise a ValueError for a config this architecture cannot build (after the generic checks)."""

    def default_logit_scale_speed(self, config) -> float:
        """config.logit_scale_speed when the config leaves it None: √d, nGPT's (docs/architectures.md, section `ngpt`)."""
        return config.hidden_size**0.5

    def default_alpha_init(self, config) -> float:
        """config.alpha_init when the config leaves it None: the papers' 0.05 (nGPT renormalises its stream exactly
        after every update, so its depth does not compound a drift of ‖h‖)."""
        return PAPER_ALPHA_INIT

    def alpha_depth_warning(self, config) -> str | None:
        """One line when a fresh model's α init is too large for its depth; None when there is nothing to say."""
        return None

    def blow_up_knobs(self, config) -> list[str]:
        """What a message on a blown-up run names besides the learning rate (training/loop.py)."""
        return []

    # --- modules ---------------------------------------------------------------------------------
    def branch_norm(self, config) -> nn.Module:
        return nn.Identity()

    def final_norm(self, config) -> nn.Module:
        return nn.Identity()

    def residual(self, config) -> nn.Module:
        return AddResidual()

    def qk_norm(self, config) -> nn.Module:
        """Applied per head to q and to k before RoPE (L2 norms commute with the rotation)."""
        return L2Norm()

    def qk_scale(self, config) -> Scale | None:
        """s_qk, one vector over all key heads' channels shared by q and k, applied after RoPE. Under grouped-query
        attention a channel of key head g also scales that channel of every query head reading g, so the logit
        keeps the form Σ_c s_c² q_c k_c (docs/architectures.md, section `ngpt`; with one head per group s_qk ∈ R^{H·d_h})."""
        return Scale(config.num_key_value_heads * config.head_dim, 1.0, 1.0 / math.sqrt(config.hidden_size))

    def query_gain(self, config) -> nn.Module | None:
        """A plain per-channel gain on q only, after RoPE: the folded inference form's c_q (docs/inference-fold.md)."""
        return None

    def mlp_scales(self, config) -> tuple[Scale, Scale] | tuple[None, None]:
        """(s_u, s_v) on the MLP's up and gate outputs."""
        size = config.intermediate_size
        return Scale(size, 1.0, 1.0), Scale(size, 1.0, 1.0)

    def logit_scale(self, config) -> Scale | None:
        """s_z on the logits; its reparameterisation sets how fast Adam moves it (config.logit_scale_speed)."""
        return Scale(config.vocab_size, 1.0, 1.0 / config.logit_scale_speed)

    # --- parallelism (docs/architectures.md, "Tensor and pipeline parallelism") ---------------------
    def tp_plan(self, config) -> dict[str, str]:
        """The base model's tensor-parallel plan in transformers' styles: q/k/v, gate and up split by output
        features (whole heads), o_proj and down_proj by input features; each per-feature vector that multiplies a
        split output is split the same way (its parameter `colwise`, its module run on this rank's part with
        `local_params`; the folded c_q is a map from 1 with a linear layer's interface, split `colwise`, which vLLM
        builds as a linear layer). Vectors on the whole stream (α,
        norm gains, s_z after the gathered head) stay whole."""
        attention, mlp = "layers.*.self_attn.", "layers.*.mlp."
        plan = {attention + "q_proj": "colwise", attention + "k_proj": "colwise", attention + "v_proj": "colwise",
                attention + "o_proj": "rowwise", mlp + "gate_proj": "colwise", mlp + "up_proj": "colwise",
                mlp + "down_proj": "rowwise"}
        if getattr(self.qk_norm(config), "weight", None) is not None:  # one gain over d_h, shared by every head
            plan.update({attention + "q_norm": "replicated_with_grad_allreduce",
                         attention + "k_norm": "replicated_with_grad_allreduce"})
        split = []  # the vectors on split outputs: s_qk (k's channels, and q's through its groups), c_q, s_u, s_v
        split += [attention + "qk_scale"] if self.qk_scale(config) is not None else []
        split += [mlp + "up_scale", mlp + "gate_scale"] if self.mlp_scales(config)[0] is not None else []
        for name in split:
            plan.update({name + ".weight": "colwise", name: "local_params"})
        if self.query_gain(config) is not None:  # c_q, a map from 1 (layers_angpt.Gain), split as a linear layer is
            plan[attention + "query_gain"] = "colwise"
        return plan

    # --- constants -------------------------------------------------------------------------------
    def softmax_scale(self, config) -> float:
        # With unit q and k (s_qk = 1) the logit √d_h·cos(q, k) equals GPT+'s RMS-normed q·k/√d_h.
        return math.sqrt(config.head_dim)

    def constants(self, config) -> dict[str, float]:
        """Row scales on v_proj, o_proj, up_proj, gate_proj and down_proj outputs."""
        return dict(v=1.0, o=1.0, up=1.0, gate=1.0, down=1.0)

    # --- parameters ------------------------------------------------------------------------------
    def init_matrix(self, weight: torch.Tensor, config, residual_output: bool) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def constrain(self, weight: torch.Tensor, residual_output: bool) -> None:
        """Project one matrix after an optimiser step (in place); nothing by default."""

    @torch.no_grad()
    def constrain_all(self, matrices: list[tuple[torch.Tensor, bool]], reduce_group=None) -> None:
        """Project every matrix after an optimiser step, as a few grouped ops (docs/architectures.md, "Weight
        constraints").

        Matrices of one shape, dtype, device and axis are stacked so that one norm, one clamp and one
        `torch._foreach_div_`/`_foreach_copy_` serve them all (about 5 groups per model instead of 3-4 ops per
        matrix); the results are bit-identical to `constrain` per matrix (tests/model/test_compile_and_constraints.py).
        `reduce_group`: the process group (or the groups, one per mesh dim) over which each norm is summed when each
        tensor is one rank's shard along the dim of its norm (FSDP2 shards dim 0; a tensor-parallel rowwise split,
        dim 1; both, on a 2-D mesh); None when the norms cover whole vectors."""
        if not self.norm_axis:
            return
        groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
        for weight, residual_output in matrices:
            groups[(tuple(weight.shape), weight.dtype, weight.device, residual_output)].append(weight)
        for (_, _, _, residual_output), weights in groups.items():
            dim = self.norm_axis(residual_output)
            stacked = torch.stack(weights).float()
            axis = dim + 1 if dim >= 0 else dim
            if reduce_group is not None:
                squares = stacked.square().sum(dim=axis, keepdim=True)  # the vector spans every rank's shard
                for group in reduce_group if isinstance(reduce_group, (list, tuple)) else [reduce_group]:
                    torch.distributed.all_reduce(squares, group=group)
                norms = squares.sqrt()
            else:
                norms = torch.linalg.vector_norm(stacked, dim=axis, keepdim=True)
            self.project_stacked(weights, stacked, norms)

    norm_axis = None  # callable residual_output -> dim of the norm, for architectures with a constraint

    def project_stacked(self, weights: list[torch.Tensor], stacked: torch.Tensor, norms: torch.Tensor) -> None:
        raise NotImplementedError

    def optimizer_param_groups(self, model: nn.Module, weight_decay: float) -> list[dict]:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": 0.0}]
