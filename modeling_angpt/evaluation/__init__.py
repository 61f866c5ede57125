"""Evaluation of checkpoints: held-out loss on the training corpus and lm-eval-harness tasks."""
