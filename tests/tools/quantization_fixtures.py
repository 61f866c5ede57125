"""Shared by the quantization tests (tests/tools/test_quantization.py, test_bnb_4bit_paths.py): bench/quantization.py
as a module, the tiny trained models it measures, and bitsandbytes' two 4-bit CPU paths, chosen per test
(docs/tools.md, "bitsandbytes on a CPU: two 4-bit paths")."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# The tests' models are 64 wide: bitsandbytes' packed 4-bit path needs every layer's input at least as wide as its
# quantization block (64); narrower, it fails on a transformers Qwen3 too (test_bnb_4bit_paths.py).
HIDDEN = 64


@pytest.fixture(scope="module")
def bench():
    """bench/quantization.py as a module (bench/ is not a package; its scripts import results_file beside them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        import quantization
    for name in ("quantization", "results_file"):  # leave no bench module behind for other tests' imports
        sys.modules.pop(name, None)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # on the CPU it notes every float32 -> float16 cast
    return quantization


@pytest.fixture(scope="module")
def trained(bench, tmp_path_factory):
    """Per architecture, built on first use: (float model, {"training": path, "folded": path}, evaluation batch)."""
    cache = {}

    def get(architecture: str):
        if architecture not in cache:
            model = bench.train_tiny(architecture, steps=20, hidden=HIDDEN)
            batch = bench.windows(bench.tokens(), 4, seed=12345)
            # trained enough that the argmax means something (chance is about 1/30 letters)
            assert bench.accuracy(model, batch)[0] > 0.3
            cache[architecture] = model, bench.write_forms(model, tmp_path_factory.mktemp(architecture)), batch
        return cache[architecture]

    return get


def needs_avx512bf16():
    """Skips where the CPU lacks AVX512-BF16: bitsandbytes' packed 4-bit kernel needs it (it sees it as bitsandbytes
    does)."""
    from bitsandbytes.functional import has_avx512bf16

    return pytest.mark.skipif(not has_avx512bf16(), reason="this CPU has no AVX512-BF16: bitsandbytes' packed "
                                                           "4-bit kernel cannot run here")


def four_bit_path_params():
    """bitsandbytes' two CPU paths for 4-bit layers, as pytest params named after the path: `generic` (any CPU) and
    `avx512bf16` (the packed bfloat16 kernel, where the CPU has the instruction set)."""
    return [pytest.param("generic", id="generic"),
            pytest.param("avx512bf16", id="avx512bf16", marks=needs_avx512bf16())]
