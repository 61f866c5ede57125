"""Checkpoint integrity without training (modeling_angpt/training/checkpoints.py): a checkpoint counts once its
completion marker is there and every file has the size the marker recorded; resume names each newer incomplete one
and takes the one before; nothing complete means one line, never a start from scratch; pruning keeps the last
complete checkpoint."""
from __future__ import annotations

import json
import os

import pytest
from training_fixtures import data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt.training import async_checkpoint, checkpoints
from modeling_angpt.training.checkpoints import CheckpointError, problem, resume_candidates


def _committed(output_dir, step: int, payload: bytes = b"w" * 1000):
    """A checkpoint as save_checkpoint commits it: files, state, marker, rename."""
    final = checkpoints.checkpoint_path(output_dir, step)
    tmp = final.parent / f".tmp_{final.name}"
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(payload)
    (tmp / checkpoints.STATE_FILE).write_text(json.dumps({"step": step, "format": checkpoints.FORMAT}))
    checkpoints.commit(tmp, final, output_dir, keep=None)
    return final


def test_a_committed_checkpoint_is_complete_and_damage_is_named(tmp_path):
    path = _committed(tmp_path, 10)
    assert problem(path) is None and checkpoints.latest_checkpoint(tmp_path) == path
    os.truncate(path / "model.safetensors", 100)
    assert problem(path) == "model.safetensors has 100 bytes, 1000 were written"
    (path / "model.safetensors").unlink()
    assert problem(path) == "model.safetensors is missing"
    (path / checkpoints.MARKER).unlink()
    assert problem(path) == f"no {checkpoints.MARKER}: written only in part"
    assert checkpoints.list_checkpoints(tmp_path) == []


def test_a_checkpoint_of_an_earlier_version_without_marker_counts(tmp_path):
    legacy = checkpoints.checkpoint_path(tmp_path, 5)
    legacy.mkdir(parents=True)
    (legacy / checkpoints.STATE_FILE).write_text(json.dumps({"step": 5}))
    assert problem(legacy) is None


def test_resume_names_each_newer_incomplete_checkpoint_and_takes_the_one_before(tmp_path):
    older, newer = _committed(tmp_path, 10), _committed(tmp_path, 20)
    os.truncate(newer / "model.safetensors", 3)
    said = []
    assert resume_candidates(tmp_path, announce=said.append) == [older]
    assert said == [f"--resume: checkpoint {newer} is incomplete (model.safetensors has 3 bytes, 1000 were written); "
                    "using the one before it"]


def test_no_complete_checkpoint_is_one_line_not_a_fresh_start(tmp_path):
    only = _committed(tmp_path, 10)
    (only / checkpoints.MARKER).unlink()
    with pytest.raises(CheckpointError, match=r"no complete checkpoint under .*step_0000010: no checkpoint_complete"):
        resume_candidates(tmp_path, announce=lambda line: None)
    assert resume_candidates(tmp_path / "empty", announce=print) == []   # no run there at all


def test_pruning_keeps_the_newest_complete_and_removes_older_debris(tmp_path):
    first, second = _committed(tmp_path, 10), _committed(tmp_path, 20)
    (second / checkpoints.MARKER).unlink()          # cut short: not complete
    checkpoints.prune_checkpoints(tmp_path, keep=1)
    assert first.is_dir() and second.is_dir()       # the last complete one stays; newer debris is not touched
    third = _committed(tmp_path, 30)
    checkpoints.prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in checkpoints.checkpoints_root(tmp_path).iterdir()] == [third.name]


def test_a_complete_checkpoint_that_does_not_load_is_named_and_the_one_before_is_used(write_recipe, tmp_path, capsys):
    """The newest checkpoint's files have their recorded sizes but its weights' header is garbage: the resume names it
    in one line and continues from the one before, whose losses it then reproduces."""
    from modeling_angpt.training import load_recipe, train

    recipe = load_recipe(write_recipe(), ["max_steps=6", "eval_steps=0", "save_steps=2", "save_total_limit=3"])
    train(recipe, stop_after_steps=4)
    weights = tmp_path / "run" / "checkpoints" / "step_0000004" / "model.safetensors"
    with open(weights, "r+b") as file:
        file.write(b"\xff" * 16)                                  # same size, unreadable header
    resumed = train(recipe, resume=True)
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "does not load" in line]
    assert len(said) == 1 and "step_0000004 does not load" in said[0] and "using the one before it" in said[0]
    assert resumed.start_step == 2 and resumed.step == 6


@pytest.mark.skipif(async_checkpoint.DefaultStager is None,
                    reason="this torch has no DefaultStager (async_checkpoint needs 2.9+)")
def test_asynchronous_checkpoints_commit_and_resume_as_the_synchronous_ones(write_recipe, tmp_path):
    """async_checkpoint: the step-2 and step-4 checkpoints are written in the background and committed (marker, rename)
    at a later step boundary or at the run's end; resuming from one reproduces the uninterrupted losses."""
    import numpy as np

    from modeling_angpt.training import load_recipe, train

    common = ["max_steps=6", "eval_steps=0", "save_steps=2", "save_total_limit=0", "async_checkpoint=true"]
    full = train(load_recipe(write_recipe(), common + [f"output_dir={tmp_path / 'full'}"]))
    parted = load_recipe(write_recipe(), common + [f"output_dir={tmp_path / 'parted'}"])
    train(parted, stop_after_steps=4)
    root = checkpoints.checkpoints_root(tmp_path / "parted")
    assert [p.name for p in checkpoints.list_checkpoints(tmp_path / "parted")] == ["step_0000002", "step_0000004"]
    assert (root / "step_0000004" / checkpoints.ASYNC_STATE_DIR / ".metadata").is_file()
    assert not list(root.glob(".tmp*"))
    resumed = train(parted, resume=True)
    assert resumed.start_step == 4
    np.testing.assert_allclose(resumed.losses, full.losses, rtol=0, atol=1e-6)
