"""Is the run still approximately normalized? The norms an architecture's constants assume, measured on the
evaluation batches (docs/architectures.md, "Watching the norms during training").

anGPT's ν factors are derived for unit-norm inputs and outputs: the stream h entering each block has norm ≈ 1, and so
do the branch outputs x_A = ν_p·W_o o (at most 1: averaging value vectors shortens it) and x_M = ν_d·W_down a before the
residual update mixes them in. nGPT normalises h exactly, so what is left to watch is its distance from the unit
sphere, |‖h‖ − 1|. For each layer the per-token norms are summarised as their mean and max over every evaluation
batch and every process; GPT+ has nothing of the kind to report.

`NormProbe` registers forward pre-hooks for one evaluation and removes them when it ends, so training steps never
run them. It reads what the hooked modules receive: the decoder layer's first argument (h), and the residual update's
inputs (h, x̃, weights). anGPT's residual gets the branch output already multiplied by β = ν(α)·α (folded into the
output projection's rows, docs/inference-fold.md), so x = x̃ / β. Which quantities a layer has follows from the class
of its residual update (`PROBES`), the module that defines the architecture's normalisation, so no architecture name
is asked for here.
"""
from __future__ import annotations

import torch

from ..layers_angpt import ApproxLerp, NormalizedLerp


def _norms(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x.detach().float(), dim=-1).flatten()  # one per token


def _branch_output(x: torch.Tensor, weights) -> torch.Tensor:
    """anGPT's branch output before its β = ν(α)·α row scale (a β of exactly 0 would be a dead channel)."""
    beta = weights.branch_scale.detach().float()
    return x.detach().float() / torch.where(beta == 0, torch.ones_like(beta), beta)


# The residual update's class -> ({quantity: what it measures}, how the stream's norm is reported).
PROBES = {
    ApproxLerp: {"h": _norms, "branches": lambda x, weights: _norms(_branch_output(x, weights))},
    NormalizedLerp: {"h_dist": lambda h: (_norms(h) - 1.0).abs(), "branches": None},
}


class NormProbe:
    """`with NormProbe(model) as probe: evaluate(...)`, then `probe.summary(accelerator)`: {"norm/QUANTITY_mean/layerI":
    float, "norm/QUANTITY_max/layerI": float}. QUANTITY is h (anGPT: ‖h‖ entering the block), attn and mlp (anGPT: the
    branch outputs ‖x_A‖, ‖x_M‖) or h_dist (nGPT: |‖h‖ − 1| entering the block). Empty for architectures without a
    probe (GPT+, folded forms)."""

    def __init__(self, model):
        inner = getattr(model, "model", model)
        self.layers = list(getattr(inner, "layers", []))
        self.handles = []
        self.eager = None  # torch.compiler's stance for the probed evaluation (see __enter__)
        self.stats = {}  # key -> (sum, count, max); sum and max stay on the device: a hook never waits for it

    def _add(self, key: str, values: torch.Tensor) -> None:
        total, count, peak = values.sum(dtype=torch.float64), values.numel(), values.max().double()
        if key in self.stats:
            before = self.stats[key]
            total, count, peak = before[0] + total, before[1] + count, torch.maximum(before[2], peak)
        self.stats[key] = (total, count, peak)

    def _hook(self, key: str, measure, *positions: int):
        """A forward pre-hook adding `measure(args[positions])` under `key`."""
        return lambda _module, args: self._add(key, measure(*(args[p] for p in positions)))

    def __enter__(self) -> "NormProbe":
        for index, layer in enumerate(self.layers):
            probe = PROBES.get(type(getattr(layer, "attn_residual", None)))
            if probe is None:
                continue
            stream = next(key for key in probe if key != "branches")
            self.handles.append(layer.register_forward_pre_hook(self._hook(f"{stream}/layer{index}", probe[stream], 0)))
            if probe["branches"] is not None:  # the residual update's inputs: (h, x̃, weights)
                for name, module in (("attn", layer.attn_residual), ("mlp", layer.mlp_residual)):
                    hook = self._hook(f"{name}/layer{index}", probe["branches"], 1, 2)
                    self.handles.append(module.register_forward_pre_hook(hook))
        if self.handles:
            # Blocks compiled by `torch_compile` would not run hooks added to modules inside them (dynamo does not
            # guard on hooks registered after it traced), so the probed evaluation runs them eagerly.
            self.eager = torch.compiler.set_stance("force_eager")
            self.eager.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.eager is not None:
            self.eager.__exit__(*exc)
            self.eager = None

    def summary(self, accelerator) -> dict[str, float]:
        """Mean and max per quantity and layer over every process's evaluation batches (every rank must call it)."""
        keys = sorted(self.stats)
        if not keys:  # no probe for this architecture (the same on every rank)
            return {}
        local = torch.stack([torch.stack([total, torch.tensor(float(count), dtype=torch.float64, device=total.device),
                                          peak]) for total, count, peak in (self.stats[k] for k in keys)])
        local = local.to(accelerator.device)
        gathered = accelerator.gather(local[None]).reshape(-1, len(keys), 3)  # [processes, keys, (sum, count, max)]
        sums, counts, maxima = gathered[..., 0].sum(0), gathered[..., 1].sum(0), gathered[..., 2].amax(0)
        summary = {}
        for i, key in enumerate(keys):
            quantity, layer = key.split("/")
            summary[f"norm/{quantity}_mean/{layer}"] = float(sums[i] / counts[i].clamp(min=1))
            summary[f"norm/{quantity}_max/{layer}"] = float(maxima[i])
        return summary
