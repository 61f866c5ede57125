"""Streaming a corpus read once (`streaming: true`), without preparing it (docs/training.md, section "Corpora larger
than memory").

Each process reads its own part of the stream (`datasets.distributed.split_dataset_by_node`: whole source files
per process when their number divides evenly, else every N-th row), tokenises it in its DataLoader workers, and
packs the tokens into blocks. The position in the stream is state, not a count: torchdata's StatefulDataLoader
asks `PackedStream.state_dict()` for the source's position (datasets' IterableDataset state) and the tokens read
but not yet packed, and a resumed run restores exactly that, instead of reading again what was consumed.
Validation is the first `validation_blocks` blocks of the held-out documents (shards.held_out), read once.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from .corpus import separator
from .shards import held_out


def _texts(ds, column: str, data_seed: int, fraction: float, validation: bool):
    """The non-empty documents of one side of the held-out split, in stream order."""
    for row in ds:
        text = row[column]
        if text and held_out(text, data_seed, fraction) == validation:
            yield text


def _pack(texts, tokenizer, builder: str, size: int, buffer: list[int]):
    """Blocks of `size` token ids from `texts`, each document followed by its separator. `buffer` holds the tokens
    read but not yet packed and is updated in place, before each block is handed out (PackedStream saves it)."""
    for text in texts:
        buffer += tokenizer(text + separator(builder), add_special_tokens=False)["input_ids"]
        while len(buffer) >= size:
            block = buffer[:size]
            del buffer[:size]
            yield block


class PackedStream(torch.utils.data.IterableDataset):
    """Blocks of `block_size` tokens from the training documents (not held out) of a text stream."""

    def __init__(self, ds, tokenizer, column: str, builder: str, block_size: int, data_seed: int, fraction: float):
        self.ds, self.tokenizer, self.column, self.builder = ds, tokenizer, column, builder
        self.block_size, self.data_seed, self.fraction = block_size, data_seed, fraction
        self._buffer: list[int] = []
        self._resume: dict | None = None

    def __iter__(self):
        if self._resume is not None:
            self.ds.load_state_dict(self._resume["source"])
            self._buffer, self._resume = list(self._resume["buffer"]), None
        else:
            self._buffer = []
        texts = _texts(self.ds, self.column, self.data_seed, self.fraction, validation=False)
        for block in _pack(texts, self.tokenizer, self.builder, self.block_size, self._buffer):
            yield {"input_ids": torch.tensor(block, dtype=torch.long)}

    def state_dict(self) -> dict:
        """Where the stream stands after the last block handed out (called by StatefulDataLoader)."""
        return {"source": self.ds.state_dict(), "buffer": list(self._buffer)}

    def load_state_dict(self, state: dict) -> None:
        self._resume = state


def validation_blocks(ds, tokenizer, recipe, builder: str) -> np.ndarray:
    """[n, block_size] token ids: the first `recipe.validation_blocks` blocks of the held-out documents."""
    size = recipe.block_size
    texts = _texts(ds, recipe.text_column, recipe.data_seed, recipe.validation_fraction, validation=True)
    blocks = list(itertools.islice(_pack(texts, tokenizer, builder, size, []), recipe.validation_blocks))
    if not blocks:
        raise ValueError(f"recipe key dataset={recipe.dataset!r}: the stream's held-out documents "
                         f"(validation_fraction={recipe.validation_fraction}) do not fill one block of "
                         f"{size} tokens")
    return np.asarray(blocks, dtype=np.int64)


def stream_datasets(ds, tokenizer, recipe, builder: str, rank: int, processes: int):
    """(train PackedStream of this process's part, validation blocks)."""
    from datasets.distributed import split_dataset_by_node

    val = validation_blocks(ds, tokenizer, recipe, builder)
    part = split_dataset_by_node(ds, rank=rank, world_size=processes) if processes > 1 else ds
    train = PackedStream(part, tokenizer, recipe.text_column, builder, recipe.block_size, recipe.data_seed,
                         recipe.validation_fraction)
    return train, val


def stream_loader(train: PackedStream, recipe):
    """A resumable loader over the stream; its workers tokenise."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(train, batch_size=recipe.per_device_train_batch_size, drop_last=True,
                              num_workers=recipe.dataloader_num_workers)
