"""DeepSpeed ZeRO-2 and ZeRO-3 through transformers' Trainer on two CPU processes (torchrun, DS_ACCELERATOR=cpu)
against one process without DeepSpeed (docs/tools.md, "DeepSpeed"): anGPT, 8 AdamW steps at lr 0.05 with the same
global batch (tests/drivers/training_deepspeed.py). DeepSpeed comes with the extra `[deepspeed]`, which make test-tools
installs.

- WeightConstraintCallback keeps every weight row in the unit ball under ZeRO-3 with every parameter partitioned (and
  without it the rows leave it: the learning rate is chosen so);
- the losses equal one process's within 1e-4 at every step, with the callback (its projection reaches DeepSpeed's
  float32 master copy, or the next step would undo it) and without it;
- the checkpoint `save_model` writes under ZeRO-3 (gathered from the partitions) reloads to the trained logits.

Figures (worst row norm, max |Δloss|, reload max |Δlogit|) are printed with -s for docs/tools.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.tools  # make test-tools

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "drivers" / "training_deepspeed.py"
RUNS = {"zero2": (2, 1), "zero3": (3, 1), "zero3_no_callback": (3, 0), "one_process": (0, 1),
        "one_process_no_callback": (0, 0)}


def _run(work: Path, stage: int, callback: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    launcher = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2"] if stage else [
        sys.executable]
    proc = subprocess.run([*launcher, str(DRIVER), str(work), str(stage), str(callback)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((work / "report.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("deepspeed", reason="DeepSpeed is the extra [deepspeed] (make test-tools installs it)")
    root = tmp_path_factory.mktemp("deepspeed")
    return {name: (root / name, _run(root / name, *spec)) for name, spec in RUNS.items()}


def _max_delta(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == 8
    return max(abs(x - y) for x, y in zip(a, b))


def test_the_constraint_holds_on_partitioned_parameters(runs):
    with_callback, without = runs["zero3"][1], runs["zero3_no_callback"][1]
    print(f"\nZeRO-3 worst row norm: with WeightConstraintCallback {with_callback['worst_row_norm']:.4f}, "
          f"without {without['worst_row_norm']:.4f}; ZeRO-2 with it {runs['zero2'][1]['worst_row_norm']:.4f}")
    assert with_callback["processes"] == 2
    assert with_callback["worst_row_norm"] <= 1 + 1e-5 and runs["zero2"][1]["worst_row_norm"] <= 1 + 1e-5
    assert without["worst_row_norm"] > 1.2  # the steps do push rows out: the callback is what brings them back


@pytest.mark.parametrize("run, oracle", [("zero2", "one_process"), ("zero3", "one_process"),
                                         ("zero3_no_callback", "one_process_no_callback")])
def test_the_losses_equal_one_process(runs, run, oracle):
    delta = _max_delta(runs[run][1]["losses"], runs[oracle][1]["losses"])
    print(f"\n{run} against {oracle}: max |Δloss| over 8 steps {delta:.2e}")
    assert delta <= 1e-4


def test_a_zero3_checkpoint_reloads_to_the_same_logits(runs):
    from transformers import AutoModelForCausalLM

    from drivers.training_deepspeed import Windows

    work = runs["zero3"][0]
    reloaded = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = reloaded(Windows(2, reloaded.config.vocab_size).ids).logits
    expected = torch.load(work / "logits.pt")
    delta = (logits - expected).abs().max().item()
    one_process = torch.load(runs["one_process"][0] / "logits.pt")
    print(f"\nZeRO-3 checkpoint reloaded: max |Δlogit| {delta:.2e}; against one process "
          f"{(logits - one_process).abs().max().item():.2e}")
    assert delta <= 1e-5 and (logits - one_process).abs().max().item() <= 1e-3
