"""report_to's names and errors (training/trackers.py); the round trip through each tracker's own reader is
tests/tools/test_tracker_round_trip.py."""
import pytest
from cli_helpers import angpt, assert_one_line_error
from training_fixtures import data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt.training.trackers import ACCELERATE_TRACKERS, TRACKER_PACKAGES, flat_config


def test_the_tracker_names_are_accelerates():
    from accelerate.utils import LoggerType

    assert set(ACCELERATE_TRACKERS) == {t.value for t in LoggerType} - {"all"}


def test_an_unknown_tracker_is_one_line_listing_the_known_ones(write_recipe, tmp_path):
    proc = angpt("train", write_recipe(), "--override", "report_to=[jsonl,tensorbord]")
    assert_one_line_error(proc, "recipe key report_to has unknown entries ['tensorbord']", "tensorboard, wandb")
    assert not (tmp_path / "run").exists()


def test_a_tracker_that_is_not_installed_names_the_package(write_recipe, tmp_path):
    """With the first tracker Accelerate supports that is not installed here ([dev] installs four of the nine)."""
    from accelerate.utils import imports

    missing = [name for name in ACCELERATE_TRACKERS if not getattr(imports, f"is_{name}_available")()]
    if not missing:
        pytest.skip("every tracker Accelerate supports is installed here: none is left to be refused")
    name = missing[0]
    proc = angpt("train", write_recipe(), "--override", f"report_to=[jsonl,{name}]")
    package = TRACKER_PACKAGES.get(name, name)
    assert_one_line_error(proc, f"report_to names {name!r}, which is not installed; pip install {package}")
    assert not (tmp_path / "run").exists()  # refused before the run directory was touched


def test_the_recipe_becomes_flat_hyperparameters():
    flat = flat_config({"learning_rate": 0.004, "report_to": ["jsonl", "wandb"], "warmup_ratio": None,
                        "model_kwargs": {"hidden_size": 64, "rope": {"theta": 1e4}}})
    assert flat == {"learning_rate": 0.004, "report_to": "jsonl,wandb", "warmup_ratio": None,
                    "model_kwargs.hidden_size": 64, "model_kwargs.rope.theta": 1e4}


def test_a_tracker_that_cannot_start_is_one_line_and_leaves_no_run(write_recipe, tmp_path):
    pytest.importorskip("wandb")
    env = {"WANDB_MODE": "online", "WANDB_API_KEY": "", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
           "NETRC": str(tmp_path / "no-netrc")}  # no login anywhere wandb looks
    proc = angpt("train", write_recipe(max_steps=2, eval_steps=0), "--override", "report_to=[jsonl,wandb]", **env)
    # The trackers start after the data is built, whose progress bars may come first on stderr.
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("angpt train: error: recipe key report_to: the trackers ['wandb'] could not start ("), last
    assert "wandb login" in last
    assert not (tmp_path / "run").exists()  # no recipe.json left behind: the same command may simply run again


def test_a_resumed_log_keeps_the_lines_up_to_its_step_and_drops_a_line_cut_by_a_kill(tmp_path):
    from modeling_angpt.training.metrics import MetricsLogger

    lines = ['{"step": 10, "loss": 2.0}', '{"step": 20, "loss": 1.5}', '{"step": 30, "loss": 1.2}', '{"step": 40, "lo']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    logged = []
    logger = MetricsLogger(tmp_path, ["jsonl"], enabled=True, resume_step=20, log=lambda v, step: logged.append(step))
    logger.log(30, loss=1.25)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == [*lines[:2], '{"step": 30, "loss": 1.25}']
    assert logged == [30]
