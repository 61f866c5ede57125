"""A run of two machines (configuration/accelerate/cpu_2machines.yaml: one CPU process each on this host, gloo) loses
one of them mid-run: the survivor stops within 60 s with one line naming the lost rank and the command that continues
the run (docs/training.md, "A lost rank"; modeling_angpt/training/rank_watch.py). Rank 1's process is killed, then, in
a second run, rank 0's, whose launcher hosts the rendezvous store and stops with it."""
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
import yaml

from training_fixtures import REPO, TINY, data_cache  # noqa: F401 (fixture)

pytestmark = pytest.mark.parallel

CONFIG = REPO / "configuration" / "accelerate" / "cpu_2machines.yaml"
DEADLINE_S = 60.0  # the bound on how long the survivor may go on


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(recipe: Path, output_dir: Path, logs: Path) -> list[tuple[Path, subprocess.Popen]]:
    accelerate = Path(sys.executable).with_name("accelerate")
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    port, machines = str(_free_port()), []
    for machine in (0, 1):
        log = logs / f"machine{machine}.log"
        with open(log, "w") as out:
            machines.append((log, subprocess.Popen(
                [str(accelerate), "launch", "--config_file", str(CONFIG), "--machine_rank", str(machine),
                 "--main_process_port", port, "-m", "modeling_angpt.cli", "train", str(recipe),
                 "--override", f"output_dir={output_dir}"],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)))
    return machines


def _processes(launcher: subprocess.Popen) -> list[psutil.Process]:
    """The launcher and what it started (torchrun starts each worker in a session of its own)."""
    try:
        parent = psutil.Process(launcher.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _stop(machines) -> None:
    for _, launcher in machines:
        for process in _processes(launcher):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        launcher.wait()


def _wait_for_checkpoint(output_dir: Path, machines, timeout: float = 240.0) -> None:
    start = time.monotonic()
    while not list((output_dir / "checkpoints").glob("step_*")):
        assert all(proc.poll() is None for _, proc in machines), machines[0][0].read_text()[-3000:]
        assert time.monotonic() - start < timeout, "no checkpoint written"
        time.sleep(0.5)


@pytest.mark.parametrize("lost", [1, 0])
def test_the_survivor_names_the_lost_rank_and_the_resume_command_within_a_minute(tmp_path, data_cache, lost):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "max_steps": 100_000, "save_steps": 2, "eval_steps": 0,
                                      "logging_steps": 50, "per_device_train_batch_size": 4,
                                      "data_cache_dir": str(data_cache), "output_dir": str(tmp_path / "unused")}))
    output_dir = tmp_path / "run"
    machines = _launch(recipe, output_dir, tmp_path)
    try:
        _wait_for_checkpoint(output_dir, machines)
        workers = [p for p in _processes(machines[lost][1])[1:] if "modeling_angpt.cli" in " ".join(p.cmdline())]
        assert len(workers) == 1
        workers[0].kill()  # rank `lost`'s process (its launcher then stops too, reporting it)
        killed = time.monotonic()
        survivor_log, survivor = machines[1 - lost]
        code = survivor.wait(timeout=DEADLINE_S + 30)
        took = time.monotonic() - killed
    finally:
        _stop(machines)
    log = survivor_log.read_text()
    lines = [line for line in log.splitlines() if line.startswith("angpt train: error:")]
    assert code != 0 and took < DEADLINE_S, (took, log[-3000:])
    assert len(lines) == 1, log[-3000:]
    resume = f"`angpt train {recipe} --override output_dir={output_dir} --resume`"
    assert resume in lines[0]
    if lost == 1:
        assert "lost rank 1 of 2 (machine 1)" in lines[0]
    else:  # machine 0's launcher hosted the store: the survivor names the machine and its ranks
        assert "lost rank 0 of 2 (machine 0, whose launcher hosts the run's rendezvous" in lines[0]
    # no traceback of the survivor's own, nor the store client's C++ trace (the launcher adds its exit report)
    assert "modeling_angpt/" not in log and "TCPStore.cpp" not in log
    print(f"\nlost machine {lost}: the survivor stopped after {took:.1f} s and printed:\n{lines[0]}")
