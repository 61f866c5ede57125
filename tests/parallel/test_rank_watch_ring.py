"""The lost-rank watch of a four-process run on two machines (two torchrun launches of two processes each on this
host, the store hosted by machine 0's launcher) loses rank 2 on machine 1: only rank 1 watches it (each rank watches
its successor), yet both survivors, ranks 0 and 1, print the one line naming it and end, well within a minute
(docs/training.md, "A lost rank"). And the store-load benchmark counts the requests its law predicts."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
STALE_S, BEAT_S, DEADLINE_S = 4.0, 0.5, 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(folder: Path) -> list[tuple[Path, subprocess.Popen]]:
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    port, machines = str(_free_port()), []
    for machine in (0, 1):
        log = folder / f"machine{machine}.log"
        with open(log, "w") as out:
            machines.append((log, subprocess.Popen(
                [str(torchrun), "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(machine),
                 "--master-addr", "127.0.0.1", "--master-port", port, str(REPO / "tests" / "drivers" / "rank_watch.py"),
                 str(folder), str(STALE_S), str(BEAT_S)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)))
    return machines


def _stop(machines) -> None:
    for _, launcher in machines:
        with contextlib.suppress(psutil.NoSuchProcess):
            parent = psutil.Process(launcher.pid)
            for process in [parent, *parent.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        launcher.wait()


def test_the_survivors_of_a_four_process_run_all_name_the_rank_only_one_of_them_watched(tmp_path):
    machines = _launch(tmp_path)
    try:
        start = time.monotonic()
        while len(list(tmp_path.glob("ready_*"))) < 4:
            assert all(proc.poll() is None for _, proc in machines), machines[0][0].read_text()[-3000:]
            assert time.monotonic() - start < 240, "the watches did not start"
            time.sleep(0.2)
        time.sleep(2 * BEAT_S)  # every rank has beaten
        os.kill(int((tmp_path / "ready_2").read_text()), 9)  # rank 2, machine 1 (its launcher then stops rank 3)
        killed = time.monotonic()
        code = machines[0][1].wait(timeout=DEADLINE_S + 30)
        took = time.monotonic() - killed
    finally:
        _stop(machines)
    log = machines[0][0].read_text()
    lines = sorted(line for line in log.splitlines() if line.startswith("angpt train: error:"))
    assert code != 0 and took < DEADLINE_S, (took, log[-3000:])
    assert [line.split(": lost rank 2 of 4 (machine 1): no heartbeat for 4 s")[0] for line in lines] == \
        ["angpt train: error: rank 0", "angpt train: error: rank 1"], log[-3000:]
    print(f"\nrank 2 lost: machine 0 stopped after {took:.1f} s (the watch's staleness {STALE_S:g} s)")


def test_the_store_load_benchmark_counts_what_each_watch_law_predicts(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import rank_watch_store_load as bench

    known = subprocess.run(["git", "cat-file", "-e", f"{bench.BEFORE}^{{commit}}"], cwd=REPO, capture_output=True)
    if known.returncode != 0:  # a shallow clone: the earlier watch is not there (test_rank_watch.py counts today's)
        pytest.skip(f"commit {bench.BEFORE} (the earlier watch the benchmark measures) is not in this checkout")

    results = tmp_path / "benchmarks.md"
    bench.main(["--processes", "2", "3", "--seconds", "4", "--results", str(results)])
    rows = [line.split(" | ") for line in results.read_text().splitlines() if line[:4] in ("| 2 ", "| 3 ")]
    for row in rows:  # per process and beat (one address check each): 3W−2 requests before (3 per peer), 3 now
        world, before, now = int(row[0].strip("| ")), float(row[1]), float(row[3])
        before_beats, now_beats = map(float, row[6].strip(" |").split(" / "))
        assert before / before_beats == pytest.approx(3 * world - 2, rel=0.1), row
        assert now / now_beats == pytest.approx(3, rel=0.1), row
    assert len(rows) == 2
