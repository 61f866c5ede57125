"""The experiments' process pool: spawned workers that end with the experiment.

A worker of a plain ProcessPoolExecutor outlives its parent: kill an experiment with `kill PID` and its workers go
on training, the runs they had started and the ones already queued to them, beside the experiment started again in
their place. Each worker here asks Linux to send it SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), so
killing the experiment stops its runs, which later resume from their last saved state. Elsewhere the workers
behave as ProcessPoolExecutor's do, and the run directories' lock (modeling_angpt/training/run_dir.py, `hold`) still
refuses to let two live processes write one run.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` spawned processes (fresh interpreters: no fork of a process holding threads or torch state)."""
    return ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_die_with_parent,
                               initargs=(os.getpid(),))


def _die_with_parent(parent: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        return  # not allowed here: behave as a plain pool's worker
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
