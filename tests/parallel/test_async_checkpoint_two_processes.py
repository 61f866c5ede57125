"""Asynchronous checkpoints on two CPU processes (torchrun, gloo; modeling_angpt/training/async_checkpoint.py,
docs/training.md "Asynchronous checkpoints"): a DDP and an FSDP2 model saved while training goes on, committed at
the same step on both ranks once every rank's data is written, loaded back exactly on the same two processes
(tests/drivers/async_checkpoint.py) and on one (here: DCP reshards)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from drivers.async_checkpoint import SHAPE, equal
from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training.async_checkpoint import load_model_and_optimizer
from training_fixtures import REPO

from modeling_angpt.training import async_checkpoint  # noqa: E402

pytestmark = [pytest.mark.parallel,
              pytest.mark.skipif(async_checkpoint.DefaultStager is None,
                                 reason=f"torch {torch.__version__} has no DefaultStager (async_checkpoint needs 2.9+)")]

MODES = ("ddp", "fsdp2")


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    """One torchrun launch saves and loads both models (half the start-up time of two)."""
    work = tmp_path_factory.mktemp("async_checkpoint")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2",
                           str(REPO / "tests" / "drivers" / "async_checkpoint.py"), str(work), *MODES],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return work


@pytest.mark.parametrize("mode", MODES)
def test_an_async_save_of_two_processes_loads_exactly_on_two_and_on_one(launched, mode):
    rank0, rank1 = [json.loads((launched / f"{mode}_rank{rank}.json").read_text()) for rank in (0, 1)]
    # the training step right after start() changed the weights, yet the checkpoint holds the state at start()
    assert rank0["changed_after_start"]
    # both ranks committed once, at the same step, and at rank 0's commit every rank's data was already written
    assert rank0["commits"] == rank1["commits"] and len(rank0["commits"]) == 1
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(rank0["files_at_commit"])
    assert rank0["whole_checkpoint_at_commit"]
    assert rank0["loaded_on_two_equal"]

    expected = torch.load(launched / f"{mode}_expected.pt", weights_only=False)
    model = AnGPTForCausalLM(AnGPTConfig(**SHAPE))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_model_and_optimizer(model, optimizer, launched / f"{mode}_checkpoint")  # one process: 2 -> 1
    assert equal(dict(model.state_dict()), expected["model"])
    assert equal(get_optimizer_state_dict(model, optimizer), expected["optimizer"])
