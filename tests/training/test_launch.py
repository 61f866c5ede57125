"""Launches whose processes do not form one run stop with one line; the MFU of several CPU processes counts the
machine's cores once. (The real 2-process run is tests/test_training_distributed.py.)"""
from __future__ import annotations

import types

import pytest
import torch
from cli_helpers import angpt, assert_one_line_error, snapshot
from training_fixtures import data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt.training.distributed import LaunchError, check_process_group, group_peak_flops


@pytest.mark.parametrize("env, expected", [
    ({"WORLD_SIZE": "2"}, ["WORLD_SIZE=2 is set but RANK, MASTER_ADDR, MASTER_PORT not", "accelerate launch"]),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"},
     ["RANK=2 does not fit WORLD_SIZE=2"]),
])
def test_processes_outside_a_launcher_stop_before_any_work(env, expected, write_recipe, tmp_path):
    recipe = write_recipe()
    before = snapshot(tmp_path)
    assert_one_line_error(angpt("train", recipe, **env), *expected)
    assert snapshot(tmp_path) == before


def fake_accelerator(processes: int, device: str = "cpu"):
    return types.SimpleNamespace(num_processes=processes, device=torch.device(device),
                                 distributed_type="DistributedType.NO")


def test_a_group_smaller_than_the_launch_is_an_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LaunchError, match=r"launched as 2 processes .* group of 1 .* would train independently"):
        check_process_group(fake_accelerator(1))
    check_process_group(fake_accelerator(2))


def test_cpu_processes_share_the_machine_peak(monkeypatch):
    """Two processes of two threads on a 2-core machine have the peak of 2 cores, like one process of two."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    per_core = 1e11
    assert group_peak_flops(fake_accelerator(2), 2 * per_core) == pytest.approx(2 * per_core)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert group_peak_flops(fake_accelerator(1), 2 * per_core) == pytest.approx(2 * per_core)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)       # torchrun's default: one thread each
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert group_peak_flops(fake_accelerator(2), per_core) == pytest.approx(2 * per_core)
    assert group_peak_flops(fake_accelerator(2, "meta"), 5.0) == 10.0  # devices of their own add up
