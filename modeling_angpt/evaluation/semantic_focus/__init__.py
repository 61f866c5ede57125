"""Semantic-focus tasks (Ram et al.; docs/evaluation.md, "Semantic-focus tasks"): the task definitions
(task_definitions.py: generators and splits), their fixed tokenizers (tokenizer.py), the classifier trained on them
(classifier.py, or the paper's own encoder: paper_encoder.py) and the paper's training protocol (protocol.py)."""
from .task_definitions import TASKS, build_splits, generate_samples, get_task
from .tokenizer import build_tokenizer

__all__ = ["TASKS", "build_splits", "generate_samples", "get_task", "build_tokenizer", "ProtocolSettings",
           "run_protocol"]


def __getattr__(name):  # the protocol imports torch and the model: load it only when asked for
    if name in ("ProtocolSettings", "run_protocol"):
        from . import protocol
        return getattr(protocol, name)
    raise AttributeError(name)
