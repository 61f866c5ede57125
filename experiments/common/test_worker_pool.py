"""The experiments' workers end with the experiment (experiments/common/worker_pool.py): an experiment killed with
SIGKILL, which runs no clean-up of its own, takes its busy worker with it, where a plain ProcessPoolExecutor's worker
lives on."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

COMMON = Path(__file__).resolve().parent

PARENT = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from worker_pool import worker_pool

pool = worker_pool(1) if sys.argv[2] == "ours" else ProcessPoolExecutor(1, mp_context=get_context("spawn"))
print(pool.submit(os.getpid).result(), flush=True)
pool.submit(time.sleep, 60)  # the worker is busy when its parent dies
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended (nobody reaped it yet)


def worker_after_parent_killed(kind: str) -> bool:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(COMMON), kind], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    time.sleep(0.5)  # the sleep task has reached the worker
    parent.kill()
    parent.wait()
    deadline = time.time() + 5
    while alive(worker) and time.time() < deadline:
        time.sleep(0.1)
    survived = alive(worker)
    if survived:
        os.kill(worker, 9)
    return survived


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_experiment_takes_its_workers_with_it():
    assert worker_after_parent_killed("plain")  # the oracle: what the experiments did before
    assert not worker_after_parent_killed("ours")
