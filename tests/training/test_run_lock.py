"""One live process per run directory (training/run_dir.py, `hold`): a directory that another running process holds is
refused, by `angpt train` whatever its flags and by a semantic-focus run, with one line and nothing touched; the
lock goes with its holder however that process ends. The other process is an independent oracle: a bare Python
that takes the same kind of lock (flock on the directory) without importing the library."""
from __future__ import annotations

import subprocess
import sys

import pytest
from cli_helpers import angpt, assert_one_line_error, snapshot
from training_fixtures import TINY, data_cache, fake_previous_run, single_thread, write_recipe  # noqa: F401 (fixtures)

HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin or kills this process
"""


@pytest.fixture
def held_by_another_process():
    """Start a process that holds a directory's lock; yields a function (dir) -> that process."""
    holders = []

    def hold(path):
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        holders.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in holders:
        proc.kill()
        proc.wait()


def test_a_held_directory_is_refused_until_its_holder_dies(tmp_path, held_by_another_process):
    from modeling_angpt.training.run_dir import RunDirInUseError, hold

    holder = held_by_another_process(tmp_path)
    with pytest.raises(RunDirInUseError, match=f"output directory {tmp_path} is in use by another running process"):
        with hold(tmp_path):
            pass
    holder.kill()  # as a killed job's leftover worker would end: no clean-up of its own
    holder.wait()
    with hold(tmp_path):
        with pytest.raises(RunDirInUseError):  # and while this process holds it, a second claim is refused
            with hold(tmp_path):
                pass


def test_hold_creates_a_missing_directory_and_removes_it_only_if_left_empty(tmp_path):
    from modeling_angpt.training.run_dir import hold

    with hold(tmp_path / "a" / "run"):
        assert (tmp_path / "a" / "run").is_dir()
    assert not (tmp_path / "a").exists()  # a refused or failed run leaves no empty directory behind
    with hold(tmp_path / "b"):
        (tmp_path / "b" / "metrics.jsonl").write_text("{}\n")
    assert (tmp_path / "b" / "metrics.jsonl").exists()
    (tmp_path / "c").mkdir()
    with hold(tmp_path / "c"):
        pass
    assert (tmp_path / "c").is_dir()  # a directory that was there before stays


@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_train_refuses_a_run_directory_another_process_is_training_in(flag, write_recipe, tmp_path,
                                                                     held_by_another_process):
    run, recipe = tmp_path / "run", write_recipe()
    fake_previous_run(run, recipe)
    held_by_another_process(run)
    before = snapshot(tmp_path)
    assert_one_line_error(angpt("train", recipe, flag), f"output directory {run} is in use by another running process")
    assert snapshot(tmp_path) == before


def test_semantic_focus_refuses_a_run_another_process_is_writing(tmp_path, held_by_another_process):
    from modeling_angpt.evaluation.semantic_focus import ProtocolSettings, run_protocol
    from modeling_angpt.training.run_dir import RunDirInUseError

    def run(epochs: int, resume: bool = False) -> dict:
        return run_protocol(ProtocolSettings("parity", out, epochs=epochs, resume=resume, n_train=40, n_heldout=10,
                                             model=dict(num_layers=1), backbone="paper", tensorboard=False,
                                             save_model=False), log=lambda line: None)

    out = tmp_path / "run"
    run(epochs=1)
    before = snapshot(tmp_path)
    holder = held_by_another_process(out)
    with pytest.raises(RunDirInUseError, match=str(out)):
        run(epochs=2, resume=True)
    assert snapshot(tmp_path) == before
    holder.kill()
    holder.wait()
    assert run(epochs=2, resume=True)["epochs_run"] == 2
