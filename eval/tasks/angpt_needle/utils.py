"""Data builder and scorer of the lm-eval task `angpt_needle` (the code lives in modeling_angpt.evaluation.needle and
modeling_angpt.tasks.needle).

`build_dataset` receives lm-eval's metadata: the model arguments (`pretrained=DIR`, optionally `tokenizer=`) merged
with `--metadata` JSON and the subtask's `multiple`. Metadata keys read here: `num_samples` (examples per length,
default 50), `seed` (default 0; the same examples as `angpt eval DIR --suite needle --seed S`) and `train_length`
(only for checkpoints without training_metadata.json; a value that contradicts it is refused, since another block
size would re-split the corpus and put training text in the haystack). The haystack filler is DIR's held-out text.
"""
from __future__ import annotations

import datasets

from modeling_angpt.evaluation.needle import DEFAULT_EXAMPLES, needle_documents
from modeling_angpt.tasks.needle import exact_match, score_answer


def build_dataset(multiple: int = 1, pretrained=None, tokenizer=None, num_samples: int = DEFAULT_EXAMPLES,
                  seed: int = 0, train_length: int | None = None, **_ignored) -> dict:
    from transformers import AutoTokenizer

    if not isinstance(pretrained, str) or not pretrained:
        raise ValueError("angpt_needle builds its haystacks from a checkpoint directory's held-out text: pass "
                         "--model_args pretrained=DIR (or --metadata '{\"pretrained\": \"DIR\"}')")
    tok = AutoTokenizer.from_pretrained(tokenizer if isinstance(tokenizer, str) and tokenizer else pretrained)
    rows = needle_documents(pretrained, tok, int(multiple), int(num_samples), int(seed), train_length)
    return {"test": datasets.Dataset.from_list(rows)}


def process_results(doc: dict, results: list[str]) -> dict:
    """needles_found: the fraction of the three needles the answer names, in any order; exact_match: the answer line
    equals the target string (white space normalised). modeling_angpt/tasks/needle.py states the rules."""
    return {"needles_found": score_answer(results[0], doc["cities"], doc["numbers"]),
            "exact_match": exact_match(results[0], doc["target"])}
