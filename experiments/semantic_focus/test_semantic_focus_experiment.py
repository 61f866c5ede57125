"""experiments/semantic_focus/semantic_focus.py at smoke sizes, with the library's backbone and the paper's encoder:
its sections and plots, reused and extended runs, later seeds alone, the time limit, and its one-line refusals.
The protocol itself is tested with the library (tests/evaluation/test_semantic_focus*.py)."""
from __future__ import annotations

import pytest


@pytest.fixture
def script(experiment):
    """semantic_focus.py imported, its outputs under tmp_path."""
    import semantic_focus

    return semantic_focus


def without_time(history):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


def test_experiment_runs_end_to_end_at_smoke_size(tmp_path, script):
    result = script.main(["--smoke", "--no-write", "--jobs", "1", "--output-dir", str(tmp_path)])
    assert len(result["runs"]) == 3 * 4
    for variant in ("full", "topk", "window", "block"):
        assert f"| listops | {variant} |" in result["section"]
    assert (tmp_path / "semantic_focus_smoke.png").exists() and (tmp_path / "runs.json").exists()


def test_experiment_with_the_paper_backbone(tmp_path, script):
    result = script.main(["--smoke", "--backbone", "paper", "--no-write", "--jobs", "1", "--threads",
                          "1", "--output-dir", str(tmp_path / "runs")])
    assert len(result["runs"]) == 3 * 4 and {run["backbone"] for run in result["runs"]} == {"paper"}
    assert "paper backbone" in result["section"] and "sinusoidal" in result["section"]
    assert (tmp_path / "runs" / "semantic_focus_smoke_paper_encoder.png").exists()


def test_experiment_writes_a_named_section_beside_the_others_and_reuses_finished_runs(tmp_path, script):
    results = tmp_path / "README.md"
    results.write_text("# Semantic focus\n\n<!-- semantic_focus_smoke:start -->\nEven Pairs, kept\n"
                       "<!-- semantic_focus_smoke:end -->\n")
    argv = ["--smoke", "--tasks", "parity", "--variants", "full,topk", "--jobs", "1", "--threads", "1",
            "--section", "semantic_focus_smoke_parity", "--results", str(results), "--plots-dir",
            str(tmp_path / "plots"), "--output-dir", str(tmp_path / "runs")]
    first = script.main(argv)
    assert not any(run["reused"] for run in first["runs"]) and "reused" not in first["section"]
    assert "## Semantic focus: full vs top-k attention on parity (smoke profile" in first["section"]
    again = script.main(argv)
    assert all(run["reused"] for run in again["runs"])
    assert "2 of the runs reused from earlier invocations" in again["section"]
    assert again["table"] == first["table"]
    text = results.read_text()
    assert "Even Pairs, kept" in text and text.count("<!-- semantic_focus_smoke_parity:start -->") == 1
    assert (tmp_path / "plots" / "semantic_focus_smoke_parity.png").exists()
    assert "](plots/semantic_focus_smoke_parity.png)" in again["section"]  # relative to the --results page given


def test_experiment_refuses_unknown_tasks_and_variants_in_one_line(tmp_path, capsys, script):
    for argv, expected in ((["--tasks", "even_pairs,cycle_navigation"], "--tasks: unknown cycle_navigation"),
                           (["--variants", "full,dense"], "--variants: unknown dense"),
                           (["--section", "throughput"], "--section: expected a name like semantic_focus_parity")):
        with pytest.raises(SystemExit) as stopped:
            script.main(["--smoke", "--no-write", "--output-dir", str(tmp_path / "never"), *argv])
        assert stopped.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert expected in error and "Traceback" not in error
    assert not (tmp_path / "never").exists()


def test_experiment_runs_missing_duplicates_on_request_at_the_papers_budget(tmp_path, script):
    # the default task list is the reproduction's three; Missing Duplicates runs when named, with its paper budget
    assert "missing_duplicates" not in script.DEFAULT_TASKS
    result = script.main(["--smoke", "--backbone", "paper", "--tasks", "missing_duplicates",
                          "--variants", "full,topk", "--no-write", "--jobs", "1", "--threads", "1",
                          "--output-dir", str(tmp_path)])
    assert [(run["task"], run["variant"]) for run in result["runs"]] == [("missing_duplicates", "full"),
                                                                          ("missing_duplicates", "topk")]
    assert all(run["epochs_run"] == 1 for run in result["runs"])
    assert "| missing_duplicates | 40 / 20 | 40 | 1 (250) | 1 |" in result["section"]
    assert "| missing_duplicates | topk |" in result["section"] and "- missing_duplicates: " in result["section"]


def test_experiment_extends_finished_runs_to_a_larger_budget(tmp_path, capsys, script):
    argv = ["--smoke", "--tasks", "parity", "--variants", "full", "--jobs", "1", "--threads", "1", "--no-write",
            "--output-dir", str(tmp_path / "runs")]
    first = script.main([*argv, "--epochs", "1"])
    longer = script.main([*argv, "--epochs", "2"])
    assert not any(run["reused"] for run in longer["runs"])
    assert [row["epoch"] for row in longer["runs"][0]["history"]] == [1, 2]
    assert without_time(longer["runs"][0]["history"][:1]) == without_time(first["runs"][0]["history"])
    again = script.main([*argv, "--epochs", "2"])
    assert all(run["reused"] for run in again["runs"])

    (tmp_path / "runs" / "parity" / "full" / "seed0" / "resume.pt").unlink()
    with pytest.raises(SystemExit) as refused:
        script.main([*argv, "--epochs", "3"])
    message = str(refused.value.code)
    assert message.count("\n") == 0 and "without resume.pt" in message and "--epochs 3" in message


def test_experiment_runs_a_later_seed_alone_into_its_own_directory(tmp_path, script):
    """--first-seed 1 --seeds 1: seed 1 alone, the same run (and directory) as seed 1 of --seeds 2."""
    argv = ["--smoke", "--tasks", "parity", "--variants", "full", "--jobs", "1", "--threads", "1", "--no-write",
            "--epochs", "1"]
    both = script.main([*argv, "--seeds", "2", "--output-dir", str(tmp_path / "both")])
    later = script.main([*argv, "--seeds", "1", "--first-seed", "1", "--output-dir", str(tmp_path / "later")])
    assert [run["seed"] for run in later["runs"]] == [1]
    assert sorted(p.name for p in (tmp_path / "later" / "parity" / "full").iterdir()) == ["seed1"]
    assert without_time(later["runs"][0]["history"]) == without_time(both["runs"][1]["history"])
    assert "| parity | 40 / 20 | 40 | 1 (1000) | seed 1 |" in later["section"]
    assert later["section"].startswith("## Semantic focus: full attention, seed 1 (smoke profile, library backbone)")


def test_experiment_time_limit_names_the_cut_runs_and_the_same_command_continues_them(tmp_path, capsys, script):
    argv = ["--smoke", "--tasks", "parity", "--variants", "full,topk", "--jobs", "1", "--threads", "1", "--no-write",
            "--epochs", "3", "--stop-at", "0"]
    whole = script.main([*argv, "--output-dir", str(tmp_path / "whole")])
    cut = script.main([*argv, "--output-dir", str(tmp_path / "cut"), "--time-limit", "0.000001"])
    assert [run["epochs_run"] for run in cut["runs"]] == [1, 1]
    assert ("Stopped by `--time-limit 1e-06` before their budget (the same command continues them): parity full "
            "seed 0 after 1 epochs; parity topk seed 0 after 1 epochs.") in cut["section"]
    if not any(run["epochs_to_95"] for run in cut["runs"]):
        assert "| parity | full | >1 | – |" in cut["section"]
        assert "within 1 epochs: no verdict (budget 3, cut by --time-limit); training loss at epoch 1" in cut["section"]
    continued = script.main([*argv, "--output-dir", str(tmp_path / "cut")])
    assert not any(run["reused"] or run["stopped_at_deadline"] for run in continued["runs"])
    assert "Stopped by" not in continued["section"]
    assert ("(2 continued from an earlier invocation after 1 and 1 epochs; the epochs of both took"
            in continued["section"])
    for run, oracle in zip(continued["runs"], whole["runs"]):
        assert without_time(run["history"]) == without_time(oracle["history"])
    with pytest.raises(SystemExit):
        script.main([*argv, "--output-dir", str(tmp_path / "cut"), "--time-limit", "-1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--time-limit -1: expected a positive number of minutes" in err


def test_run_time_line_counts_the_runs_in_words(script):
    def run(earlier, *seconds):
        return {"reused": False, "epochs_earlier": earlier, "history": [{"seconds": s} for s in seconds]}

    assert script._run_time([run(0, 1.0)]) == ""
    assert script._run_time([run(4, 60.0, 120.0)]) == (
        " (1 continued from an earlier invocation after 4 epochs; its epochs took 3 min of run time, "
        "median 90.0 s per epoch)")
    three = script._run_time([run(1, 60.0), run(2, 60.0), run(0, 60.0)])
    assert "2 continued from an earlier invocation after 1 and 2 epochs; the epochs of all 3 took 3 min" in three


def test_experiment_names_the_gpu_of_a_cuda_run(monkeypatch, script):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Some GPU")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert script.machine("cuda").startswith("Some GPU (CUDA 13.0) with ")
    assert "Some GPU" not in script.machine("cpu")
