"""The α·L sweep and the default-α check run end to end at a smoke size (seconds), so the script cannot rot: the
bisection's order, a failing level stopping its seeds early, the records a rerun resumes from, and the config without
alpha_init getting the library's default. Outputs go under tmp_path, never into the study folder."""
from __future__ import annotations

import json

import pytest

from modeling_angpt.architectures_angpt import ALPHA_DEPTH_LIMIT


def smoke_args(experiment, tmp_path, *extra: str, override: tuple[str, ...] = ()) -> list[str]:
    out, _, corpus, recipe = experiment
    return ["--layers", "2", "--hidden", "32", "--heads", "2", "--steps", "2", "--seeds", "2", "--recipe", str(recipe),
            "--override", f"dataset={corpus}", "tokenizer_vocab_size=300", "block_size=32",
            "per_device_train_batch_size=4", *override, *extra, *out[:2]]  # --results (the sweep draws no plot)


def records(path) -> list[dict]:
    return [json.loads(line) for line in (path / "records.jsonl").read_text().splitlines()]


def test_sweep_bisects_and_resumes(experiment, tmp_path, monkeypatch):
    _, results, _, _ = experiment
    import deep_alpha

    args = smoke_args(experiment, tmp_path, "--levels", "0.02", "0.04", "0.08", "--output-dir", str(tmp_path / "ok"))
    deep_alpha.main(args)
    # every seed clean: the bisection goes up from the middle level and never needs the lowest
    assert sorted({r["alpha_init"] * 2 for r in records(tmp_path / "ok")}) == pytest.approx([0.04, 0.08])
    text = results.read_text()
    assert "<!-- deep_alpha_sweep:start -->" in text and "| 0.08 | 0.04 | 2 of 2 | — | 0 |" in text
    assert "Largest level with 2 of 2 seeds clean: α·L = 0.08." in text
    # a rerun finds every run recorded and trains nothing
    monkeypatch.setattr(deep_alpha, "run_one", lambda spec, cfg: pytest.fail(f"retrained {spec}"))
    deep_alpha.main(args)
    # --report writes what the records hold and trains nothing, not even where they decide nothing
    deep_alpha.main(smoke_args(experiment, tmp_path, "--report", "--output-dir", str(tmp_path / "empty")))
    assert "Undecided: α·L = 0.16, 0 of 2 seeds run" in results.read_text()
    monkeypatch.undo()
    # every run failing (a criterion no run can meet: the largest loss is at least the first): each level fails at
    # its first seed, whose second seed never starts, and the bisection goes down and never needs the highest level
    monkeypatch.setattr(deep_alpha, "SPIKE", 0.5)
    deep_alpha.main(smoke_args(experiment, tmp_path, "--levels", "0.02", "0.04", "0.08", "--output-dir",
                               str(tmp_path / "bad")))
    runs = records(tmp_path / "bad")
    assert [(round(r["alpha_init"] * 2, 6), r["seed"], r["clean"]) for r in runs] == [(0.04, 0, False),
                                                                                      (0.02, 0, False)]
    assert "No level had every seed clean" in results.read_text()
    assert "| 0.02 | 0.01 | 0 of 1 | seed 0: 1.00× at step 1 | 1 | — |" in results.read_text()


def test_check_default_trains_the_config_without_alpha_init(experiment, tmp_path):
    _, results, _, _ = experiment
    import deep_alpha

    deep_alpha.main(smoke_args(experiment, tmp_path, "--check-default", "--layers", "12", "--seeds", "1",
                               "--output-dir", str(tmp_path / "default")))
    (run,) = records(tmp_path / "default")
    assert run["alpha_init"] is None
    assert run["alpha_init_used"] == pytest.approx(ALPHA_DEPTH_LIMIT / 12)  # the depth rule
    text = results.read_text()
    assert "<!-- deep_alpha_default:start -->" in text
    assert f"gets α init {ALPHA_DEPTH_LIMIT / 12:.6g} (α·L = {ALPHA_DEPTH_LIMIT:.3g})" in text
    assert "| 0 | yes |" in text or "| 0 | non-finite" in text


def test_bad_arguments_name_the_argument(experiment, tmp_path, capsys):
    import deep_alpha

    for flags, words in ((["--seeds", "0"], "--seeds must be at least 1, got 0"),
                         (["--levels", "0.1", "-0.2"], "--levels must be positive numbers, got 0.1 -0.2")):
        with pytest.raises(SystemExit):
            deep_alpha.main(smoke_args(experiment, tmp_path, *flags, "--output-dir", str(tmp_path / "runs")))
        assert words in capsys.readouterr().err
