"""FSDP2 (fully_shard) on two CPU processes over gloo, launched as a user would.

configuration/accelerate/cpu_2proc_fsdp2.yaml + ACCELERATE_USE_CPU=true: every parameter becomes a DTensor
sharded along dim 0. Checked: the losses equal a single process with the same global batch (float32), the weight
constraint holds exactly on the gathered weights, including nGPT's column-normalised o_proj/down_proj whose
columns span both shards, a run stopped at a checkpoint resumes to the same losses, and the final checkpoint
reloads with from_pretrained."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training_fixtures import REPO, data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

pytestmark = pytest.mark.parallel  # several processes: make test-parallel

STEPS = dict(max_steps=6, save_steps=3, eval_steps=0, logging_steps=3, per_device_train_batch_size=4,
             report_to=["jsonl"])


def _launch(mode: str, recipe: Path, *overrides: str) -> dict:
    accelerate = Path(sys.executable).with_name("accelerate")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([str(accelerate), "launch", "--config_file",
                           str(REPO / "configuration" / "accelerate" / "cpu_2proc_fsdp2.yaml"),
                           str(REPO / "tests" / "drivers" / "training_fsdp.py"), mode, str(recipe), *overrides],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("output_dir=")))
    return json.loads((run_dir / f"report_{mode}.json").read_text())


def _check(architecture: str, write_recipe, tmp_path, resume: bool) -> None:
    from modeling_angpt.training import load_recipe, train
    from transformers import AutoModelForCausalLM

    recipe = write_recipe(**STEPS, architecture=architecture)
    # the reference: one process, the same global batch (2 × 4)
    reference = train(load_recipe(recipe, ["per_device_train_batch_size=8", f"output_dir={tmp_path / 'single'}"]))
    out = f"output_dir={tmp_path / 'fsdp'}"
    if resume:
        stopped = _launch("stop", recipe, out)
        assert stopped["step"] == 3 and stopped["dtensor"] and stopped["distributed_type"] == "DistributedType.FSDP"
        report = _launch("resume", recipe, out)
        assert report["start_step"] == 3
    else:
        report = _launch("full", recipe, out)
    assert report["dtensor"] and report["num_processes"] == 2 and report["step"] == 6
    assert report["losses"] == pytest.approx(reference.losses, abs=1e-5, rel=0)
    if architecture == "ngpt":   # unit norm along d_model: o_proj/down_proj columns span both ranks' rows
        assert report["max_unit_norm_error"] < 1e-5
    else:                        # rows in the unit ball
        assert report["max_row_norm_excess"] < 1e-6
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "final")
    for (name, a), b in zip(reloaded.state_dict().items(), reference.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=name)


@pytest.mark.slow  # about a minute on a quiet 2-core machine: two launches of two processes
def test_fsdp2_ngpt_matches_one_process_resumes_and_reloads(write_recipe, tmp_path):
    _check("ngpt", write_recipe, tmp_path, resume=True)


@pytest.mark.slow
def test_fsdp2_angpt_matches_one_process_and_reloads(write_recipe, tmp_path):
    _check("angpt", write_recipe, tmp_path, resume=False)
