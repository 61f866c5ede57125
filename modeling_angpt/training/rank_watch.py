"""A lost rank stops the run in one line (docs/training.md, "A lost rank").

When one process or machine of a run dies, the others must not wait forever in their next collective, nor end in a
backend's traceback (gloo's "Connection reset by peer") that names neither the lost rank nor how to go on. Each
process runs a `RankWatch`: a daemon thread that bumps its own counter in the run's rendezvous store (the TCPStore
torchrun hosts at MASTER_ADDR:MASTER_PORT) every `INTERVAL_S` and reads every other rank's. A rank whose counter has
not moved for `STALE_AFTER_S` (by this process's own clock: machines' clocks may differ), or a store that no longer
answers (it lives in machine 0's launcher, which stops with its processes), is lost: the watch prints one line
naming it and the `--resume` command, and ends the process, whatever its main thread is blocked in (an NCCL
collective waits for its time-out). Written by hand: neither torch nor Accelerate reports which peer of a group is
gone (torch's elastic agent names only the failed processes of its own machine).

A rank that finishes normally says so first (`stop`), so the ranks still saving the final model do not count it as
lost.
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
    """The heartbeat of every rank of a run in its rendezvous store (see the module docstring)."""

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
        """This rank ends normally: the others stop watching it."""
        self._stopped.set()
        try:
            self.store.set(f"done/{self.rank}", "1")
        except Exception:  # noqa: BLE001 - the store's host may already have ended with its own finished run
            pass

    def wait_for_loss(self) -> None:
        """After a collective failed: give the watch the time to name the lost rank (it then ends the process)."""
        self._thread.join(timeout=self.stale_after + 3 * self.interval)

    def _machine(self, rank: int) -> int:
        return rank // self.local

    def _run(self) -> None:
        beats, seen, since = 0, {}, {}
        while not self._stopped.is_set():
            try:
                if self.address is not None:  # before the store's client, which logs a C++ trace on a dead host
                    _check_reachable(self.address)
                beats += 1
                self.store.set(f"beat/{self.rank}", str(beats))
                now = time.monotonic()
                for rank in range(self.world):
                    if rank == self.rank or self.store.check([f"done/{rank}"]):
                        continue
                    value = self.store.get(f"beat/{rank}") if self.store.check([f"beat/{rank}"]) else None
                    if value != seen.get(rank):
                        seen[rank], since[rank] = value, now
                    elif value is not None and now - since[rank] > self.stale_after:
                        return self._lost(f"lost rank {rank} of {self.world} (machine {self._machine(rank)}): no "
                                          f"heartbeat for {self.stale_after:g} s, its process or machine stopped")
            except Exception:  # noqa: BLE001 - any store failure means its host is gone
                if self._stopped.is_set():
                    return
                ranks = "rank 0" if self.local == 1 else f"ranks 0 to {self.local - 1}"
                host = "" if self.address is None else f" at {self.address[0]}:{self.address[1]}"
                return self._lost(f"lost {ranks} of {self.world} (machine 0, whose launcher hosts the run's "
                                  f"rendezvous{host}): it stopped")
            self._stopped.wait(self.interval)

    def _lost(self, what: str) -> None:
        print(f"angpt train: error: rank {self.rank}: {what}; the checkpoints in {self.output_dir} are kept: continue "
              f"the run with `{resume_command()}` on every machine, launched as before", file=sys.stderr, flush=True)
        self._exit(LOST_RANK_EXIT_CODE)


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
