"""A semantic-focus run continues from the state it saved after its last epoch (resume.pt): stopped part-way, or
finished and given a larger budget, it ends with the history an uninterrupted run has. The oracle is that
uninterrupted run; dropout is on, so the RNG state must come back as well as the weights and the data order."""
from __future__ import annotations

import json

import pytest

SMALL = dict(n_train=50, n_heldout=20, model=dict(num_layers=1, attention_sparsity="topk"), tensorboard=False,
             save_model=False)


class Stop(Exception):
    pass


def quiet(line):
    pass


def stop_at_epoch(epoch: int):
    def log(line):
        if f"epoch {epoch}/" in line:
            raise Stop  # before the epoch is written: the run dies with epoch - 1 epochs saved
    return log


def run_parity(out, log=quiet, **settings):
    """One protocol run on parity at SMALL sizes; `settings` as ProtocolSettings' fields."""
    from modeling_angpt.evaluation.semantic_focus import ProtocolSettings, run_protocol

    return run_protocol(ProtocolSettings("parity", out, **{**SMALL, **settings}), log=log)


def without_time(history):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


@pytest.mark.parametrize("backbone", ["paper", "library"])
def test_a_stopped_or_extended_run_matches_an_uninterrupted_one(tmp_path, backbone):

    whole = run_parity(tmp_path / "whole", epochs=4, backbone=backbone)

    with pytest.raises(Stop):
        run_parity(tmp_path / "stopped", epochs=4, backbone=backbone, log=stop_at_epoch(3))
    assert len((tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()) == 2
    resumed = run_parity(tmp_path / "stopped", epochs=4, backbone=backbone, resume=True)

    run_parity(tmp_path / "extended", epochs=2, backbone=backbone)
    extended = run_parity(tmp_path / "extended", epochs=4, backbone=backbone, resume=True)

    for run, name in ((resumed, "stopped"), (extended, "extended")):
        assert without_time(run["history"]) == without_time(whole["history"]), name
        assert run["epochs_run"] == 4 and run["epochs_budget"] == 4
        logged = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert without_time(logged) == without_time(whole["history"])
        assert json.loads((tmp_path / name / "summary.json").read_text())["epochs_run"] == 4


def test_a_run_killed_before_its_first_saved_state_starts_again_and_no_later_one_does(tmp_path):
    """Killed between logging epoch 1 and saving the state after it, a run has one metrics line and no resume.pt:
    resuming it trains it from the start (the uninterrupted run is the oracle). Two lines without a resume.pt
    mean the state was removed: refused, the lines kept."""
    from modeling_angpt.evaluation.semantic_focus.protocol import OutputExistsError

    whole = run_parity(tmp_path / "whole", epochs=2, backbone="paper")
    for name, dies_at in (("first", 2), ("later", 3)):
        with pytest.raises(Stop):
            run_parity(tmp_path / name, epochs=2 if name == "first" else 3, backbone="paper", log=stop_at_epoch(dies_at))
        (tmp_path / name / "resume.pt").unlink()

    with pytest.raises(OutputExistsError, match="seed: 0 there, 1 here"):  # another run is not started in its place
        run_parity(tmp_path / "first", epochs=2, seed=1, backbone="paper", resume=True)
    again = run_parity(tmp_path / "first", epochs=2, backbone="paper", resume=True)
    logged = [json.loads(line) for line in (tmp_path / "first" / "metrics.jsonl").read_text().splitlines()]
    assert without_time(again["history"]) == without_time(logged) == without_time(whole["history"])

    metrics = (tmp_path / "later" / "metrics.jsonl").read_text()
    with pytest.raises(OutputExistsError, match="no resume.pt"):
        run_parity(tmp_path / "later", epochs=3, backbone="paper", resume=True)
    assert (tmp_path / "later" / "metrics.jsonl").read_text() == metrics and len(metrics.splitlines()) == 2


def test_resume_refuses_another_runs_settings_and_a_run_without_state(tmp_path):
    from modeling_angpt.evaluation.semantic_focus.protocol import OutputExistsError

    out = tmp_path / "run"
    run_parity(out, epochs=2, backbone="paper")
    metrics = (out / "metrics.jsonl").read_text()
    with pytest.raises(OutputExistsError, match="resume it or choose another"):
        run_parity(out, epochs=3, backbone="paper")
    with pytest.raises(OutputExistsError, match="seed: 0 there, 1 here"):
        run_parity(out, epochs=3, seed=1, backbone="paper", resume=True)
    with pytest.raises(OutputExistsError, match="2 epochs, more than epochs=1"):
        run_parity(out, epochs=1, backbone="paper", resume=True)
    (out / "resume.pt").unlink()
    with pytest.raises(OutputExistsError, match="no resume.pt"):
        run_parity(out, epochs=3, backbone="paper", resume=True)
    assert (out / "metrics.jsonl").read_text() == metrics  # nothing of the refused runs was written

    fresh = run_parity(tmp_path / "empty", epochs=1, backbone="paper", resume=True)
    assert fresh["epochs_run"] == 1  # nothing to resume: a new run


def test_command_resumes_with_the_flag_and_says_so_without_it(tmp_path, capsys):
    from modeling_angpt.cli import main

    out = tmp_path / "run"
    argv = ["semantic-focus", "--backbone", "paper", "--task", "parity", "--n-train", "30", "--n-heldout", "10",
            "--num-layers", "1", "--output-dir", str(out), "--no-tensorboard", "--threads", "1"]
    assert main([*argv, "--epochs", "1"]) == 0
    assert main([*argv, "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--resume" in err and str(out) in err
    assert main([*argv, "--epochs", "2", "--resume"]) == 0
    assert [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert main([*argv, "--epochs", "2", "--resume", "--seed", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "seed: 0 there, 3 here" in err


def test_a_run_cut_at_its_deadline_is_saved_and_resumes_to_the_uninterrupted_history(tmp_path):
    import time


    whole = run_parity(tmp_path / "whole", epochs=3, backbone="paper", deadline=time.time() + 3600)
    assert whole["epochs_run"] == 3 and not whole["stopped_at_deadline"]
    cut = run_parity(tmp_path / "cut", epochs=3, backbone="paper", deadline=time.time())
    assert cut["epochs_run"] == 1 and cut["stopped_at_deadline"]  # one epoch always runs
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["stopped_at_deadline"] is True
    resumed = run_parity(tmp_path / "cut", epochs=3, backbone="paper", resume=True)
    assert not resumed["stopped_at_deadline"]
    assert without_time(resumed["history"]) == without_time(whole["history"])


def test_command_time_limit_cuts_the_run_says_so_and_refuses_a_non_positive_one(tmp_path, capsys):
    from modeling_angpt.cli import main

    out = tmp_path / "run"
    argv = ["semantic-focus", "--backbone", "paper", "--task", "parity", "--n-train", "30", "--n-heldout", "10",
            "--num-layers", "1", "--output-dir", str(out), "--no-tensorboard", "--threads", "1", "--epochs", "2"]
    assert main([*argv, "--time-limit", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--time-limit 0" in err and "positive" in err
    assert not out.exists()
    assert main([*argv, "--time-limit", "0.000001"]) == 0
    assert "1 epochs (stopped at --time-limit; --resume continues it)" in capsys.readouterr().out
    assert main([*argv, "--resume"]) == 0
    assert [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


