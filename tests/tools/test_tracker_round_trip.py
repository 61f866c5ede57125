"""Experiment trackers through Accelerate (training/trackers.py; docs/training.md, "Watching a run: trackers"): what
each tracker's own reader gives back equals metrics.jsonl, for a run killed with SIGKILL after a checkpoint and
resumed. The trackers run in their offline/local modes: wandb offline, mlflow's SQLite store in the run directory,
trackio's local store in a temporary TRACKIO_DIR."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tracker_readers as readers
from training_fixtures import REPO, data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt.training.checkpoints import list_checkpoints

pytestmark = pytest.mark.tools  # make test-tools

KEYS = ("loss", "val_loss")
# Checkpoints every SAVE steps. wandb and trackio write from a background process or thread: a SIGKILL loses what they
# had not yet written (docs/training.md), so the run is killed once every tracker holds the step of its newest
# checkpoint, the one --resume continues.
STEPS, SAVE, EVAL = 400, 100, 50


@pytest.fixture
def tracker_env(tmp_path, monkeypatch):
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
           "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
           "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    if "trackio.utils" in sys.modules:  # trackio reads TRACKIO_DIR when imported
        for module in ("trackio.utils", "trackio.sqlite_storage"):
            monkeypatch.setattr(sys.modules[module], "TRACKIO_DIR", tmp_path / "trackio", raising=False)
    return dict(os.environ)


def _all_trackers(run, name) -> dict:
    ids = json.loads((run / "trackers.json").read_text())
    return {"tensorboard": readers.tensorboard_series(run / "logs" / name, KEYS),
            "mlflow": readers.mlflow_series(ids["mlflow"]["tracking_uri"], ids["mlflow"]["run_id"], KEYS),
            "wandb": readers.wandb_series(run / "wandb", ids["wandb"]["id"], KEYS),
            "trackio": readers.trackio_series(name, name, KEYS)}


def _stored_up_to(run, name, step: int) -> bool:
    """Every tracker has the loss of `step` in its store (read while the run writes: a store caught mid-write
    counts as not yet)."""
    try:
        return all(step in series.get("loss", {}) for series in _all_trackers(run, name).values())
    except Exception:
        return False


def _newest_checkpoint(run) -> int:
    found = list_checkpoints(run)
    return int(found[-1].name.split("_")[1]) if found else 0


def _kill_after_a_checkpoint(process, run, name) -> int:
    """SIGKILL once every tracker holds the newest checkpoint's step; that step."""
    deadline = time.time() + 300
    while True:
        assert process.poll() is None, "the run ended before it was killed"
        assert time.time() < deadline, "no checkpoint reached every tracker within 300 s"
        step = _newest_checkpoint(run)
        if step and _stored_up_to(run, name, step) and _newest_checkpoint(run) == step:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return step
        time.sleep(0.2)


def test_each_tracker_reads_back_the_jsonl_losses_after_a_kill_and_resume(write_recipe, tracker_env, tmp_path):
    recipe = write_recipe(max_steps=STEPS, logging_steps=1, eval_steps=EVAL, save_steps=SAVE, save_total_limit=None,
                          eval_max_batches=1, max_corpus_chars=50_000,
                          report_to=["jsonl", "tensorboard", "mlflow", "wandb", "trackio"])
    run, name = tmp_path / "run", "run"
    _all_trackers  # the readers' imports before the run starts, so that polling keeps up with it
    import mlflow.tracking, tensorboard.backend.event_processing.event_accumulator, wandb.proto  # noqa: F401
    command = [sys.executable, "-m", "modeling_angpt.cli", "train", str(recipe)]
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, env=tracker_env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            killed_after = _kill_after_a_checkpoint(first, run, name)
        finally:
            first.kill()
            first.wait()
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert killed_after < max(logged) < STEPS  # killed mid-run, after logging steps the resumed run recomputes

    resumed = subprocess.run(command + ["--resume"], env=tracker_env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {killed_after}\n" in resumed.stdout  # from the checkpoint every tracker held
    expected = readers.jsonl_series(run / "metrics.jsonl", KEYS)
    assert sorted(expected["loss"]) == list(range(1, STEPS + 1))
    assert sorted(expected["val_loss"]) == list(range(0, STEPS + 1, EVAL))
    for tracker, series in _all_trackers(run, name).items():
        for key in KEYS:
            assert sorted(series[key]) == sorted(expected[key]), f"{tracker} {key}: steps differ"
            for step, value in expected[key].items():  # TensorBoard stores float32
                assert series[key][step] == pytest.approx(value, rel=1e-6), f"{tracker} {key} at step {step}"

    # The resumed run continued each tracker's run instead of starting another one.
    from mlflow.tracking import MlflowClient

    ids = json.loads((run / "trackers.json").read_text())
    client = MlflowClient(tracking_uri=ids["mlflow"]["tracking_uri"])
    experiment = client.get_experiment_by_name(name)
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [ids["mlflow"]["run_id"]]
    assert len(list((run / "wandb").glob(f"offline-run-*-{ids['wandb']['id']}"))) == 2  # one file per process
    from trackio.sqlite_storage import SQLiteStorage

    assert SQLiteStorage.get_runs(name) == [name]
