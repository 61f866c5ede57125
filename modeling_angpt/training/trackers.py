"""Experiment trackers through Accelerate (docs/training.md, "Watching a run: trackers").

`report_to` names any tracker Accelerate supports (`ACCELERATE_TRACKERS`, or `all` for every installed one) besides
the run's own `jsonl` record. The run's Accelerator is built with `log_with=` those names and `project_config`
pointing its logging directory at OUTPUT_DIR/logs; `start_trackers` calls `init_trackers` with the run directory's
name as project and run name, then stores the recipe as hyperparameters (each tracker's `store_init_configuration`,
what `init_trackers(config=...)` calls; skipped for mlflow on resume); the training loop logs with `accelerator.log`.

What is ours (Accelerate leaves it to the caller): continuing a tracker's run when the training run resumes.
- tensorboard: the writer's `purge_step` drops the events the interrupted run logged after the resumed checkpoint;
- wandb: the run id is kept in OUTPUT_DIR/trackers.json and the resumed run opens it with `resume="allow"`;
- mlflow: the run id and tracking URI are kept there and the resumed run reopens that run (`run_id`); without
  MLFLOW_TRACKING_URI the store is OUTPUT_DIR/mlflow.db, so a run directory holds its own record;
- trackio: the project and run name are the run directory's name and the run is reopened with `resume="allow"`.
Other trackers start a new run on each resume. Steps a killed run logged after its last checkpoint are logged again
by the resumed one with the same values (a resumed run reproduces the uninterrupted losses, docs/training.md).

Imports only the standard library at module level: the recipe checks names against `ACCELERATE_TRACKERS` before torch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

# accelerate.utils.LoggerType without ALL (tests/training/test_trackers.py keeps the two equal)
ACCELERATE_TRACKERS = ("aim", "tensorboard", "wandb", "trackio", "comet_ml", "mlflow", "clearml", "dvclive",
                       "swanlab")
OWN_ENTRIES = ("jsonl", "none")  # the run's own metrics.jsonl, and nothing
# The pip package a tracker needs (its import name differs for comet_ml).
TRACKER_PACKAGES = {"comet_ml": "comet-ml"}
TRACKERS_FILE = "trackers.json"  # the ids a resumed run reopens
LOGGING_DIR = "logs"  # Accelerate's logging_dir: TensorBoard events under logs/<run name>/, aim's repository


def accelerate_entries(report_to: list[str]) -> list[str]:
    """The entries of `report_to` that Accelerate handles (everything but jsonl and none)."""
    return [name for name in report_to if name not in OWN_ENTRIES]


def unknown_entries(report_to: list[str]) -> list[str]:
    return sorted(set(report_to) - set(OWN_ENTRIES) - set(ACCELERATE_TRACKERS) - {"all"})


def check_installed(report_to: list[str]) -> None:
    """One line naming the package to install, for the first tracker of `report_to` that is not installed."""
    from accelerate.utils import imports

    for name in accelerate_entries(report_to):
        if name == "all":
            continue
        if not getattr(imports, f"is_{name}_available")():
            package = TRACKER_PACKAGES.get(name, name)
            raise ValueError(f"recipe key report_to names {name!r}, which is not installed; pip install {package} "
                             "(or pip install 'angpt[trackers]' for the trackers the project tests)")


def accelerator_kwargs(recipe) -> dict:
    """Accelerator(...) arguments for the recipe's trackers: `log_with` and the run's logging directory."""
    names = accelerate_entries(recipe.report_to)
    if not names:
        return {}
    from accelerate.utils import ProjectConfiguration

    output_dir = Path(recipe.output_dir)
    return {"log_with": names, "project_config": ProjectConfiguration(project_dir=str(output_dir),
                                                                      logging_dir=str(output_dir / LOGGING_DIR))}


def run_name(output_dir: Path) -> str:
    """The project and run name a tracker shows: the run directory's name."""
    return Path(output_dir).resolve().name


def flat_config(values: dict, prefix: str = "") -> dict:
    """The recipe as hyperparameters every tracker takes (TensorBoard's hparams: numbers, strings, booleans):
    mappings flattened to dotted keys, lists joined with commas."""
    flat = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            flat[name] = ",".join(str(v) for v in value)
        else:
            flat[name] = value
    return flat


def _read_ids(output_dir: Path) -> dict:
    path = Path(output_dir) / TRACKERS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _init_kwargs(name: str, output_dir: Path, resume_step: int | None, saved: dict) -> dict:
    """init_trackers' per-tracker keyword arguments, with what a resumed run needs to continue its tracker's run."""
    resumed = resume_step is not None
    kwargs = {"tensorboard": {"purge_step": resume_step + 1} if resumed else {},
              "wandb": {"name": name, "dir": str(output_dir)},
              "mlflow": {"run_name": name},
              "trackio": {"name": name, "resume": "allow" if resumed else "never"}}
    if resumed and "wandb" in saved:
        kwargs["wandb"].update(id=saved["wandb"]["id"], resume="allow")
    if resumed and "mlflow" in saved:
        kwargs["mlflow"]["run_id"] = saved["mlflow"]["run_id"]
    return kwargs


def _mlflow_store(output_dir: Path, saved: dict) -> None:
    """The tracking URI: the user's MLFLOW_TRACKING_URI, else the one the run started with, else the run's own store."""
    import mlflow

    if os.environ.get("MLFLOW_TRACKING_URI"):
        return
    uri = saved.get("mlflow", {}).get("tracking_uri") or f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)


def start_trackers(accelerator, recipe, output_dir: Path, resume_step: int | None) -> None:
    """init_trackers on the main process (Accelerate's rule), continuing the trackers' runs of a resumed run, then
    the ids a later resume needs written to OUTPUT_DIR/trackers.json."""
    if not accelerator.log_with or not accelerator.is_main_process:
        return
    output_dir = Path(output_dir)
    saved = _read_ids(output_dir) if resume_step is not None else {}
    names = {str(tracker) for tracker in accelerator.log_with}
    if "mlflow" in names:
        _mlflow_store(output_dir, saved)
    name = run_name(output_dir)
    try:
        accelerator.init_trackers(name, init_kwargs=_init_kwargs(name, output_dir, resume_step, saved))
    except Exception as error:  # a tracker's own set-up error (no wandb login, an unreachable server, ...): one line
        message = " ".join(str(error).split())
        raise ValueError(f"recipe key report_to: the trackers {sorted(names)} could not start "
                         f"({type(error).__name__}: {message})") from error
    config = flat_config(recipe.to_dict())
    for tracker in accelerator.trackers:
        if tracker.name == "mlflow" and resume_step is not None:
            continue  # mlflow's parameters are immutable; the resumed run's keys may differ only where allowed
        tracker.store_init_configuration(config)
    ids = {}
    if "wandb" in names:
        ids["wandb"] = {"id": accelerator.get_tracker("wandb", unwrap=True).id}
    if "mlflow" in names:
        import mlflow

        ids["mlflow"] = {"run_id": accelerator.get_tracker("mlflow", unwrap=True).info.run_id,
                         "tracking_uri": mlflow.get_tracking_uri()}
    if ids:
        (output_dir / TRACKERS_FILE).write_text(json.dumps(ids, indent=1))


def finish_trackers(accelerator) -> None:
    """Each tracker's `finish` on the main process (not `end_training`, which waits for every rank and would hang a
    run that stops on one rank with an error)."""
    if accelerator.is_main_process:
        for tracker in accelerator.trackers:
            tracker.finish()
