"""The experiments' smoke sizes, shared by their tests (experiments/*/test_*.py, which import it as
experiments.smoke_arguments): tiny models, a few steps, one window, every output under the test's tmp_path. The fixture that provides the corpus and recipe is `experiment`
(experiments/conftest.py)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "300", "--threads", "1"]


def tiny_length_models(experiment, tmp_path, *variants: str) -> list[str]:
    """The length scripts' arguments for tiny models of `variants`: L = 256, two steps, one window, under tmp_path."""
    _, _, corpus, recipe = experiment
    return [*TINY, "--length", "256", "--batch", "2", "--steps", "2", "--variants", *variants, "--dataset", str(corpus),
            "--recipe", str(recipe), "--output-dir", str(tmp_path / "runs"), "--windows", "1"]


def needle_recipe(tmp_path) -> Path:
    """The shipped needle recipe's keys at a smoke size."""
    recipe = tmp_path / "needle.yaml"
    recipe.write_text((REPO / "configuration/recipes/needle_finetune.yaml").read_text()
                      + "\nneedle_examples: 16\nbf16: false\n")
    return recipe
