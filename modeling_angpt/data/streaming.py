"""Streaming a corpus read once (`streaming: true`), without preparing it (docs/training.md, section "Corpora larger
than memory").

The stream is split into P parts, fixed at the run's first start (`stream_parts`; by default the number of processes
then), with `datasets.distributed.split_dataset_by_node`: whole source files per part when their number divides
evenly, else every P-th row. Process r of M (M divides P) reads parts r, r + M, r + 2M, … (`StreamParts`), a block
from each in turn, tokenising in DataLoader workers and packing the tokens into blocks. As P divides the global
batch of a step, every step takes the same number of blocks, G/P, from every part whatever M is: the data
position is global (each part's own place in the source), and a run resumed on another number of processes that
divides P trains on the blocks the first launch would have trained on next (in another order within the step).

The position in each part is state, not a count: torchdata's StatefulDataLoader asks `PackedStream.state_dict()`
for the source's position (datasets' IterableDataset state) and the tokens read but not yet packed, and a resumed
run restores exactly that, instead of reading again what was consumed. Validation is the first
`validation_blocks` blocks of the held-out documents (shards.held_out), read once.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from .shards import held_out



def _texts(ds, column: str, data_seed: int, fraction: float, validation: bool):
    """The non-empty documents of one side of the held-out split, in stream order."""
    for row in ds:
        text = row[column]
        if text and held_out(text, data_seed, fraction) == validation:
            yield text


def _pack(texts, tokenizer, separator: str, size: int, buffer: list[int]):
    """Blocks of `size` token ids from `texts`, each document followed by its separator. `buffer` holds the tokens
    read but not yet packed and is updated in place, before each block is handed out (PackedStream saves it)."""
    for text in texts:
        buffer += tokenizer(text + separator, add_special_tokens=False)["input_ids"]
        while len(buffer) >= size:
            block = buffer[:size]
            del buffer[:size]
            yield block


class PackedStream(torch.utils.data.IterableDataset):
    """Blocks of `block_size` tokens from the training documents (not held out) of a text stream."""

    def __init__(self, ds, tokenizer, column: str, separator: str, block_size: int, data_seed: int, fraction: float):
        self.ds, self.tokenizer, self.column, self.separator = ds, tokenizer, column, separator
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
        for block in _pack(texts, self.tokenizer, self.separator, self.block_size, self._buffer):
            yield {"input_ids": torch.tensor(block, dtype=torch.long)}

    def state_dict(self) -> dict:
        """Where the stream stands after the last block handed out (called by StatefulDataLoader)."""
        return {"source": self.ds.state_dict(), "buffer": list(self._buffer)}

    def load_state_dict(self, state: dict) -> None:
        self._resume = state


def validation_blocks(ds, tokenizer, recipe, separator: str) -> np.ndarray:
    """[n, block_size] token ids: the first `recipe.validation_blocks` blocks of the held-out documents."""
    size = recipe.block_size
    texts = _texts(ds, recipe.text_column, recipe.data_seed, recipe.validation_fraction, validation=True)
    blocks = list(itertools.islice(_pack(texts, tokenizer, separator, size, []), recipe.validation_blocks))
    if not blocks:
        raise ValueError(f"recipe key dataset={recipe.dataset!r}: the stream's held-out documents "
                         f"(validation_fraction={recipe.validation_fraction}) do not fill one block of "
                         f"{size} tokens")
    return np.asarray(blocks, dtype=np.int64)


def process_parts(rank: int, processes: int, parts: int) -> list[int]:
    """The parts of the stream process `rank` of `processes` reads."""
    return list(range(rank, parts, processes))


class StreamParts:
    """This process's training batches from its parts of the stream: `batch_size` blocks at a time, taken from the
    parts in turn (one StatefulDataLoader per part, so each part's position is saved on its own and a launch with
    another number of processes can take the part over). A part that ends starts over (another pass)."""

    def __init__(self, streams: dict[int, PackedStream], batch_size: int, workers: int):
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.streams, self.batch_size = streams, batch_size
        self.loaders = {part: StatefulDataLoader(stream, batch_size=None, num_workers=workers)
                        for part, stream in streams.items()}

    def _blocks(self, part: int):
        while True:
            produced = False
            for item in self.loaders[part]:
                produced = True
                yield item["input_ids"]
            if not produced:
                raise ValueError(f"part {part} of the stream yields no training block: lower block_size, or "
                                 "stream_parts so that each part holds more documents")

    def batches(self):
        turns = itertools.cycle([self._blocks(part) for part in sorted(self.loaders)])
        while True:
            yield {"input_ids": torch.stack([next(next(turns)) for _ in range(self.batch_size)])}

    def state_dict(self) -> dict:
        """Each part's position after the last block handed out; at a step boundary every part has handed out
        the same number (the process starts its next step at its first part)."""
        return {"parts": {part: loader.state_dict() for part, loader in self.loaders.items()}}

    def load_state_dict(self, parts: dict) -> None:
        """`parts`: {part: state} of every part, from every process's saved state (`saved_stream_state`)."""
        for part, loader in self.loaders.items():
            loader.load_state_dict(parts[part])


def saved_stream_state(files: list) -> dict:
    """{part: state} of every part from the data_state_<rank>.pt files of a checkpoint. A checkpoint of an earlier
    version holds one loader's state per process, whose part was its rank."""
    parts = {}
    for file in files:
        state = torch.load(file, weights_only=False)
        rank = int(file.stem.rsplit("_", 1)[1])
        parts.update(state["parts"] if "parts" in state else {rank: state})
    return parts


def stream_datasets(ds, tokenizer, recipe, separator: str, rank: int, processes: int, parts: int):
    """(StreamParts of this process's parts of the stream's `parts`, validation blocks)."""
    from datasets.distributed import split_dataset_by_node

    streams = {part: PackedStream(split_dataset_by_node(ds, rank=part, world_size=parts) if parts > 1 else ds,
                                  tokenizer, recipe.text_column, separator, recipe.block_size, recipe.data_seed,
                                  recipe.validation_fraction)
               for part in process_parts(rank, processes, parts)}
    train = StreamParts(streams, recipe.per_device_train_batch_size, recipe.dataloader_num_workers)
    return train, validation_blocks(ds, tokenizer, recipe, separator)
