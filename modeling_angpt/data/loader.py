"""The training batches of each process, for the three kinds of data (docs/training.md, sections "Corpora larger
than memory" and "Checkpoints and resuming"):

- blocks in memory (a corpus tokenised at start), needle examples and prepared shards (shards.py): each process
  computes its own block indices from (seed, global micro-batch, rank) (`BlockOrder`, below), reads them (from memory
  or the memory maps), and puts them on its device; resume starts the function at the batch reached, in constant
  time.
- a stream (streaming.py): each process reads its parts of the stream, each through a StatefulDataLoader, whose
  state is saved with every checkpoint and restored on resume, by whichever process reads that part then.

The batch order (`BlockOrder`) is a pure function of (seed, global micro-batch index, rank), and the data position
a run records is global: a micro-batch index of the whole run, whose blocks are the same whatever number of
processes reads them. Every process computes its own block indices, so no process reads data for another and
nothing is sent between them; resuming at batch k starts the function at k, which costs the same at step 10 as at
step 10,000, and a run resumed on another number of processes with the same global batch reads, step by step, the
blocks the first launch would have read.

The shuffle is a keyed pseudo-random permutation of the block indices of each epoch, evaluated index by index: a
4-round Feistel network on the smallest power-of-four domain holding the blocks, with cycle-walking to stay inside
[0, n). torch's RandomSampler (and accelerate's seedable sampler) materialise `randperm(n)`: 8 bytes per block per
process, 4.8 GB at 600 M blocks (the papers' corpora at 1,024 tokens per block); this keeps memory constant.
"""
from __future__ import annotations

import numpy as np
import torch

from .streaming import StreamParts


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
    """Global micro-batch b of the run holds positions [j·G, (j+1)·G) of epoch e's permutation, with G = batch size
    × processes (the blocks every process reads for one micro-batch) and (e, j) = divmod(b, per_epoch); process r
    takes the r-th slice. An epoch ends after the last whole optimiser step it holds (`accumulation` micro-batches
    each, as DataLoader's drop_last drops a partial batch), so its length is a function of the global batch of a
    step only: a run resumed with another split of that batch into processes, per-device batch and accumulation
    reads the same blocks at the same step (docs/training.md, "Checkpoints and resuming")."""

    def __init__(self, n_blocks: int, batch_size: int, processes: int, rank: int, seed: int, accumulation: int = 1):
        self.n, self.batch_size, self.processes, self.rank, self.seed = n_blocks, batch_size, processes, rank, seed
        steps_per_epoch = n_blocks // (batch_size * processes * accumulation)
        self.per_epoch = steps_per_epoch * accumulation
        if self.per_epoch == 0:
            raise ValueError(f"the training set has {n_blocks} blocks, fewer than one global batch "
                             f"({batch_size} per process × {processes} processes × {accumulation} accumulation "
                             "steps): lower per_device_train_batch_size or block_size")

    def positions(self, index: int) -> tuple[int, int]:
        """(epoch, first epoch position) of this process's slice of global micro-batch `index`."""
        epoch, j = divmod(index, self.per_epoch)
        return epoch, (j * self.processes + self.rank) * self.batch_size

    def batch(self, index: int) -> np.ndarray:
        epoch, start = self.positions(index)
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
    """This process's training loader. Blocks in memory, prepared shards and needle examples are read in the
    `BlockOrder` of (seed, global micro-batch): each process computes its own slice, nothing is sent between them."""
    batch_size, workers = recipe.per_device_train_batch_size, recipe.dataloader_num_workers
    if isinstance(train_ds, StreamParts):  # already this process's loaders (streaming.py)
        return train_ds
    order = BlockOrder(len(train_ds), batch_size, accelerator.num_processes, accelerator.process_index,
                       recipe.seed, recipe.gradient_accumulation_steps)
    return torch.utils.data.DataLoader(train_ds, batch_size=batch_size, sampler=StepSampler(order),
                                       num_workers=workers)


def _on_device(accelerator, loader):
    for batch in loader:
        yield {key: value.to(accelerator.device, non_blocking=True) for key, value in batch.items()}


def batch_stream(accelerator, dataloader, batches_done: int):
    """Batches forever, starting after `batches_done` micro-batches of this process (for resume)."""
    if isinstance(dataloader, StreamParts):  # restored, each part continues where its checkpoint stood
        yield from _on_device(accelerator, dataloader.batches())
        return
    dataloader.sampler.start = batches_done   # the sampler never ends: the loop stops at max_steps
    yield from _on_device(accelerator, dataloader)


def data_epoch(dataloader, batches_done: int) -> int:
    """Which pass over the training data `batches_done` batches reached (recorded in checkpoints)."""
    if isinstance(dataloader, StreamParts):
        return 0
    return batches_done // dataloader.sampler.order.per_epoch


def loader_state(dataloader) -> dict | None:
    """What a checkpoint must hold to resume this process's data exactly, beyond the batch count."""
    return dataloader.state_dict() if isinstance(dataloader, StreamParts) else None


def scored_validation_blocks(recipe, available: int, processes: int = 1) -> int:
    """How many validation blocks training's validation loss averages: the first
    eval_max_batches × per_device_eval_batch_size × processes of the split (its order is fixed by data_seed), or
    all of them. Recorded as `val_sequences` in training_metadata.json, so an evaluation of the checkpoint can
    score the same subset (docs/evaluation.md)."""
    if recipe.eval_max_batches is None:
        return available
    return min(available, recipe.eval_max_batches * recipe.per_device_eval_batch_size * processes)
