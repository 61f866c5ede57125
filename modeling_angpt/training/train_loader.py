"""The training batches of each process, for the three kinds of data (docs/training.md, section "Corpora larger
than memory"):

- blocks in memory (a corpus tokenised at start): a shuffled DataLoader prepared by accelerate, which gives each
  process its slice of every global batch; resume skips the consumed batches' indices (not their data).
- prepared shards (shards.py): each process computes its own block indices from (seed, batch, rank)
  (batch_order.py), reads them from the memory maps, and puts them on its device; resume starts the function at
  the batch reached, in constant time.
- a stream (streaming.py): each process reads its own part through a StatefulDataLoader, whose state is saved with
  every checkpoint and restored on resume.
"""
from __future__ import annotations

import torch

from .batch_order import BlockOrder, StepSampler
from .shards import ShardedBlocks
from .streaming import PackedStream, stream_loader


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
