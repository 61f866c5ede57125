"""`angpt prepare`: tokenise a recipe's corpus once, in parallel, into the token shards training memory-maps
(shards.py; docs/training.md, section "Corpora larger than memory").

The corpus is cut into work units (row ranges of a local or downloaded corpus, the source's own file shards of a
streamed one); each of N worker processes tokenises whole units, writing a unit's train and validation tokens to
hidden temp files that are renamed into place, then a small record of the unit. An interrupted prepare therefore
resumes at the first unit without a record, and a finished one writes the manifest last. The output directory
must be empty, or hold an unfinished or finished prepare of exactly the same inputs: nothing else is ever
overwritten.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .shards import (FORMAT, FORMAT_VERSION, MANIFEST, TOKENIZER_DIR, PreparedDataError, held_out, read_manifest,
                     token_dtype, tokenizer_hash)
from .sources import DataSource, resolve_corpus, resolve_source, separator, source_fingerprint, with_separators

PROGRESS = ".prepare.json"   # an unfinished prepare: its inputs, so a resume can check they are the same
ROWS_PER_BATCH = 1000
DEFAULT_UNIT_MB = 256        # text per work unit (and so per shard) of a local corpus


@dataclass
class PrepareResult:
    directory: Path
    manifest: dict
    done_already: bool       # the directory already held this corpus, prepared: nothing was done
    units_written: int
    seconds: float


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def inputs_identity(recipe, source: DataSource) -> dict:
    """What the prepared tokens are a function of; a rerun with other inputs is refused, not mixed in."""
    identity = {"format_version": FORMAT_VERSION, "source": source_fingerprint(source, recipe),
                "tokenizer": {"name": recipe.tokenizer, "trained_vocab": None if recipe.tokenizer else
                              recipe.tokenizer_vocab_size, "split_digits": recipe.tokenizer_split_digits},
                "data_seed": recipe.data_seed, "validation_fraction": recipe.validation_fraction}
    return json.loads(json.dumps(identity))  # as it reads back from the manifest (tuples become lists)


def _differences(stored: dict, wanted: dict) -> str:
    changed = [key for key in wanted if stored.get(key) != wanted[key]]
    reasons = {"source": "the corpus changed since (files, sizes or times differ, or another dataset/column)",
               "tokenizer": "another tokenizer", "format_version": "another angpt format version",
               "data_seed": "another data_seed", "validation_fraction": "another validation_fraction"}
    return "; ".join(reasons.get(key, key) for key in changed)


def _check_output(output: Path, identity: dict) -> dict | None:
    """The finished manifest when `output` already holds these inputs prepared; None when work remains; an error
    when it holds anything else."""
    if (output / MANIFEST).is_file():
        manifest = read_manifest(output)
        diff = _differences(manifest.get("identity", {}), identity)
        if diff:
            raise PreparedDataError(f"--output {output} already holds a corpus prepared from other inputs ({diff}); "
                                    "choose a new --output directory")
        return manifest
    if (output / PROGRESS).is_file():
        diff = _differences(json.loads((output / PROGRESS).read_text()), identity)
        if diff:
            raise PreparedDataError(f"--output {output} holds an unfinished prepare of other inputs ({diff}); "
                                    "choose a new --output directory")
        return None
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise PreparedDataError(f"--output {output} already holds other files; angpt prepare writes only into an "
                                "empty or new directory (or resumes its own unfinished prepare there)")
    return None


def _load_corpus(recipe, source: DataSource):
    from .build import limit_chars, load_texts

    ds = load_texts(source, recipe, streaming=recipe.streaming)
    if not recipe.streaming:
        ds = limit_chars(ds, recipe.text_column, recipe.max_corpus_chars)
    return ds


def _units(recipe, ds, num_proc: int, unit_bytes: int) -> list[tuple[int, int, int]]:
    """(unit, start, stop): row ranges of an in-memory-mapped corpus, or the source's shards of a stream."""
    if recipe.streaming:
        return [(i, i, i + 1) for i in range(ds.n_shards)]
    rows = len(ds)
    if rows == 0:
        raise PreparedDataError(f"recipe key dataset={recipe.dataset!r}: the corpus is empty (no rows)")
    count = min(rows, max(num_proc, math.ceil(ds.data.nbytes / unit_bytes)))
    edges = np.linspace(0, rows, count + 1).astype(int)
    return [(i, int(edges[i]), int(edges[i + 1])) for i in range(count)]


def _unit_record(output: Path, unit: int) -> Path:
    return output / f".unit-{unit:05d}.json"


def _unit_done(output: Path, unit: int, dtype: np.dtype) -> bool:
    record = _unit_record(output, unit)
    if not record.is_file():
        return False
    entries = json.loads(record.read_text())["shards"]
    return all((output / e["file"]).is_file() and (output / e["file"]).stat().st_size == e["tokens"] * dtype.itemsize
               for e in entries)


def _rows(recipe, ds, start: int, stop: int):
    """Batches of texts of one unit."""
    if recipe.streaming:
        batch = []
        for row in ds.shard(num_shards=ds.n_shards, index=start):
            batch.append(row[recipe.text_column])
            if len(batch) == ROWS_PER_BATCH:
                yield batch
                batch = []
        if batch:
            yield batch
        return
    for begin in range(start, stop, ROWS_PER_BATCH):
        yield ds[begin: min(stop, begin + ROWS_PER_BATCH)][recipe.text_column]


class _ShardWriter:
    """Tokens appended to a hidden temp file, hashed as they go; `commit` renames it into place."""

    def __init__(self, output: Path, name: str, split: str):
        self.path, self.split = output / name, split
        self.tmp = output / f".{name}.tmp"
        self.file = open(self.tmp, "wb")
        self.sha, self.tokens, self.documents = hashlib.sha256(), 0, 0

    def add(self, ids: np.ndarray, documents: int) -> None:
        data = ids.tobytes()
        self.file.write(data)
        self.sha.update(data)
        self.tokens += len(ids)
        self.documents += documents

    def commit(self) -> dict:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return {"file": self.path.name, "split": self.split, "tokens": self.tokens, "documents": self.documents,
                "sha256": self.sha.hexdigest()}


def _encoder(path: Path):
    """(texts -> token ids, vocabulary size). The `tokenizers` object of a fast tokenizer directly: the same ids as
    transformers' tokenizer(texts, add_special_tokens=False), without importing transformers in every worker."""
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        return (lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)],
                backend.get_vocab_size(with_added_tokens=True))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"], len(tokenizer)


@functools.lru_cache(maxsize=1)
def _unit_context(recipe_json: str, output: str):
    """(recipe, source, corpus, encode, dtype) for the units of one prepare: loaded once per process, not per unit."""
    from ..training.recipe import recipe_from_dict

    recipe = recipe_from_dict(json.loads(recipe_json))
    source = resolve_source(recipe.dataset)
    encode, vocab_size = _encoder(Path(output) / TOKENIZER_DIR)
    return recipe, source, _load_corpus(recipe, source), encode, token_dtype(vocab_size)


def prepare_unit(recipe_values: dict, output: str, unit: tuple[int, int, int]) -> dict:
    """One work unit, in a worker process: its rows tokenised into train-/val-UNIT.bin and a record."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker: N workers use N cores
    recipe, source, ds, encode, dtype = _unit_context(json.dumps(recipe_values, sort_keys=True), output)
    output = Path(output)
    index, start, stop = unit
    writers = {split: _ShardWriter(output, f"{split}-{index:05d}.bin", split) for split in ("train", "val")}
    for texts in _rows(recipe, ds, start, stop):
        texts = [t for t in texts if t]
        sides = [held_out(t, recipe.data_seed, recipe.validation_fraction) for t in texts]
        encoded = encode(with_separators(texts, source.builder))
        for split, side in (("train", False), ("val", True)):
            chosen = [ids for ids, s in zip(encoded, sides) if s == side]
            if chosen:
                writers[split].add(np.fromiter((t for ids in chosen for t in ids), dtype=dtype), len(chosen))
    record = {"unit": index, "shards": [writers["train"].commit(), writers["val"].commit()]}
    _write_json(_unit_record(output, index), record)  # last: the unit counts as done only now
    return record


def _run_units(recipe, output: Path, pending: list, num_proc: int, progress) -> None:
    if num_proc <= 1 or len(pending) <= 1:
        for unit in pending:
            prepare_unit(recipe.to_dict(), str(output), unit)
            progress(1)
        _unit_context.cache_clear()  # this process keeps no corpus once the prepare is done
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from .. import DEFER_REGISTRATION

    # spawn: workers start clean (no forked torch or tokenizers thread pools); they need none of transformers'
    # Auto-class registration that importing the package does
    previous = os.environ.get(DEFER_REGISTRATION)
    os.environ[DEFER_REGISTRATION] = "1"
    try:
        with ProcessPoolExecutor(num_proc, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(prepare_unit, recipe.to_dict(), str(output), unit) for unit in pending]
            for future in as_completed(futures):
                future.result()
                progress(1)
    finally:
        if previous is None:
            del os.environ[DEFER_REGISTRATION]
        else:
            os.environ[DEFER_REGISTRATION] = previous


def _save_tokenizer(tokenizer, output: Path) -> None:
    tmp = output / f".{TOKENIZER_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, output / TOKENIZER_DIR)


def prepare_corpus(recipe, output, num_proc: int = 1, unit_mb: float = DEFAULT_UNIT_MB) -> PrepareResult:
    """Prepare `recipe`'s corpus into `output` (module docstring); returns at once if it is already there."""
    began = time.perf_counter()
    if num_proc < 1:
        raise PreparedDataError(f"--num-proc {num_proc}: expected at least 1 worker process")
    if recipe.dataset_kind != "blocks":
        raise PreparedDataError(f"recipe key dataset_kind={recipe.dataset_kind!r}: angpt prepare writes text corpora "
                                "(dataset_kind: blocks)")
    output = Path(output)
    corpus = resolve_corpus(recipe)
    source = corpus.source
    if source.kind == "prepared":
        raise PreparedDataError(f"recipe key dataset={recipe.dataset!r} is already a prepared directory")
    identity = inputs_identity(recipe, source)
    finished = _check_output(output, identity)
    if finished is not None:
        return PrepareResult(output, finished, True, 0, time.perf_counter() - began)
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    ds = _load_corpus(recipe, source)
    units = _units(recipe, ds, num_proc, int(unit_mb * 2 ** 20))
    output.mkdir(parents=True, exist_ok=True)
    _write_json(output / PROGRESS, identity)
    if (output / TOKENIZER_DIR).is_dir():    # resumed: the tokenizer the finished units were written with
        tokenizer = AutoTokenizer.from_pretrained(output / TOKENIZER_DIR)
    else:
        from .tokenizer import get_tokenizer

        tokenizer = get_tokenizer(recipe, corpus, ds)
        _save_tokenizer(tokenizer, output)
    dtype = token_dtype(len(tokenizer))
    pending = [unit for unit in units if not _unit_done(output, unit[0], dtype)]
    with tqdm(total=len(units), initial=len(units) - len(pending), desc="prepare", unit="unit") as bar:
        _run_units(recipe, output, pending, num_proc, bar.update)
    manifest = _write_manifest(recipe, output, source, identity, tokenizer, units, dtype)
    return PrepareResult(output, manifest, False, len(pending), time.perf_counter() - began)


def _write_manifest(recipe, output: Path, source: DataSource, identity: dict, tokenizer, units, dtype) -> dict:
    from .. import __version__

    shards = [entry for unit in units for entry in json.loads(_unit_record(output, unit[0]).read_text())["shards"]]
    totals = {split: {"tokens": sum(e["tokens"] for e in shards if e["split"] == split),
                      "documents": sum(e["documents"] for e in shards if e["split"] == split)}
              for split in ("train", "val")}
    if totals["train"]["documents"] + totals["val"]["documents"] == 0:
        raise PreparedDataError(f"recipe key dataset={recipe.dataset!r}: the corpus has no text in column "
                                f"{recipe.text_column!r}")
    if totals["val"]["documents"] == 0 or totals["train"]["documents"] == 0:
        raise PreparedDataError(f"recipe key validation_fraction={recipe.validation_fraction} held out "
                                f"{totals['val']['documents']} of {sum(t['documents'] for t in totals.values())} "
                                "documents: each split needs at least one; change validation_fraction or data_seed")
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "angpt_version": __version__,
                "identity": identity, "dataset": source.name,
                "tokenizer": {"name": recipe.tokenizer or f"byte-level BPE ({len(tokenizer)} tokens, trained on the "
                                                          "corpus)", "sha256": tokenizer_hash(tokenizer),
                              "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id},
                "dtype": dtype.name, "separator": separator(source.builder),
                "data_seed": recipe.data_seed, "validation_fraction": recipe.validation_fraction,
                "totals": totals, "shards": shards}
    _write_json(output / MANIFEST, manifest)
    for unit in units:
        _unit_record(output, unit[0]).unlink()
    (output / PROGRESS).unlink()
    return manifest
