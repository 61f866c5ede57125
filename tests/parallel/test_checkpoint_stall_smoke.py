"""bench/checkpoint_stall.py end to end at a smoke size on two CPU processes (torchrun, gloo): every kind of save is
timed and its section written to a results page under tmp_path, never into docs/results/."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from training_fixtures import REPO

pytestmark = pytest.mark.parallel


def test_checkpoint_stall_times_every_kind_of_save_and_leaves_no_checkpoint(tmp_path):
    results, checkpoints = tmp_path / "benchmarks.md", tmp_path / "checkpoints"
    proc = subprocess.run([sys.executable, "bench/checkpoint_stall.py", "--hidden", "32", "--layers", "1", "--heads",
                           "2", "--vocab", "300", "--seq", "16", "--rounds", "3", "--dir", str(checkpoints),
                           "--results", str(results)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    text = results.read_text()
    assert "<!-- checkpoint_stall:start -->" in text and "DDP over 2 CPU processes" in text
    for row in ("no save", "accelerate save_state (synchronous)", "dcp.save (synchronous)",
                "AsyncCheckpointer.start (asynchronous)"):
        each = re.search(rf"^\| {re.escape(row)} \| [\d.]+ \| [-+][\d.]+ \| (.*) \|$", text, re.MULTILINE)
        assert each and len(each.group(1).split(", ")) >= 3, row  # at least one timing per round
    assert list(checkpoints.iterdir()) == []  # every checkpoint removed once timed
