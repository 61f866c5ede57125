"""ListOps (Nangia & Bowman 2018) as the Long Range Arena generator builds it, with the semantic-focus paper's
settings: depth ≤ 10, 2–10 arguments per operator, 501–599 tokens, 10 classes (docs/evaluation.md).

Grammar (LRA `listops.py`, task "basic"): a node at depth < max_depth (the root has depth 1) is an operator
with probability 0.25, otherwise a digit 0–9; a node at max_depth is a digit. An operator is MIN, MAX, MED or
SM (uniform; LRA's FIRST and LAST are switched off) with U{2..max_args} children, written `[OP c1 … cn ]`.
MED is the floor of the median (numpy's median, then int); SM is the sum mod 10. Length counts tokens (`[OP`,
each digit, `]`); LRA keeps a tree iff min_length − 1 < length < max_length + 1 (500 < length < 600).

Two deliberate differences from LRA's script, neither of which changes the distribution of kept trees:
the value is computed bottom-up while the tree is drawn, and a tree is abandoned as soon as it exceeds
max_length (LRA would reject it anyway), which makes rejection sampling several times faster.
"""
from __future__ import annotations

import random

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
LISTOPS_SYMBOLS = OPERATORS + (CLOSE,) + tuple(str(d) for d in range(10))
OPERATOR_PROBABILITY = 0.25


class _TooLong(Exception):
    pass


def _apply(op: str, values: list[int]) -> int:
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[SM":
        return sum(values) % 10
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2


def _tree(rng: random.Random, depth: int, out: list[str], max_depth: int, max_args: int, max_length: int) -> int:
    """Append one subtree's tokens to `out` and return its value."""
    if len(out) >= max_length:
        raise _TooLong
    if depth >= max_depth or rng.random() > OPERATOR_PROBABILITY:
        digit = rng.randrange(10)
        out.append(str(digit))
        return digit
    count = rng.randint(2, max_args)
    op = rng.choice(OPERATORS)
    out.append(op)
    values = [_tree(rng, depth + 1, out, max_depth, max_args, max_length) for _ in range(count)]
    out.append(CLOSE)
    return _apply(op, values)


def sample_listops(rng: random.Random, min_length: int = 501, max_length: int = 599, max_depth: int = 10,
                   max_args: int = 10, length: int | None = None) -> tuple[list[str], int]:
    """One ListOps expression with min_length ≤ tokens ≤ max_length, and its value (the label).
    `length` is accepted and ignored so callers can pass the NNCH tasks' keyword to every task."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"ListOps: need 1 <= min_length <= max_length, got {min_length}, {max_length}")
    while True:
        out: list[str] = []
        try:
            value = _tree(rng, 1, out, max_depth, max_args, max_length)
        except _TooLong:
            continue
        if min_length <= len(out) <= max_length:
            return out, value
