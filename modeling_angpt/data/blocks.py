"""The data path's blocks stage, for a corpus tokenised at start: every document tokenised, followed by its
separator, concatenated and cut into fixed-length blocks (cached where sources.resolve_corpus says), a deterministic
validation split of them, and the datasets training reads (blocks, or needle examples built over them). What is
written by hand here is the packing and the split; `datasets` and `tokenizers` do the rest."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from .sources import Corpus


def packed_blocks(recipe, corpus: Corpus, ds, tokenizer) -> np.ndarray:
    """[n_blocks, block_size] token ids of the corpus, from the cache or packed and cached now."""
    path = corpus.blocks_file
    if path.is_file():
        return np.load(path)
    blocks = tokenize_and_pack(ds, tokenizer, recipe.text_column, corpus.separator, recipe.block_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp, blocks)
    os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    return blocks


def tokenize_and_pack(ds, tokenizer, column: str, separator: str, block_size: int) -> np.ndarray:
    """All rows tokenised (datasets.map, batched) and concatenated, cut into [n_blocks, block_size]."""
    def encode(batch):
        texts = [text + separator for text in batch[column] if text]
        return {"ids": tokenizer(texts, add_special_tokens=False)["input_ids"]}

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
