"""Evaluation of checkpoints: lm-eval tasks (eval/tasks: offline tasks from local held-out text, the anGPT
paper's downstream set) on the in-memory model, and the project's own suites (held-out loss on the training
validation split, length generalisation, needle retrieval). `evaluate(checkpoint, EvalOptions(...))` is the Python
entry point; `angpt eval` (modeling_angpt.commands.eval) is its command-line front door."""
from .options import EvalOptions
from .runner import EvalInputError, evaluate

__all__ = ["EvalInputError", "EvalOptions", "evaluate"]
