"""The speed and memory benchmarks run end to end at a smoke size (seconds), so the scripts cannot rot; none of
them writes into docs/results/ here (--no-write, or a results page under tmp_path). Every bench script runs from the
command line with a --help that stands alone."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from script_checks import check_help_descriptions, check_run_from_the_command_line, scripts

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = ["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "300", "--threads", "1"]


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """The output arguments of a benchmark that writes: its results page and plots under tmp_path."""
    monkeypatch.syspath_prepend(str(BENCH))
    threads = torch.get_num_threads()
    yield ["--results", str(tmp_path / "benchmarks.md"), "--plots-dir", str(tmp_path / "plots")]
    torch.set_num_threads(threads)
    for name in [name for name, module in sys.modules.items()  # every module imported from bench/
                 if Path(getattr(module, "__file__", None) or "/").parent == BENCH]:
        sys.modules.pop(name)


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


@pytest.mark.slow  # one interpreter per measured row: about 12 s of make test's 4 minutes (make bench runs the script)
def test_long_context_memory_smoke(bench, tmp_path, capsys):
    """Each (backend, transform) row measured in its own interpreter, written into the given results page; the
    printed rows rebuild the same table without measuring again (--rows-from)."""
    import long_context_memory

    size = ["--length", "512", "--chunk", "128", "--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64",
            "--backends", "angpt_chunked"]
    results = tmp_path / "benchmarks.md"
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


@pytest.mark.parametrize("bf16_ratio, precision", [(None, "bf16 autocast"), (0.01, "float32 (`--precision auto`")])
def test_throughput_smoke(bench, tmp_path, monkeypatch, bf16_ratio, precision):
    """--precision auto: bf16 autocast where the CPU has native bfloat16, float32 (named) where it has not."""
    out, results = bench, tmp_path / "benchmarks.md"
    import throughput

    from modeling_angpt.training import metrics

    monkeypatch.setattr(metrics, "cpu_lacks_native_bf16", lambda: bf16_ratio)
    throughput.main([*TINY, "--vocab", "256", "--batch", "2", "--seq", "16", "--rounds", "1", "--warmup", "1",
                     "--peak-size", "128", "--modes", "eager", *out])
    text = results.read_text()
    assert "| llama | eager |" in text and "MFU" in text
    assert f"tokens per step, {precision}" in text
    assert f" ({torch.backends.cpu.get_cpu_capability()}), " in text  # the machine line names the CPU's kernels
    assert (tmp_path / "plots" / "throughput.png").is_file()


def test_long_context_speed_smoke(bench, tmp_path):
    """Every (transform, sparsity) row on the backends that compute it, each agreeing with the chunked eager math."""
    out, results = bench, tmp_path / "benchmarks.md"
    import long_context_speed

    rows = long_context_speed.main(["--device", "cpu", "--length", "48", "--hidden", "32", "--layers", "1",
                                    "--heads", "2", "--vocab", "97", "--chunk", "16", "--window", "8", "--repeats",
                                    "1", "--backends", "angpt_chunked", "sdpa", *out])
    ran = {key for key, _ in rows}
    assert ("alibi", "none", "sdpa") in ran and ("scale_invariant", "window", "angpt_chunked") in ran
    assert ("scale_invariant", "none", "sdpa") not in ran  # not an additive bias: SDPA cannot compute it
    assert all(row["error"] < 1e-5 for (_, _, backend), row in rows if backend == "sdpa")
    text = results.read_text()
    assert "<!-- long_context_speed_cpu:start -->" in text and "| alibi | none | sdpa |" in text


def test_bench_help_opens_with_whole_sentences_that_stand_alone(bench):
    found = scripts(BENCH)
    assert len(found) >= 5
    check_help_descriptions(found)


# one interpreter per script, all at once: with the docs' commands (make test-docs), out of make test's 4 minutes
@pytest.mark.docs_commands
def test_bench_scripts_run_from_the_command_line():
    check_run_from_the_command_line(scripts(BENCH))
