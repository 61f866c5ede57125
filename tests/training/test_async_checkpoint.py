"""Asynchronous checkpoints in one process (modeling_angpt/training/async_checkpoint.py, docs/training.md
"Asynchronous checkpoints"); two processes, DDP and FSDP2, resharding to one:
tests/parallel/test_async_checkpoint_two_processes.py. The oracle is a copy of the model's and optimiser's state taken
at the moment of the save."""
from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from drivers.async_checkpoint import SHAPE, equal, train_step
from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training.async_checkpoint import (AsyncCheckpointError, AsyncCheckpointer,
                                                      load_model_and_optimizer)

from modeling_angpt.training import async_checkpoint  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.skipif(async_checkpoint.DefaultStager is None,
                                 reason=f"torch {torch.__version__} has no DefaultStager (async_checkpoint needs 2.9+)")]


def _trained(steps: int = 2):
    torch.manual_seed(0)
    model = AnGPTForCausalLM(AnGPTConfig(**SHAPE))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        train_step(model, optimizer, seed=step)
    return model, optimizer


def _fresh():
    torch.manual_seed(1)  # other weights than the saved ones
    model = AnGPTForCausalLM(AnGPTConfig(**SHAPE))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_a_save_holds_the_state_at_start_although_training_changes_it_at_once(tmp_path):
    model, optimizer = _trained()
    expected = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    checkpointer, threads = AsyncCheckpointer(), []
    checkpointer.start(model, optimizer, tmp_path / "checkpoint",
                       on_done=lambda: threads.append(threading.current_thread()))
    train_step(model, optimizer, seed=99)  # every weight and moment changes while the write may still run
    assert not equal(model.state_dict(), expected["model"])
    while not checkpointer.poll():
        time.sleep(0.01)
    assert threads == [threading.main_thread()]  # committed once, in the training thread
    assert not checkpointer.poll() and not checkpointer.in_flight
    checkpointer.close()

    restored, restored_optimizer = _fresh()
    load_model_and_optimizer(restored, restored_optimizer, tmp_path / "checkpoint")
    assert equal(restored.state_dict(), expected["model"])
    assert equal(restored_optimizer.state_dict(), expected["optimizer"])


def test_a_second_save_first_waits_for_the_one_in_flight_and_commits_it(tmp_path, monkeypatch):
    # the first save's last step (rank 0 writing .metadata) is held until the gate opens 0.5 s later
    gate, finish = threading.Event(), FileSystemWriter.finish
    monkeypatch.setattr(FileSystemWriter, "finish", lambda self, *a, **k: (gate.wait(), finish(self, *a, **k))[1])
    model, optimizer = _trained()
    checkpointer, events = AsyncCheckpointer(), []
    checkpointer.start(model, optimizer, tmp_path / "first", on_done=lambda: events.append("first committed"))
    assert not checkpointer.poll()  # still writing: nothing committed
    threading.Timer(0.5, gate.set).start()
    began = time.monotonic()
    checkpointer.start(model, optimizer, tmp_path / "second", on_done=lambda: events.append("second committed"))
    assert time.monotonic() - began >= 0.45 and events == ["first committed"]
    assert (tmp_path / "first" / ".metadata").is_file()
    checkpointer.wait()
    assert events == ["first committed", "second committed"] and not checkpointer.in_flight
    checkpointer.close()


def test_a_save_never_overwrites_a_checkpoint_and_a_load_needs_a_complete_one_of_this_model(tmp_path):
    model, optimizer = _trained(1)
    checkpointer = AsyncCheckpointer()
    checkpointer.start(model, optimizer, tmp_path / "done", on_done=lambda: None)
    checkpointer.wait()
    written = {p.name: p.read_bytes() for p in (tmp_path / "done").iterdir()}
    with pytest.raises(AsyncCheckpointError, match=r"done already holds a checkpoint \(\.metadata\)"):
        checkpointer.start(model, optimizer, tmp_path / "done", on_done=lambda: None)
    assert {p.name: p.read_bytes() for p in (tmp_path / "done").iterdir()} == written
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "__0_0.distcp").write_bytes(b"partial")
    with pytest.raises(AsyncCheckpointError, match=r"cut has no \.metadata: expected a complete checkpoint"):
        load_model_and_optimizer(*_fresh(), tmp_path / "cut")
    wider = AnGPTForCausalLM(AnGPTConfig(**{**SHAPE, "hidden_size": 64}))
    with pytest.raises(AsyncCheckpointError,
                       match=r"done does not load into this model and optimiser: .*Size mismatch") as error:
        load_model_and_optimizer(wider, torch.optim.AdamW(wider.parameters()), tmp_path / "done")
    assert "\n" not in str(error.value)
    checkpointer.close()


def test_a_failed_write_is_one_line_naming_the_directory_and_nothing_is_committed(tmp_path):
    model, optimizer = _trained(1)
    (tmp_path / "a_file").write_text("not a directory")
    checkpointer, events = AsyncCheckpointer(), []
    checkpointer.start(model, optimizer, tmp_path / "a_file" / "checkpoint", on_done=lambda: events.append(1))
    with pytest.raises(AsyncCheckpointError) as failure:
        checkpointer.wait()
    assert str(failure.value).startswith(f"asynchronous checkpoint into {tmp_path / 'a_file' / 'checkpoint'} failed:")
    assert "\n" not in str(failure.value) and events == [] and not checkpointer.in_flight
    checkpointer.close()
