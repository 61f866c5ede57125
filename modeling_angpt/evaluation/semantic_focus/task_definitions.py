"""The semantic-focus task definitions: each task's symbols, classes and generator, and the seeded splits (Ram et
al., "Transformers Learn Faster with Semantic Focus"; docs/evaluation.md, "Semantic-focus tasks").

Seven tasks of Delétang et al.'s "Neural networks and the Chomsky hierarchy" (NNCH) at a fixed length of 40
symbols, and ListOps (Nangia & Bowman, in the Long Range Arena generator's form; `listops.py`). Each sample is
a list of symbols (one symbol = one token of the task's fixed vocabulary, `tokenizer.py`) and one class label:
every task is sequence classification.

Where the paper's exact format was not published, the definitions follow the authors' released data and
upstream generators (recorded per task below):

- **even_pairs**: 40 uniform symbols over {a, b}; label = number of adjacent unequal pairs (`ab` or `ba`)
  mod 2, class 0 = even. (It equals [first ≠ last], which is how it is computed here.)
- **parity**: 40 uniform bits; label = number of 1s mod 2.
- **cycle_navigation**: 40 uniform moves over {-1, 0, +1} on a cycle of 5 states starting at 0; label = the
  final state.
- **modular_arithmetic**: the paper's "modular arithmetic with brackets" *with* multiplication: an expression
  of exactly 40 symbols over digits 0–4, `+ - *`, `( )` from DeepMind's recursive generator (length 1: `d`;
  2: `-d`; 3: `(d)`; 4: `(-d)`; otherwise `( left op right )` with a left length uniform in 1..n-4, op uniform
  over + - *); label = the value mod 5 (integer semantics, then mod 5; `--0` and `3*-2` occur).
- **solve_equation**: a 38-symbol bracketed +/- expression (the generator above without `*`); one digit,
  found by scanning forward (with wrap-around) from a uniform random position, is replaced by `x`, then `=`
  and the original expression's value mod 5 are appended (40 symbols); label = the hidden digit (unique: the
  expression is linear in x with coefficient ±1).
- **stack_manipulation**: an initial stack of ℓ ~ U{1..39} uniform bits (bottom → top), then 40 − ℓ uniform
  actions over {POP, PUSH_0, PUSH_1} (POP on an empty stack does nothing); label = the final top symbol (0 or
  1), or 2 for an empty stack. The paper keeps only the top of DeepMind's full-stack target; class 2 is rare.
- **missing_duplicates**: s = 20 uniform bits, the input is s‖s with one uniformly chosen position of the 40
  replaced by `_`; label = the hidden bit.

Splits: one seeded pool of distinct sequences, the first `n_train` for training and the next `n_heldout`
held out, so the splits are disjoint and identical for a seed on every machine (`random.Random` seeded with a
string, which does not depend on PYTHONHASHSEED).

Length generalisation (`build_splits(..., length_generalisation=True)`, NNCH's own protocol): training sequences
have lengths uniform in 1–40 and held-out ones lengths uniform in 41–500, each length drawn per sequence (from the
shortest length a task can form: 2 for stack_manipulation, 3 for solve_equation; even lengths only for
missing_duplicates, whose input is a string written twice). ListOps has no such split.

Stack Manipulation differs from NNCH: NNCH's model outputs the whole final stack (a sequence), which a one-label
classifier cannot express without one class per possible stack (2^40 of them); the paper keeps only the top, so
this task does. Its label is then mostly decided by the last action: a final PUSH_s leaves s on top, and only a
final POP needs the stack. What that shortcut scores: docs/evaluation.md, "Semantic-focus tasks" (baselines.py
reports it with every result).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from .listops import LISTOPS_SYMBOLS, sample_listops
from .tokenizer import build_tokenizer

Sample = tuple[list[str], int]


@dataclass(frozen=True)
class Task:
    """A task: its symbols, classes, sampler and the paper's training settings for it (protocol.py)."""

    name: str
    symbols: tuple[str, ...]
    num_classes: int
    sample: Callable[..., Sample]  # sample(rng, **length_kwargs) -> (symbols, label)
    epochs: int  # the paper's epoch budget (chosen so full attention reaches 100 % train accuracy)
    lr: float = 0.1
    gamma: float = 0.9995  # StepLR factor per epoch
    num_layers: int = 5
    length: int = 40  # NNCH: fixed length; ListOps: see listops.py (501–599)
    class_names: tuple[str, ...] | None = None
    shortest: int = 1  # the shortest length the sampler forms (length generalisation draws from here)
    length_step: int = 1  # missing_duplicates: even lengths only

    def labels(self) -> list[str]:
        return list(self.class_names or [str(i) for i in range(self.num_classes)])


def _even_pairs(rng: random.Random, length: int = 40) -> Sample:
    seq = [rng.choice("ab") for _ in range(length)]
    return seq, int(seq[0] != seq[-1])  # transitions a→b and b→a alternate, so their count's parity is first≠last


def _parity(rng: random.Random, length: int = 40) -> Sample:
    bits = [rng.randrange(2) for _ in range(length)]
    label = 0
    for bit in bits:
        label ^= bit
    return [str(b) for b in bits], label


CYCLE = 5
MOVES = {"-1": -1, "0": 0, "+1": 1}


def _cycle_navigation(rng: random.Random, length: int = 40) -> Sample:
    moves = [rng.choice(tuple(MOVES)) for _ in range(length)]
    state = 0
    for move in moves:
        state = (state + MOVES[move]) % CYCLE
    return moves, state


MODULUS = 5


def bracket_expression(rng: random.Random, length: int, ops: str) -> tuple[list[str], int]:
    """DeepMind's recursive generator: an expression of exactly `length` symbols and its value mod 5, computed
    bottom-up in modular arithmetic."""
    if length <= 4:
        digit = rng.randrange(MODULUS)
        negative = length in (2, 4)
        symbols = (["-"] if negative else []) + [str(digit)]
        if length >= 3:
            symbols = ["("] + symbols + [")"]
        return symbols, (-digit if negative else digit) % MODULUS
    left_length = rng.randint(1, length - 4)
    left, left_value = bracket_expression(rng, left_length, ops)
    right, right_value = bracket_expression(rng, length - left_length - 3, ops)
    op = rng.choice(ops)
    value = {"+": left_value + right_value, "-": left_value - right_value, "*": left_value * right_value}[op]
    return ["("] + left + [op] + right + [")"], value % MODULUS


def _modular_arithmetic(rng: random.Random, length: int = 40) -> Sample:
    return bracket_expression(rng, length, "+-*")


def _solve_equation(rng: random.Random, length: int = 40) -> Sample:
    expression, value = bracket_expression(rng, length - 2, "+-")
    position = rng.randrange(len(expression))
    while not expression[position].isdigit():
        position = (position + 1) % len(expression)
    hidden = int(expression[position])
    expression[position] = "x"
    return expression + ["=", str(value)], hidden


STACK_ACTIONS = ("POP", "PUSH_0", "PUSH_1")
EMPTY_STACK = 2


def _stack_manipulation(rng: random.Random, length: int = 40) -> Sample:
    initial = rng.randint(1, length - 1)
    stack = [str(rng.randrange(2)) for _ in range(initial)]
    actions = [rng.choice(STACK_ACTIONS) for _ in range(length - initial)]
    symbols = stack + actions
    for action in actions:
        if action == "POP":
            if stack:
                stack.pop()
        else:
            stack.append(action[-1])
    return symbols, int(stack[-1]) if stack else EMPTY_STACK


MISSING = "_"


def _missing_duplicates(rng: random.Random, length: int = 40) -> Sample:
    half = [str(rng.randrange(2)) for _ in range(length // 2)]
    symbols = half + half
    position = rng.randrange(length)
    hidden = int(symbols[position])
    symbols[position] = MISSING
    return symbols, hidden


DIGITS5 = tuple(str(d) for d in range(MODULUS))
TASKS: dict[str, Task] = {task.name: task for task in (
    Task("even_pairs", ("a", "b"), 2, _even_pairs, epochs=100, class_names=("even", "odd")),
    Task("parity", ("0", "1"), 2, _parity, epochs=1000, class_names=("even", "odd")),
    Task("cycle_navigation", tuple(MOVES), CYCLE, _cycle_navigation, epochs=750),
    Task("modular_arithmetic", DIGITS5 + ("+", "-", "*", "(", ")"), MODULUS, _modular_arithmetic, epochs=600),
    Task("solve_equation", DIGITS5 + ("+", "-", "(", ")", "x", "="), MODULUS, _solve_equation, epochs=600,
         shortest=3),
    Task("stack_manipulation", ("0", "1") + STACK_ACTIONS, 3, _stack_manipulation, epochs=200,
         class_names=("0", "1", "empty"), shortest=2),
    Task("missing_duplicates", ("0", "1", MISSING), 2, _missing_duplicates, epochs=250, shortest=2, length_step=2),
    Task("listops", LISTOPS_SYMBOLS, 10, sample_listops, epochs=200, lr=1.0, gamma=0.99, num_layers=10,
         length=600),
)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown semantic-focus task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]


TRAIN_LENGTHS, HELDOUT_LENGTHS = (1, 40), (41, 500)  # NNCH's length-generalisation split


def generate_samples(task: str | Task, count: int, seed: int, lengths: tuple[int, int] | None = None,
                     **length_kwargs) -> list[Sample]:
    """`count` distinct samples of a task, deterministic for (task, seed, length settings). `lengths=(lo, hi)`: each
    sequence's length drawn uniformly from lo..hi (from the task's shortest length; NNCH tasks only)."""
    task = get_task(task) if isinstance(task, str) else task
    if lengths is not None:
        if task.name == "listops":
            raise ValueError("the length-generalisation split is NNCH's; ListOps has its own lengths "
                             "(--listops-min-length, --listops-max-length)")
        low = max(lengths[0], task.shortest)
        choices = [n for n in range(low, lengths[1] + 1) if n % task.length_step == 0]
        sampler = task.sample

        def sample(rng):  # the length first, then the sequence, from the same stream
            return sampler(rng, length=rng.choice(choices))
        length_kwargs = {**length_kwargs, "lengths": f"{lengths[0]}-{lengths[1]}"}
    else:
        def sample(rng):
            return task.sample(rng, **length_kwargs)
    settings = ",".join(f"{key}={value}" for key, value in sorted(length_kwargs.items()))
    rng = random.Random(f"semantic-focus/{task.name}/{seed}/{settings}")
    samples, seen, attempts = [], set(), 0
    while len(samples) < count:
        attempts += 1
        if attempts > 20 * count + 1000:
            raise ValueError(f"{task.name}: could not draw {count} distinct sequences with {length_kwargs or 'defaults'}")
        symbols, label = sample(rng)
        key = " ".join(symbols)
        if key not in seen:
            seen.add(key)
            samples.append((symbols, label))
    return samples


def build_splits(task: str, seed: int = 0, n_train: int = 5000, n_heldout: int = 2000,
                 length_generalisation: bool = False, **length_kwargs):
    """`datasets.DatasetDict` with "train" and "heldout" (disjoint, seeded), columns `text` (symbols joined by
    spaces), `input_ids` (the task tokenizer's ids, no special tokens) and `label` (a ClassLabel).

    `length_kwargs`: `length` for the NNCH tasks (default 40); `min_length`, `max_length`, `max_depth`,
    `max_args` for ListOps (defaults 501, 599, 10, 10). `length_generalisation`: NNCH's split (module docstring),
    training lengths 1–40 and held-out lengths 41–500."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Sequence, Value

    spec = get_task(task)
    tokenizer = build_tokenizer(spec)
    if length_generalisation:
        tokenizer.model_max_length = HELDOUT_LENGTHS[1]
        if "length" in length_kwargs:
            raise ValueError("length_generalisation draws the lengths itself (1–40, then 41–500); drop `length`")
        samples = (generate_samples(spec, n_train, seed, TRAIN_LENGTHS, **length_kwargs)
                   + generate_samples(spec, n_heldout, seed, HELDOUT_LENGTHS, **length_kwargs))
    else:
        samples = generate_samples(spec, n_train + n_heldout, seed, **length_kwargs)
    features = Features({"text": Value("string"), "input_ids": Sequence(Value("int32")),
                         "label": ClassLabel(names=spec.labels())})

    def to_dataset(part: list[Sample]) -> Dataset:
        texts = [" ".join(symbols) for symbols, _ in part]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        return Dataset.from_dict({"text": texts, "input_ids": ids, "label": [label for _, label in part]},
                                 features=features)

    return DatasetDict(train=to_dataset(samples[:n_train]), heldout=to_dataset(samples[n_train:]))


__all__ = ["Task", "TASKS", "get_task", "generate_samples", "build_splits", "bracket_expression"]
