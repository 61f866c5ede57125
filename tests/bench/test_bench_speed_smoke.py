"""The speed and stability benchmarks run end to end at a smoke size (seconds), so the scripts cannot rot; none of
them writes into bench/ here (--no-write, or a RESULTS.md under tmp_path)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    for name in ("inference_speed", "train_step_time", "width_stability", "long_context_memory", "results_file"):
        sys.modules.pop(name, None)


def test_inference_speed_smoke(bench, capsys):
    import inference_speed

    inference_speed.main(["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64", "--prefill-len", "8",
                          "--prompt-len", "4", "--decode-steps", "2", "--batches", "1", "--repeats", "1",
                          "--threads", "1", "--device", "cpu"])
    table = capsys.readouterr().out
    assert "| wall | decode | 1 |" in table and "| cpu | prefill | 1 |" in table


@pytest.mark.slow  # four models compiled by inductor: minutes on 2 cores
def test_inference_speed_compiled_smoke(bench, capsys):
    import inference_speed

    inference_speed.main(["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64", "--prefill-len", "8",
                          "--prompt-len", "4", "--decode-steps", "2", "--batches", "1", "--repeats", "1",
                          "--threads", "1", "--device", "cpu", "--compile"])
    table = capsys.readouterr().out
    decode = next(line for line in table.splitlines() if line.startswith("| wall | decode | 1 |"))
    assert decode.endswith("× |") and "anGPT (folded, eager dynamic cache) tok/s" in table
    assert "batch-1 decode bound:" in table


def test_train_step_time_smoke(bench, capsys):
    import train_step_time

    train_step_time.main(["--device", "cpu", "--hidden", "32", "--layers", "1", "--vocab", "64", "--batch", "2",
                          "--seq", "16", "--rounds", "1", "--warmup", "1", "--ablations", "--no-write"])
    out = capsys.readouterr().out
    assert "| angpt |" in out and "angpt without constraint" in out


def test_width_stability_smoke(bench, capsys):
    import width_stability

    width_stability.main(["--widths", "64", "--layers", "1", "--steps", "2", "--batch", "2", "--seq", "16",
                          "--variants", "baseline", "width_rule", "--device", "cpu", "--no-write"])
    out = capsys.readouterr().out
    assert "| baseline | fp32 | 64 |" in out and "| width_rule | fp32 | 64 |" in out


def test_width_stability_depth_sweep_smoke(bench, capsys):
    import width_stability

    width_stability.main(["--depth-alpha", "2:0.05", "3:0.01", "--widths", "64", "--steps", "2", "--batch", "2",
                          "--seq", "16", "--device", "cpu", "--no-write"])
    out = capsys.readouterr().out
    assert "| 64 | 2 | 0.05 | 0.10 |" in out and "| 64 | 3 | 0.01 | 0.03 |" in out


def test_long_context_memory_smoke(bench, tmp_path, capsys):
    """Each (backend, transform) row measured in its own interpreter, written into the given RESULTS.md; the
    printed rows rebuild the same table without measuring again (--rows-from)."""
    import long_context_memory

    size = ["--length", "512", "--chunk", "128", "--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64",
            "--backends", "angpt_chunked"]
    results = tmp_path / "RESULTS.md"
    rows = long_context_memory.main([*size, "--results", str(results)])
    assert [key for key, _ in rows] == [("angpt_chunked", "alibi"), ("angpt_chunked", "scale_invariant")]
    for _, row in rows:
        assert row["peak_rss_mib"] > 0 and row["seconds"] > 0
        assert row["full_scores_mib"] == 4 * 2 * 512**2 / 2**20  # one [1, h, T, T] float32 tensor
    table = [line for line in results.read_text().splitlines() if line.startswith("| angpt_chunked |")]
    assert [line.split(" | ")[1:3] for line in table] == [["alibi", "512"], ["scale_invariant", "512"]]
    log = tmp_path / "run.log"
    log.write_text(capsys.readouterr().out)  # the rows as the run printed them, then its section (not rows)
    again = long_context_memory.main([*size, "--rows-from", str(log), "--no-write"])
    assert again == rows
