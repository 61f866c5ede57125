"""Evaluation of checkpoints: lm-eval tasks (eval/tasks: offline tasks from local held-out text, the anGPT
paper's downstream set) on the in-memory model, and the project's own suites (held-out loss on the training
validation split, length generalisation, needle retrieval). `angpt eval` (modeling_angpt.commands.eval) is
the command-line front door to `evaluate`."""
from .runner import EvalInputError, default_options, evaluate

__all__ = ["EvalInputError", "default_options", "evaluate"]
