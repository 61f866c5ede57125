"""Real two-process data parallelism on CPU (gloo), launched like a user would with accelerate."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training_fixtures import REPO, data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

pytestmark = pytest.mark.parallel  # several processes: make test-parallel


# make test runs the same checks (one gloo group, bit-identical replicas, equal losses, both ranks' tokens) on two
# accelerate machines of one process each (test_multi_machine.py); this one launches with cpu_2proc.yaml.
@pytest.mark.slow
def test_two_cpu_processes_train_one_identical_model(write_recipe, tmp_path):
    recipe = write_recipe(max_steps=12, eval_steps=6, save_steps=6, logging_steps=6)
    accelerate = Path(sys.executable).with_name("accelerate")
    # As shipped: no ACCELERATE_USE_CPU or other variable needed for a real 2-process CPU group.
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([str(accelerate), "launch", "--config_file",
                           str(REPO / "configuration" / "accelerate" / "cpu_2proc.yaml"),
                           str(REPO / "tests" / "drivers" / "training_ddp.py"), str(recipe)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["num_processes"] == 2 and r["distributed_type"] == "DistributedType.MULTI_CPU"
               and r["backend"] == "gloo" for r in reports)
    assert reports[0]["param_sha256"] == reports[1]["param_sha256"]   # bit-identical replicas
    assert reports[0]["losses"] == reports[1]["losses"] and len(reports[0]["losses"]) == 12
    meta = json.loads((tmp_path / "run" / "final" / "training_metadata.json").read_text())
    assert meta["num_processes"] == 2 and meta["tokens_seen"] == 12 * 2 * 8 * 64   # both ranks' batches
