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

import numpy as np
import torch

from .corpus import _with_separators
from .shards import held_out


def _separated(text: str, builder: str) -> str:
    return _with_separators([text], builder)[0]


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
        for row in self.ds:
            text = row[self.column]
            if not text or held_out(text, self.data_seed, self.fraction):
                continue
            self._buffer += self.tokenizer(_separated(text, self.builder), add_special_tokens=False)["input_ids"]
            while len(self._buffer) >= self.block_size:
                block, self._buffer = self._buffer[: self.block_size], self._buffer[self.block_size:]
                yield {"input_ids": torch.tensor(block, dtype=torch.long)}

    def state_dict(self) -> dict:
        """Where the stream stands after the last block handed out (called by StatefulDataLoader)."""
        return {"source": self.ds.state_dict(), "buffer": list(self._buffer)}

    def load_state_dict(self, state: dict) -> None:
        self._resume = state


def validation_blocks(ds, tokenizer, recipe, builder: str) -> np.ndarray:
    """[n, block_size] token ids: the first `recipe.validation_blocks` blocks of the held-out documents."""
    buffer, blocks, size = [], [], recipe.block_size
    for row in ds:
        text = row[recipe.text_column]
        if not text or not held_out(text, recipe.data_seed, recipe.validation_fraction):
            continue
        buffer += tokenizer(_separated(text, builder), add_special_tokens=False)["input_ids"]
        while len(buffer) >= size and len(blocks) < recipe.validation_blocks:
            blocks.append(buffer[:size])
            buffer = buffer[size:]
        if len(blocks) == recipe.validation_blocks:
            break
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
