"""Task definitions that training and evaluation share: how a task's examples are built and how answers are scored.

`needle`: needle in a haystack. Training fine-tunes on its examples (recipe key dataset_kind: needle), evaluation
scores a model on them (`angpt eval --suite needle`, the lm-eval task angpt_needle). This package sits below both
modeling_angpt.training and modeling_angpt.evaluation and imports neither.
"""
