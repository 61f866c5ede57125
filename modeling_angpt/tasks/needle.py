"""Needle in a haystack (scale-invariant paper; docs/evaluation.md, "Needle in a haystack"): the example generator
and the scorer. Training fine-tunes on its examples (recipe key dataset_kind: needle), evaluation scores a model on
them (`angpt eval --suite needle`, the lm-eval task angpt_needle): it sits below both, in modeling_angpt/tasks/, and
imports nothing of the package (the model files never import it).

An example of token length L is filler text with three needles `The special magic <city> number is <n>.` (three
distinct cities, 7-digit numbers from 1000000 to 9999999) at uniformly random depths, then the question; the
target is `city1=n1;city2=n2;city3=n3` with the needles **in their order of appearance** in the haystack.

- Filler: lines of held-out corpus text ("units"; lines longer than 400 characters are cut at sentence ends),
  consecutive from a random start, wrapping around. Units and needles are joined by newlines, so each needle
  is a line of its own and sits between two units.
- Depth of a needle: the fraction of the filler's characters that precede it. The needle goes to the unit
  boundary nearest its drawn depth, so the realised depth is within one unit of the drawn one; the example
  records the realised depths.
- Length: tokens(prompt) + tokens(" " + target + "\\n") <= L, tokenised separately as training and inference see
  them; the filler is the run of units that fits, the last one cut to the tokens left (the paper trims its
  haystack to exactly L), so examples come within a few tokens of L.
- Every example is a pure function of (filler, tokenizer, L, seed, index): `NeedleGenerator.example`.

- Filler units that contain "special magic" (a needle sentence's or the question's words) are dropped, so every
  example has exactly its three needle sentences.
- Depth needs room: below `independent_depth_length` (the filler at least as long as the needles, question and
  answer together) needles often sit at the filler's edges or next to each other; `check_room` warns there.

Scoring (`score_answer`): the answer is the generated text up to its first newline. Its `city=digits` pairs are
read from the start, separated by `;` (spaces around the tokens tolerated), as far as they go: whatever follows
the last pair (a full stop, a trailing `;`, more text) is ignored. The answer scores 0 when it has no pair at its
start (empty text, garbage, a sentence), more pairs than needles, or a city named twice. Otherwise each needle
counts if some pair has its city (exact, case-sensitive) and its number: `score_answer` is the fraction of the
needles found, in any order. `exact_match` compares the whole answer line with the target string after
whitespace normalisation (runs of white space become one space, none at the ends).
"""
from __future__ import annotations

import random
import re
import warnings
from dataclasses import asdict, dataclass

import numpy as np

CITIES = ("Amsterdam", "Athens", "Bangkok", "Barcelona", "Beijing", "Berlin", "Bogota", "Boston", "Brussels",
          "Budapest", "Cairo", "Chicago", "Copenhagen", "Dakar", "Delhi", "Dublin", "Edinburgh", "Florence",
          "Geneva", "Hanoi", "Havana", "Helsinki", "Istanbul", "Jakarta", "Kyoto", "Lagos", "Lima", "Lisbon",
          "London", "Madrid", "Manila", "Marseille", "Melbourne", "Mexico", "Milan", "Montreal", "Moscow", "Mumbai",
          "Munich", "Nairobi", "Naples", "Oslo", "Paris", "Prague", "Quito", "Riga", "Rome", "Santiago", "Seoul",
          "Shanghai", "Singapore", "Stockholm", "Sydney", "Taipei", "Tokyo", "Toronto", "Valencia", "Venice",
          "Vienna", "Warsaw", "Zurich")
NEEDLE = "The special magic {city} number is {number}."
QUESTION = "\nWhat are the special magic numbers?\nAnswer:"
NUM_NEEDLES = 3
MAX_UNIT_CHARS = 400
MAX_NEW_TOKENS = 96  # generation budget for the answer line (the lm-eval task and evaluation/needle.py)

_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
_PAIR = re.compile(r"\s*([A-Za-z][A-Za-z .'-]*?)\s*=\s*(\d+)")
_SEPARATOR = re.compile(r"\s*;")
_NEEDLE_LIKE = re.compile(r"special\s+magic", re.IGNORECASE)  # a needle sentence's (and the question's) words


def filler_units(text: str) -> list[str]:
    """Non-empty lines of `text` (stripped), long ones cut at sentence ends into pieces of <= MAX_UNIT_CHARS; pieces
    that read like a needle ("special magic") are dropped."""
    units = []
    for line in text.splitlines():
        line = line.strip()
        if len(line) <= MAX_UNIT_CHARS:
            units += [line] if line else []
            continue
        piece = ""
        for sentence in _SENTENCE_END.split(line):
            if piece and len(piece) + len(sentence) + 1 > MAX_UNIT_CHARS:
                units.append(piece)
                piece = ""
            piece = f"{piece} {sentence}".strip()
            while len(piece) > MAX_UNIT_CHARS:
                units.append(piece[:MAX_UNIT_CHARS])
                piece = piece[MAX_UNIT_CHARS:]
        units += [piece] if piece else []
    return [unit for unit in units if not _NEEDLE_LIKE.search(unit)]


@dataclass(frozen=True)
class NeedleExample:
    prompt: str          # haystack with the needles, then QUESTION
    target: str          # "city1=n1;city2=n2;city3=n3" in order of appearance
    cities: tuple        # in order of appearance
    numbers: tuple       # strings of 7 digits, same order
    depths: tuple        # realised depth of each needle (fraction of filler characters before it)
    length: int          # the token budget L
    tokens: int          # tokens(prompt) + tokens(" " + target + "\n") <= length

    @property
    def answer(self) -> str:
        """What follows the prompt in training: a space, the target, a newline (the end of the answer)."""
        return f" {self.target}\n"

    def to_dict(self) -> dict:
        row = asdict(self)
        row.update(cities=list(self.cities), numbers=list(self.numbers), depths=list(self.depths))
        return row


def filler_from_blocks(tokenizer, blocks) -> str:
    """Filler text from token blocks [n, L] of a corpus split: each block decoded, one after the other."""
    return "\n".join(tokenizer.batch_decode(np.asarray(blocks, dtype=np.int64).tolist()))


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def minimum_length(tokenizer) -> int:
    """An upper bound on the tokens of the needles, question and answer of any example (the three cities of
    most tokens, every digit a token of its own): shorter lengths leave no room for filler."""
    longest = sorted(CITIES, key=lambda c: _count(tokenizer, NEEDLE.format(city=c, number="")))[-3:]
    needles = sum(_count(tokenizer, NEEDLE.format(city=c, number="")) + 7 + 2 for c in longest)
    answer = _count(tokenizer, " " + ";".join(f"{c}=" for c in longest) + "\n") + 3 * 8
    return needles + answer + _count(tokenizer, QUESTION)


def independent_depth_length(tokenizer) -> int:
    """The shortest length whose filler is at least as long as the needles, question and answer: shorter haystacks
    have so few filler units that needles often share a boundary or sit at depth 0 or 1."""
    return 2 * minimum_length(tokenizer)


def check_room(tokenizer, length: int, what: str = "length") -> None:
    """ValueError (one line) when `length` tokens may not hold three needles, the question and the answer; a
    warning when they leave too little filler for needles at independent depths."""
    minimum = minimum_length(tokenizer)
    if length < minimum:
        raise ValueError(f"needle examples take up to {minimum} tokens before any filler (three needles, the "
                         f"question and the answer); {what} {length} is too short")
    if length < independent_depth_length(tokenizer):
        warnings.warn(f"{what} {length} leaves as few as {length - minimum} tokens of filler: needles will often sit "
                      f"next to each other or at depth 0 or 1; lengths of at least {independent_depth_length(tokenizer)} "
                      "tokens place them at independent depths", stacklevel=2)


class NeedleGenerator:
    """Examples over the filler `text` (held-out corpus text), sized in tokens of `tokenizer`."""

    def __init__(self, text: str, tokenizer, num_needles: int = NUM_NEEDLES):
        self.units = filler_units(text)
        if not self.units:
            raise ValueError("needle filler text is empty")
        self.tokenizer, self.num_needles = tokenizer, num_needles
        # Per-unit token counts (+1 for the joining newline): a close over-estimate of the joined text's count.
        counts = tokenizer(self.units, add_special_tokens=False)["input_ids"]
        self.unit_tokens = [len(ids) + 1 for ids in counts]

    def example(self, length: int, seed: int, index: int) -> NeedleExample:
        rng = random.Random(f"angpt-needle/{seed}/{index}")  # string seeds hash deterministically across runs
        cities = rng.sample(CITIES, self.num_needles)
        numbers = [str(rng.randint(1_000_000, 9_999_999)) for _ in cities]
        depths = [rng.random() for _ in cities]
        start = rng.randrange(len(self.units))
        needles = [NEEDLE.format(city=c, number=n) for c, n in zip(cities, numbers)]
        # Fixed part: needles, question and answer (the answer's cities follow the order of appearance, which
        # only permutes the pairs; the count does not depend on the order to within a token, re-checked below).
        fixed = sum(_count(self.tokenizer, n) + 1 for n in needles) + _count(self.tokenizer, QUESTION)
        fixed += _count(self.tokenizer, " " + ";".join(f"{c}={n}" for c, n in zip(cities, numbers)) + "\n")
        if fixed > length:
            raise ValueError(f"a needle example needs at least {fixed} tokens (three needles, question and answer); "
                             f"length {length} is too short")
        chosen, budget = [], length - fixed
        while len(chosen) < len(self.units):
            unit = self.units[(start + len(chosen)) % len(self.units)]
            cost = self.unit_tokens[(start + len(chosen)) % len(self.units)]
            if cost > budget:  # the first tokens of the next unit fill what is left (the paper trims to L)
                head = self.tokenizer.decode(self.tokenizer(unit, add_special_tokens=False)["input_ids"][:budget - 1])
                chosen += [head.strip()] if budget > 1 and head.strip() else []
                break
            budget -= cost
            chosen.append(unit)
        while True:  # the estimate is close; drop filler from the end until the exact count fits
            example = self._assemble(chosen, needles, cities, numbers, depths, length)
            if example.tokens <= length or not chosen:
                break
            chosen = chosen[:-1]
        if example.tokens > length:
            raise ValueError(f"a needle example needs {example.tokens} tokens; length {length} is too short")
        return example

    def _assemble(self, units, needles, cities, numbers, depths, length) -> NeedleExample:
        offsets = [0]  # character offset of each unit boundary within the filler ("\n"-joined units)
        for unit in units:
            offsets.append(offsets[-1] + len(unit) + (1 if len(offsets) > 1 else 0))
        total = max(offsets[-1], 1)
        slots = [min(range(len(offsets)), key=lambda i: abs(offsets[i] - d * total)) for d in depths]
        order = sorted(range(len(needles)), key=lambda k: (slots[k], depths[k]))
        lines, realised, placed = [], [], 0
        for slot in range(len(units) + 1):
            for k in (k for k in order if slots[k] == slot):
                lines.append(needles[k])
                realised.append(offsets[slot] / total)
            if slot < len(units):
                lines.append(units[slot])
        prompt = "\n".join(lines) + QUESTION
        target = ";".join(f"{cities[k]}={numbers[k]}" for k in order)
        tokens = _count(self.tokenizer, prompt) + _count(self.tokenizer, f" {target}\n")
        return NeedleExample(prompt, target, tuple(cities[k] for k in order), tuple(numbers[k] for k in order),
                             tuple(realised), length, tokens)

    def examples(self, length: int, count: int, seed: int) -> list[NeedleExample]:
        return [self.example(length, seed, index) for index in range(count)]


def training_features(example: NeedleExample, tokenizer, length: int) -> dict:
    """input_ids = prompt + answer, padded with EOS to `length`; labels = the answer's ids, -100 elsewhere (the
    loss is on the answer tokens only). Returns lists; the dataset makes tensors."""
    prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
    answer = tokenizer(example.answer, add_special_tokens=False)["input_ids"]
    ids = prompt + answer
    if len(ids) > length:
        raise ValueError(f"needle example of {len(ids)} tokens does not fit in {length}")
    pad = length - len(ids)
    return {"input_ids": ids + [tokenizer.eos_token_id] * pad, "labels": [-100] * len(prompt) + answer + [-100] * pad}


def parse_answer(text: str) -> list[tuple[str, str]]:
    """The (city, number) pairs at the start of an answer's first line, as far as they go (module docstring)."""
    line, pairs, position = text.split("\n", 1)[0], [], 0
    while True:
        match = _PAIR.match(line, position)
        if match is None:
            return pairs
        pairs.append((match.group(1), match.group(2)))
        separator = _SEPARATOR.match(line, match.end())
        if separator is None:
            return pairs
        position = separator.end()


def needle_hits(answer: str, cities, numbers) -> list[bool]:
    """Whether `answer` finds each needle (city, number), in the needles' order; an answer without pairs, with more
    pairs than needles or with a city named twice finds none."""
    pairs = parse_answer(answer)
    if not pairs or len(pairs) > len(cities) or len({c for c, _ in pairs}) < len(pairs):
        return [False] * len(cities)
    given = dict(pairs)
    return [given.get(city) == number for city, number in zip(cities, numbers)]


def score_answer(answer: str, cities, numbers) -> float:
    """Fraction of the needles (city, number) found in `answer`, in any order (module docstring)."""
    return sum(needle_hits(answer, cities, numbers)) / len(cities)


def exact_match(answer: str, target: str) -> float:
    """1.0 when the answer's first line is the target string, white space normalised; else 0.0."""
    return float(" ".join(answer.split("\n", 1)[0].split()) == " ".join(target.split()))
