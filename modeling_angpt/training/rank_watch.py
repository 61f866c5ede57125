"""A lost rank stops the run in one line (docs/training.md, "A lost rank").

When one process or machine of a run dies, the others must not wait forever in their next collective, nor end in a
backend's traceback (gloo's "Connection reset by peer") that names neither the lost rank nor how to go on. Each
process runs a `RankWatch`: a daemon thread that bumps its own counter in the run's rendezvous store (the TCPStore
torchrun hosts at MASTER_ADDR:MASTER_PORT) every `INTERVAL_S` and reads one other rank's, its successor's in a
ring (rank r watches r + 1, the last rank watches rank 0). A rank whose counter has not moved for `STALE_AFTER_S` (by
the watcher's own clock: machines' clocks may differ) is lost: its watcher writes one line naming it into the store,
where every rank reads it at its next beat, and each prints it with the `--resume` command and ends its process,
whatever its main thread is blocked in (an NCCL collective waits for its time-out). A store that no longer answers
(it lives in machine 0's launcher, which stops with its processes) means machine 0 is lost. Written by hand: neither
torch nor Accelerate reports which peer of a group is gone (torch's elastic agent names only the failed processes of
its own machine).

The store also serves torchrun's rendezvous, so the watch's load on it must not grow with the square of the ranks:
every rank makes three requests per beat (its own counter, its successor's, the loss line's counter), 3·W per
interval for W ranks (bench/rank_watch_store_load.py measures it; docs/training.md, "A lost rank"). Reading every
peer's counter instead took W·(3W−2), about 390,000 requests a second at 512 ranks. A whole machine lost is found
by the last rank of the machine before it.

A rank that finishes normally says so first (`stop`), so the ranks still saving the final model do not count it as
lost; its watcher then watches the next rank of the ring.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
import threading
import time
import warnings
from datetime import timedelta

INTERVAL_S = 2.0
STALE_AFTER_S = 20.0  # ten missed beats: a busy process still beats (the thread needs the GIL for microseconds)
LOST_RANK_EXIT_CODE = 3
# Added to a rank's beat counter when it ends normally: one request (an `add` of 0, which also reads a counter not
# yet created, as 0, without waiting for it) tells a beat from an end.
FINISHED = 1 << 40
LOSS_COUNT, LOSS_LINE, LOSS_READERS = "loss/count", "loss/line", "loss/readers"


def resume_command(argv: list[str] | None = None) -> str:
    """The command that continues this run: the `angpt train` command line it was started with, `--overwrite`
    dropped and `--resume` added; for a run started from Python, the call that does the same."""
    argv = list(sys.argv if argv is None else argv)
    if "train" not in argv:
        return "train(recipe, resume=True) in the same launch"
    args, resume = argv[argv.index("train") + 1:], "--resume"
    for i, arg in enumerate(args):  # `--resume auto` (the one command line of every start) stays as it was
        if arg in ("--resume=auto", "--resume") and (arg.endswith("auto") or args[i + 1:i + 2] == ["auto"]):
            resume = "--resume auto"
            args = args[:i] + args[i + (1 if arg.endswith("auto") else 2):]
            break
    args = [arg for arg in args if arg not in ("--overwrite", "--resume")]
    return "angpt train " + " ".join(shlex.quote(arg) for arg in args) + " " + resume


class RankWatch:
    """The heartbeat of every rank of a run in its rendezvous store, each rank watching its successor in a ring
    (see the module docstring)."""

    def __init__(self, rank: int, world: int, output_dir: str, store=None, stale_after: float = STALE_AFTER_S,
                 interval: float = INTERVAL_S, exit=os._exit) -> None:
        self.rank, self.world, self.output_dir = rank, world, output_dir
        self.stale_after, self.interval, self._exit = stale_after, interval, exit
        self.local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        # the store's host, checked for life before each use of the store (none for a store handed in)
        self.address = None if store is not None else (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        self.store = store if store is not None else _rendezvous_store()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="angpt-rank-watch", daemon=True)

    @classmethod
    def start_for(cls, accelerator, output_dir: str) -> "RankWatch | None":
        """A running watch for a run of several processes (None for one process)."""
        if accelerator.num_processes < 2:
            return None
        try:
            watch = cls(accelerator.process_index, accelerator.num_processes, str(output_dir))
        except (KeyError, ValueError, RuntimeError, OSError) as error:  # a launch without a reachable store
            warnings.warn(f"no watch for lost ranks in this run (the rendezvous store at MASTER_ADDR:MASTER_PORT "
                          f"cannot be reached: {error}); a lost rank stops it through the collectives' time-out",
                          stacklevel=2)
            return None
        watch._thread.start()
        return watch

    def stop(self) -> None:
        """This rank ends normally: its watcher moves on to the next rank."""
        self._stopped.set()
        try:
            self.store.add(f"beat/{self.rank}", FINISHED)
        except Exception:  # noqa: BLE001 - the store's host may already have ended with its own finished run
            pass

    def wait_for_loss(self) -> None:
        """After a collective failed: give the watch the time to learn which rank is lost (it then ends the
        process): the watcher's `stale_after` and two beats, one beat for the others to read its line, and the
        wait in `_let_the_others_read`."""
        self._thread.join(timeout=self.stale_after + 6 * self.interval)

    def _machine(self, rank: int) -> int:
        return rank // self.local

    def _next_rank(self, rank: int) -> int:
        return (rank + 1) % self.world

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # noqa: BLE001 - any store failure means its host is gone
            if self._stopped.is_set():
                return
            ranks = "rank 0" if self.local == 1 else f"ranks 0 to {self.local - 1}"
            host = "" if self.address is None else f" at {self.address[0]}:{self.address[1]}"
            self._lost(f"lost {ranks} of {self.world} (machine 0, whose launcher hosts the run's rendezvous{host}): "
                       f"it stopped", store_alive=False)

    def _watch(self) -> None:
        """Beat, read the loss line's counter, read the watched rank's counter: three requests per interval."""
        watched, last, since = self._next_rank(self.rank), 0, time.monotonic()
        while not self._stopped.is_set():
            if self.address is not None:  # before the store's client, which logs a C++ trace on a dead host
                _check_reachable(self.address)
            self.store.add(f"beat/{self.rank}", 1)
            if self.store.add(LOSS_COUNT, 0):  # another rank's watcher found a lost rank
                return self._lost(self.store.get(LOSS_LINE).decode())
            if watched != self.rank:  # (every other rank finished: nothing left to watch)
                beats, now = self.store.add(f"beat/{watched}", 0), time.monotonic()
                if beats >= FINISHED:  # it ended normally: watch the one it watched
                    watched, last, since = self._next_rank(watched), 0, now
                elif beats != last:
                    last, since = beats, now
                elif beats and now - since > self.stale_after:  # (a rank that never beat is torchrun's business)
                    what = (f"lost rank {watched} of {self.world} (machine {self._machine(watched)}): no heartbeat "
                            f"for {self.stale_after:g} s, its process or machine stopped")
                    self.store.set(LOSS_LINE, what)
                    self.store.add(LOSS_COUNT, 1)
                    return self._lost(what)
            self._stopped.wait(self.interval)

    def _lost(self, what: str, store_alive: bool = True) -> None:
        print(f"angpt train: error: rank {self.rank}: {what}; the checkpoints in {self.output_dir} are kept: continue "
              f"the run with `{resume_command()}` on every machine, launched as before", file=sys.stderr, flush=True)
        if store_alive:
            self._let_the_others_read()
        self._exit(LOST_RANK_EXIT_CODE)

    def _let_the_others_read(self) -> None:
        """Machine 0's launcher hosts the store and stops as soon as one of its processes ends: before ending, wait
        until every other rank has read the loss line (at most two beats; fewer read it when a whole machine is
        lost), or the ranks still to read it would name machine 0 instead."""
        try:
            readers, deadline = self.store.add(LOSS_READERS, 1), time.monotonic() + 2 * self.interval
            while readers < self.world - 1 and time.monotonic() < deadline:
                time.sleep(self.interval / 10)
                readers = self.store.add(LOSS_READERS, 0)
        except Exception:  # noqa: BLE001 - the store's host ended meanwhile: nobody is left to read it
            pass


def _check_reachable(address: tuple[str, int]) -> None:
    """Raise OSError when nothing listens at the store's address any more."""
    with socket.create_connection(address, timeout=5):
        pass


def _rendezvous_store():
    """A client of the store torchrun's agent hosts (its own connection: the main thread's stays untouched)."""
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=10))
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return dist.PrefixStore(f"angpt-rank-watch/{run}/", store)


def is_collective_failure(error: BaseException) -> bool:
    """An error a collective raises when a peer is gone: torch's DistError, or gloo's RuntimeError."""
    import torch.distributed as dist

    text = str(error)
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and (
        "gloo" in text or "Connection closed by peer" in text or "Connection reset by peer" in text))


@contextlib.contextmanager
def watch_ranks(accelerator, output_dir):
    """A RankWatch around a run of several processes: a collective that fails waits for it to name the lost rank;
    a run that ends (normally or with its own error) tells the other ranks it is done."""
    watch = RankWatch.start_for(accelerator, output_dir)
    try:
        yield watch
    except Exception as error:
        if watch is not None and is_collective_failure(error):
            watch.wait_for_loss()
        raise
    finally:
        if watch is not None:
            watch.stop()
