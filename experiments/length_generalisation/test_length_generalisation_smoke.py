"""length_generalisation.py: its position bins, its evaluation text options and its parallel jobs, at a smoke size
(the run end to end with the needle experiment: experiments/needle/test_needle_smoke.py). Every output goes under
tmp_path, never into the study folder."""
from __future__ import annotations

import json

import numpy as np
import pytest
from experiments.smoke_arguments import TINY


def test_position_bins_average_the_target_positions_they_name(experiment):
    """The by-position table's bins against positions counted directly: entry j of the evaluator's curve is the
    token at position j + 1, so a curve whose value is that position averages to the middle of each bin."""
    import length_generalisation

    length = 8
    curve = np.arange(1, 16 * length, dtype=np.float64)  # positions 1 … 16L − 1
    bins = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16))
    expected = [np.mean(np.arange(max(a * length, 1), b * length)) for a, b in bins]
    assert length_generalisation.binned(curve, length) == pytest.approx(expected)
    assert len(length_generalisation.binned(curve[:4 * length - 1], length)) == 3  # a 4L window: bins up to 4L
    holes = curve.copy()
    holes[length - 1::length] = np.nan  # the positions that start a 1x window: left out of their bin's mean
    kept = [np.mean([t for t in range(max(a * length, 1), b * length) if t % length]) for a, b in bins]
    assert length_generalisation.binned(holes, length) == pytest.approx(kept)


def test_length_generalisation_eval_corpus_options(experiment, tmp_path):
    """--eval-corpus blocks keeps the earlier evaluation (validation blocks, training on --dataset itself);
    --eval-corpus FILE evaluates on FILE; a checkpoint trained on other data or for other steps is refused in one
    line, neither reused nor overwritten."""
    out, results, corpus, recipe = experiment
    import length_generalisation

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "1", "--variants", "NoPE", "--windows", "1",
              "--dataset", str(corpus), "--recipe", str(recipe), "--output-dir", str(tmp_path / "runs")]
    length_generalisation.main([*models, "--eval-corpus", "blocks", *out])
    trained = json.loads((tmp_path / "runs" / "nope-s0" / "final" / "training_metadata.json").read_text())
    assert trained["recipe"]["dataset"] == str(corpus)
    evaluated = json.loads((tmp_path / "runs" / "nope-s0" / "length_eval" / "length.json").read_text())
    assert evaluated["source"].startswith("validation split of")
    assert "`--eval-corpus blocks`" in results.read_text()
    length_generalisation.main([*models, "--eval-corpus", str(corpus), *out])
    evaluated = json.loads((tmp_path / "runs" / "nope-s0" / "length_eval" / "length.json").read_text())
    assert evaluated["source"].startswith(str(corpus))
    with pytest.raises(SystemExit, match="was trained with dataset"):
        length_generalisation.main([*models, *out])  # heldout trains on the split, not on corpus itself
    longer = [*models[:models.index("--steps")], "--steps", "2", *models[models.index("--steps") + 2:]]
    with pytest.raises(SystemExit, match=r"max_steps 1 \(this run: 2\); use another --output-dir"):
        length_generalisation.main([*longer, "--eval-corpus", "blocks", *out])  # not adopted as a 2-step model
    assert json.loads((tmp_path / "runs" / "nope-s0" / "final" / "training_metadata.json").read_text()) == trained


def test_length_generalisation_jobs_train_the_same_models_as_one_job(experiment, tmp_path):
    """--jobs 2 trains and evaluates the models in two spawned processes; the losses are those of one process."""
    out, results, corpus, recipe = experiment
    import length_generalisation

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "1", "--variants", "RoPE", "NoPE", "--windows",
              "1", "--eval-corpus", "blocks", "--dataset", str(corpus), "--recipe", str(recipe)]
    for jobs in ("1", "2"):
        length_generalisation.main([*models, "--jobs", jobs, "--output-dir", str(tmp_path / f"jobs{jobs}"), *out])
    for variant in ("rope", "nope"):
        one, two = (json.loads((tmp_path / f"jobs{j}" / f"{variant}-s0" / "length_eval" / "summary.json").read_text())
                    for j in ("1", "2"))
        assert one["loss"] == two["loss"]
    assert "| NoPE |" in results.read_text()
    with pytest.raises(SystemExit, match="--jobs 0: expected a positive integer"):
        length_generalisation.main([*models, "--jobs", "0", *out])


