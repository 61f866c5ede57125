"""Asynchronous checkpoints: training goes on while the model and optimiser state is written
(docs/training.md, "Asynchronous checkpoints").

torch.distributed.checkpoint (DCP) does the work: `get_state_dict` takes the model and optimiser state under
parameter names that do not depend on the wrapper (plain, DDP, FSDP2), a `DefaultStager` copies it to CPU memory
before `start` returns (the training step that follows may change every tensor), and `async_save` writes that copy
in a background thread; `dcp.load` + `set_state_dict` read it back on any number of processes (DCP reshards). What
is written here by hand is only what DCP leaves to its caller: at most one save in flight, ranks that agree on when
a save has finished (so the caller's commit, which may itself be collective, runs at the same step on every rank),
the commit called from the main thread, and one clear line for a failed save or a directory that is not a
checkpoint.

Two gloo groups of its own, made by every rank when the checkpointer is made: the writer thread's collectives
(DCP's plan exchange, the gather of write results, the final broadcast) run on one, so they never interleave with
the main thread's collectives on the training group (a known source of hangs and wrong results); the main thread's
"is every rank's write done?" vote runs on the other, and only while a save is in flight.

A rank's save future completes only after rank 0 has gathered every rank's write results and written the
checkpoint's `.metadata`, then broadcast the outcome (DCP's `_DistWrapper.all_reduce`), so a finished future on any
rank means every rank's files are written (tests/parallel/test_async_checkpoint_two_processes.py checks it by
reading the whole checkpoint on rank 0 from inside the commit).
"""
from __future__ import annotations

import os
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

try:  # torch.distributed.checkpoint's reusable stager: torch 2.9 and later (the torch floor is 2.8: docs/usage.md)
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
except ImportError:
    DefaultStager = StagingOptions = None

METADATA = ".metadata"  # DCP writes it last, on rank 0, once every rank's data is written


class AsyncCheckpointError(RuntimeError):
    """A save that failed on some rank, or a directory that holds no complete checkpoint."""


def check_supported() -> None:
    """One line when this torch lacks what an asynchronous checkpoint needs."""
    if DefaultStager is None:
        raise ValueError(f"recipe key async_checkpoint: true needs torch.distributed.checkpoint's DefaultStager, which "
                         f"torch {torch.__version__} lacks: install torch 2.9 or newer, or set async_checkpoint: false")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _staging_options() -> StagingOptions:
    # Staging is synchronous (the copy is made before start() returns, so the next optimiser step cannot reach the
    # saved state); pinned memory only where there is a GPU to copy from; no shared memory: the writer is a thread.
    # DCP's asynchronous staging needs non-blocking device copies (CUDA) and a wait before the next optimiser step.
    return StagingOptions(use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False,
                          use_async_staging=False, use_non_blocking_copy=False)


class AsyncCheckpointer:
    """At most one asynchronous save in flight. Every rank calls `start`, `poll`, `wait` and `close` at the same
    points of training (step boundaries), as it would call a collective."""

    def __init__(self) -> None:
        check_supported()
        distributed = _distributed()
        self._write_group = dist.new_group(backend="gloo") if distributed else None
        self._vote_group = dist.new_group(backend="gloo") if distributed else None
        # one stager for the whole run: it keeps its CPU buffers and refills them at every save (no re-allocation)
        self._stager = DefaultStager(_staging_options())
        self._future: Future | None = None
        self._directory: Path | None = None
        self._on_done: Callable[[], None] | None = None

    @property
    def in_flight(self) -> bool:
        return self._future is not None

    def start(self, model, optimizer, directory: str | os.PathLike, on_done: Callable[[], None]) -> None:
        """Wait for (and commit) the save in flight, if any; copy the state to CPU memory; write it into `directory`
        in the background. `on_done` runs in this thread, from `poll` or `wait`, once every rank's write is done."""
        self.wait()
        directory = Path(directory)
        if (directory / METADATA).exists():
            raise AsyncCheckpointError(f"checkpoint directory {directory} already holds a checkpoint ({METADATA}); "
                                       "expected a new or empty directory (a save never overwrites one)")
        model_state, optimizer_state = get_state_dict(model, optimizer)
        if self._write_group is None:  # DCP warns, from its writer thread, that one process saves alone: as asked
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        self._future = dcp.async_save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory,
                                      process_group=self._write_group, async_stager=self._stager,
                                      no_dist=self._write_group is None)
        self._directory, self._on_done = directory, on_done

    def poll(self) -> bool:
        """At a step boundary: True when the save in flight has just finished on every rank and been committed."""
        if self._future is None:
            return False
        done = self._future.done()
        if self._vote_group is not None:
            # every rank must commit at the same step: a rank whose thread finished a moment earlier waits for the vote
            votes = torch.tensor([int(done)])
            dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=self._vote_group)
            done = bool(votes.item())
        if done:
            self._commit()
        return done

    def wait(self) -> None:
        """Block until the save in flight is written and committed (the final or a preemption save, the run's end)."""
        if self._future is not None:
            self._commit()

    def close(self) -> None:
        """Wait for the save in flight, then release the stager's buffers and the two groups."""
        try:
            self.wait()
        finally:
            self._stager.close()
            for group in (self._write_group, self._vote_group):
                if group is not None:
                    dist.destroy_process_group(group)
            self._write_group = self._vote_group = None

    def _commit(self) -> None:
        future, directory, on_done = self._future, self._directory, self._on_done
        self._future = self._directory = self._on_done = None
        try:
            future.result()
        except (Exception, CheckpointException) as error:  # DCP's CheckpointException is a BaseException
            raise AsyncCheckpointError(f"asynchronous checkpoint into {directory} failed: {_causes(error)}") from error
        on_done()


def _causes(error: BaseException) -> str:
    """One line: each failing rank and its error (DCP's own message spans every rank's traceback)."""
    if isinstance(error, CheckpointException):
        return "; ".join(f"rank {rank}: {type(exc).__name__}: {exc}" for rank, (exc, _) in error.failures.items())
    return f"{type(error).__name__}: {error}"


def load_model_and_optimizer(model, optimizer, directory: str | os.PathLike) -> None:
    """Restore what `AsyncCheckpointer.start` saved into `model` and `optimizer` (plain, DDP or FSDP2), on any number
    of processes: DCP reads each rank's part of every tensor whatever the number of processes that wrote it."""
    directory = Path(directory)
    if not (directory / METADATA).is_file():
        raise AsyncCheckpointError(f"checkpoint directory {directory} has no {METADATA}: expected a complete "
                                   "checkpoint written by AsyncCheckpointer (an interrupted save has none)")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    alone = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():  # DCP warns that one process loads alone: here that is what was asked
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        try:
            dcp.load(state, checkpoint_id=directory, no_dist=alone)
        except (Exception, CheckpointException) as error:  # another model's checkpoint: names and shapes differ
            raise AsyncCheckpointError(f"checkpoint {directory} does not load into this model and optimiser: "
                                       f"{_causes(error)}") from error
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
