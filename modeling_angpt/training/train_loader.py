"""The training batches of each process, for the three kinds of data (docs/training.md, section "Corpora larger
than memory"):

- blocks in memory (a corpus tokenised at start): a shuffled DataLoader prepared by accelerate, which gives each
  process its slice of every global batch; resume skips the consumed batches' indices (not their data).
- prepared shards (shards.py): each process computes its own block indices from (seed, batch, rank)
  (`BlockOrder`, below), reads them from the memory maps, and puts them on its device; resume starts the function at
  the batch reached, in constant time.
- a stream (streaming.py): each process reads its own part through a StatefulDataLoader, whose state is saved with
  every checkpoint and restored on resume.

The batch order of prepared data (`BlockOrder`) is a pure function of (seed, batch index, rank). Every process
computes its own block indices, so no process reads data for another and nothing is sent between them; resuming at
batch k starts the function at k, which costs the same at step 10 as at step 10,000.

The shuffle is a keyed pseudo-random permutation of the block indices of each epoch, evaluated index by index: a
4-round Feistel network on the smallest power-of-four domain holding the blocks, with cycle-walking to stay inside
[0, n). torch's RandomSampler (and accelerate's seedable sampler) materialise `randperm(n)`: 8 bytes per block per
process, 4.8 GB at 600 M blocks (the papers' corpora at 1,024 tokens per block); this keeps memory constant.
"""
from __future__ import annotations

import numpy as np
import torch

from .shards import ShardedBlocks
from .streaming import PackedStream, stream_loader


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective 64-bit hash (overflowing uint64 arithmetic is the point)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def epoch_key(seed: int, epoch: int) -> np.uint64:
    return _mix(np.array([(seed & 0xFFFFFFFF) << 32 | (epoch & 0xFFFFFFFF)], dtype=np.uint64))[0]


def permute(indices: np.ndarray, n: int, key: np.uint64) -> np.ndarray:
    """The keyed permutation of [0, n) applied to `indices` (each in [0, n))."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    low_mask = np.uint64((1 << half) - 1)
    rounds = [_mix(np.array([key ^ np.uint64(r + 1)], dtype=np.uint64))[0] for r in range(4)]

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(half), x & low_mask
        for round_key in rounds:
            left, right = right, left ^ (_mix(right ^ round_key) & low_mask)
        return (left << np.uint64(half)) | right

    out = np.asarray(indices, dtype=np.uint64)
    outside = np.ones(out.shape, dtype=bool)
    while outside.any():  # cycle-walking: a bijection on [0, 4^half) restricted to [0, n) stays one
        out[outside] = feistel(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


class BlockOrder:
    """Global batch b of the run holds epoch positions [j·G, (j+1)·G) of epoch b // per_epoch, with G = batch size
    × processes and j = b % per_epoch; process r takes the r-th slice of B. The last partial global batch of an
    epoch is dropped, as DataLoader's drop_last does."""

    def __init__(self, n_blocks: int, batch_size: int, processes: int, rank: int, seed: int):
        self.n, self.batch_size, self.processes, self.rank, self.seed = n_blocks, batch_size, processes, rank, seed
        self.per_epoch = n_blocks // (batch_size * processes)
        if self.per_epoch == 0:
            raise ValueError(f"the training set has {n_blocks} blocks, fewer than one global batch "
                             f"({batch_size} per process × {processes} processes): lower per_device_train_batch_size "
                             "or block_size")

    def batch(self, index: int) -> np.ndarray:
        epoch, j = divmod(index, self.per_epoch)
        start = (j * self.processes + self.rank) * self.batch_size
        return permute(np.arange(start, start + self.batch_size), self.n, epoch_key(self.seed, epoch))


class StepSampler(torch.utils.data.Sampler):
    """This process's block indices from batch `start` on, without end (the loop stops at max_steps)."""

    def __init__(self, order: BlockOrder, start: int = 0):
        self.order, self.start = order, start

    def __iter__(self):
        index = self.start
        while True:
            yield from self.order.batch(index).tolist()
            index += 1


def make_train_loader(recipe, accelerator, train_ds):
    """(loader, whether accelerate must prepare it)."""
    batch_size, workers = recipe.per_device_train_batch_size, recipe.dataloader_num_workers
    if isinstance(train_ds, ShardedBlocks):
        order = BlockOrder(len(train_ds), batch_size, accelerator.num_processes, accelerator.process_index,
                           recipe.seed)
        return torch.utils.data.DataLoader(train_ds, batch_size=batch_size, sampler=StepSampler(order),
                                           num_workers=workers), False
    if isinstance(train_ds, PackedStream):
        return stream_loader(train_ds, recipe), False
    return torch.utils.data.DataLoader(train_ds, batch_size=batch_size, shuffle=True, drop_last=True,
                                       num_workers=workers), True


def _on_device(accelerator, loader):
    for batch in loader:
        yield {key: value.to(accelerator.device, non_blocking=True) for key, value in batch.items()}


def batch_stream(accelerator, dataloader, batches_done: int):
    """Batches forever, epoch after epoch, starting after `batches_done` (for resume)."""
    dataset = dataloader.dataset
    if isinstance(dataset, ShardedBlocks):
        dataloader.sampler.start = batches_done   # the sampler never ends: the loop stops at max_steps
        yield from _on_device(accelerator, dataloader)
        return
    if isinstance(dataset, PackedStream):
        # A restored StatefulDataLoader continues where its checkpoint stood; at the stream's end it starts over.
        while True:
            produced = False
            for batch in _on_device(accelerator, dataloader):
                produced = True
                yield batch
            if not produced:
                raise ValueError("the stream yields no training batch: lower per_device_train_batch_size or "
                                 "block_size")
    epoch, skip = divmod(batches_done, len(dataloader))
    while True:
        dataloader.set_epoch(epoch)
        loader = accelerator.skip_first_batches(dataloader, skip) if skip else dataloader
        if skip:
            loader.set_epoch(epoch)
        produced = False
        for batch in loader:
            produced = True
            yield batch
        if not produced and not skip:
            raise ValueError("the training set yields no batch: lower per_device_train_batch_size or block_size")
        epoch, skip = epoch + 1, 0


def data_epoch(dataloader, batches_done: int) -> int:
    """Which pass over the training data `batches_done` batches reached (recorded in checkpoints)."""
    if isinstance(dataloader.dataset, ShardedBlocks):
        return batches_done // dataloader.sampler.order.per_epoch
    if isinstance(dataloader.dataset, PackedStream):
        return 0
    return batches_done // len(dataloader)


def loader_state(dataloader) -> dict | None:
    """What a checkpoint must hold to resume this process's data exactly, beyond the batch count."""
    return dataloader.state_dict() if isinstance(dataloader.dataset, PackedStream) else None
