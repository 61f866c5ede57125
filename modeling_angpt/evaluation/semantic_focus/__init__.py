"""Semantic-focus tasks (Ram et al.; docs/evaluation.md, "Semantic-focus tasks"): generators, fixed tokenizers and
the paper's training protocol."""
from .tasks import TASKS, build_splits, generate_samples, get_task
from .tokenizer import build_tokenizer

__all__ = ["TASKS", "build_splits", "generate_samples", "get_task", "build_tokenizer", "run_protocol"]


def __getattr__(name):  # the protocol imports torch and the model: load it only when asked for
    if name == "run_protocol":
        from .protocol import run_protocol
        return run_protocol
    raise AttributeError(name)
