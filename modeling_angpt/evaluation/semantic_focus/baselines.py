"""The trivial baselines every semantic-focus result is reported with (docs/evaluation.md, "Semantic-focus
tasks"): what a classifier scores on the held-out split without reading the sequence as a whole.

- **majority class**: always answer the training split's most frequent label.
- **one position**: answer from one symbol alone. For each position p (counted from the start, p = 0, 1, ..., and
  from the end, p = -1, -2, ..., so variable-length tasks have their last symbols too), the rule maps the symbol
  found at p (or "no symbol" when the sequence is shorter) to the training split's most frequent label given that
  symbol. The position whose rule is most accurate on the training split is kept (ties: the first found, starts
  before ends); its held-out accuracy is the baseline.

A model's held-out accuracy means something only above both: e.g. Stack Manipulation's top-of-stack label is
mostly decided by the last action.
"""
from __future__ import annotations

from collections import Counter, defaultdict

ABSENT = None  # the "symbol" at a position past the end of a shorter sequence


def _symbol(sequence, position: int):
    return sequence[position] if -len(sequence) <= position < len(sequence) else ABSENT


def _rule(train, position: int, fallback) -> dict:
    counts = defaultdict(Counter)
    for sequence, label in train:
        counts[_symbol(sequence, position)][label] += 1
    # most frequent label per symbol; ties broken towards the smaller label, so the rule is deterministic
    return {symbol: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for symbol, c in counts.items()} | {
        "__fallback__": fallback}


def _accuracy(rule: dict, rows, position: int) -> float:
    hits = sum(rule.get(_symbol(sequence, position), rule["__fallback__"]) == label for sequence, label in rows)
    return hits / max(len(rows), 1)


def trivial_baselines(train, heldout) -> dict:
    """{"majority_class": {...}, "one_position": {...}} for lists of (sequence, label) pairs (any hashable symbols:
    the task's symbols or their token ids); accuracies are on `heldout`."""
    train, heldout = list(train), list(heldout)
    if not train:
        raise ValueError("trivial baselines need a non-empty training split")
    labels = Counter(label for _, label in train)
    majority = min(labels.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    longest = max(len(sequence) for sequence, _ in train)
    best = None
    for position in [*range(longest), *range(-1, -longest - 1, -1)]:
        rule = _rule(train, position, majority)
        fit = _accuracy(rule, train, position)
        if best is None or fit > best[0]:
            best = (fit, position, rule)
    fit, position, rule = best
    return {"majority_class": {"label": majority, "heldout_acc": _accuracy({"__fallback__": majority}, heldout, 0)},
            "one_position": {"position": position, "train_acc": fit, "heldout_acc": _accuracy(rule, heldout, position)}}


def split_baselines(splits) -> dict:
    """trivial_baselines of a `build_splits` DatasetDict, on its token ids."""
    return trivial_baselines(*(zip(splits[name]["input_ids"], splits[name]["label"])
                               for name in ("train", "heldout")))


__all__ = ["split_baselines", "trivial_baselines"]
