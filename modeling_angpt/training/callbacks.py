"""transformers.Trainer support: a callback that applies the architecture's weight constraint.

Trainer (and TRL's trainers, which subclass it) knows nothing of nGPT's unit-norm or anGPT's row-ball
constraint (docs/architectures.md); without this callback anGPT rows drift above norm 1 and the ν constants
no longer describe the activations. Usage:
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[WeightConstraintCallback()])
"""
from __future__ import annotations

from transformers import TrainerCallback

from ..pretrained_angpt import restore_4bit_layout
from .distributed import apply_weight_constraints


def _unwrap(model):
    # Trainer hands callbacks its unwrapped model, but a DDP/FSDP/compile wrapper may still get here.
    while hasattr(model, "module"):
        model = model.module
    return getattr(model, "_orig_mod", model)


class WeightConstraintCallback(TrainerCallback):
    """Project weights back onto the constraint set at the start and after every optimiser step; at the start, keep
    bitsandbytes' 4-bit layers on the CPU path that passes gradients back (restore_4bit_layout).
    On every rank (each replica applies the same projection, so DDP replicas stay identical; FSDP2 shards are
    handled by training/distributed.py)."""

    def _apply(self, model) -> None:
        if model is not None:
            apply_weight_constraints(_unwrap(model))

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:  # QLoRA on a CPU: evaluations between steps must not repack the 4-bit weights
            restore_4bit_layout(_unwrap(model), keep_generic=True)
        self._apply(model)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        # Right after optimizer.step(), before anything (logging, eval, save) reads the weights.
        self._apply(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # Idempotent after on_optimizer_step; kept for trainers that do not fire on_optimizer_step.
        self._apply(model)
