"""`angpt compare` (training/compare.py) on an anGPT and a GPT+ run of the tour recipe: the token ratio recomputed
from the two metrics.jsonl files independently, the figure and the Markdown table, the refusals."""
import json
import re
import shutil

import numpy as np
import pytest
from cli_helpers import angpt, assert_one_line_error
from training_fixtures import REPO, data_cache, single_thread  # noqa: F401 (fixtures)

from modeling_angpt.training import load_recipe, train

TOUR = REPO / "configuration" / "recipes" / "tour_cpu.yaml"


@pytest.fixture(scope="module")
def tour_runs(tmp_path_factory, data_cache):
    """GPT+ first (the reference), then anGPT, each the tour recipe as it ships, with a fresh output_dir."""
    root = tmp_path_factory.mktemp("tour")
    runs = []
    for architecture in ("gptplus", "angpt"):
        out = root / architecture
        train(load_recipe(TOUR, [f"architecture={architecture}", f"output_dir={out}", f"data_cache_dir={data_cache}",
                                 "report_to=[jsonl]", "disable_tqdm=true"]))
        runs.append(out)
    return runs


def _validation_curve(run) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, loss) of the evaluations: tokens from the step and the recipe's batch shape (one process)."""
    recipe = json.loads((run / "recipe.json").read_text())
    per_step = recipe["per_device_train_batch_size"] * recipe["block_size"] * recipe["gradient_accumulation_steps"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps, losses = zip(*[(r["step"], r["val_loss"]) for r in rows if "val_loss" in r])
    return np.array(steps) * per_step, np.array(losses)


def _tokens_to(tokens, losses, target) -> float:
    first = int(np.argmax(losses <= target))  # the first evaluation at or below the target
    assert losses[first] <= target
    if first == 0:
        return float(tokens[0])
    # the loss falls linearly between the two evaluations around the crossing: np.interp on the falling segment
    return float(np.interp(target, losses[first - 1:first + 1][::-1], tokens[first - 1:first + 1][::-1]))


def test_the_token_ratio_is_the_one_the_metrics_give(tour_runs, tmp_path):
    curves = [_validation_curve(run) for run in tour_runs]
    target = max(losses[-1] for _, losses in curves)  # the default: the highest final validation loss
    reached = [_tokens_to(tokens, losses, target) for tokens, losses in curves]
    ratio = reached[0] / reached[1]

    output = tmp_path / "figures" / "tour.png"
    proc = angpt("compare", *tour_runs, "--output", output)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = output.with_suffix(".md").read_text()
    assert table in proc.stdout  # printed and written beside the figure
    assert f"Target validation loss: {target:.4f}" in table
    gptplus_row, angpt_row = [line for line in table.splitlines() if line.startswith("| gptplus") or
                              line.startswith("| angpt")]
    assert f"| {curves[1][1][-1]:.4f} | {reached[1]:,.0f} | {ratio:.2f}× |" in angpt_row, angpt_row
    assert f"| {reached[0]:,.0f} | 1.00× | – |" in gptplus_row, gptplus_row  # GPT+ logs no norms
    assert re.search(r"‖h‖ mean \d\.\d{3}, max \d\.\d{3}; branch outputs: ‖x_A‖ mean \d+\.\d\d, ‖x_M‖ mean "
                     r"\d+\.\d\d \|$", angpt_row)  # anGPT's, from its last evaluation
    assert output.stat().st_size > 20_000  # two panels: the losses and anGPT's norms

    proc = angpt("compare", *tour_runs, "--output", tmp_path / "target.png", "--target-loss", "5.5", "--log-tokens")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Target validation loss: 5.5000" in proc.stdout


def _copy_with(run, tmp_path, name, **recipe_changes):
    copy = tmp_path / name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("final", "checkpoints"))
    recipe = json.loads((copy / "recipe.json").read_text())
    recipe.update(recipe_changes)
    (copy / "recipe.json").write_text(json.dumps(recipe))
    return copy


def test_labels_name_the_keys_in_which_runs_differ(tour_runs, tmp_path):
    other = _copy_with(tour_runs[1], tmp_path, "angpt-lr", learning_rate=0.008)
    proc = angpt("compare", tour_runs[1], other, "--output", tmp_path / "lr.png")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| angpt (learning_rate=0.004) `" in proc.stdout and "| angpt (learning_rate=0.008) `" in proc.stdout


@pytest.mark.parametrize("changes, expected", [
    ({"tokenizer_vocab_size": 1024}, "runs with different tokenizers do not compare (tokenizer_vocab_size: 512 in"),
    ({"data_seed": 7}, "runs with different validation sets do not compare (data_seed: 1234 in"),
    ({"eval_max_batches": 4}, "runs with different validation sets do not compare (scored_validation_blocks: 64 in"),
])
def test_runs_whose_losses_do_not_compare_are_refused_in_one_line(changes, expected, tour_runs, tmp_path):
    other = _copy_with(tour_runs[1], tmp_path, "other", **changes)
    assert_one_line_error(angpt("compare", tour_runs[0], other, "--output", tmp_path / "x.png"),
                          "angpt compare: error:", expected)
    assert not (tmp_path / "x.png").exists()


def test_bad_arguments_are_one_line(tour_runs, tmp_path):
    assert_one_line_error(angpt("compare", *tour_runs, "--output", tmp_path / "x.pdf"), "expected a .png")
    assert_one_line_error(angpt("compare", tour_runs[0], tmp_path / "nowhere"), "run directory not found")
    assert_one_line_error(angpt("compare", tour_runs[0], tmp_path), "is not a training run directory (no recipe.json)")
