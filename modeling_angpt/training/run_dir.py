"""A run's output directory: what a run owns there, when a run may start in, resume from or overwrite it, the lock
that keeps one live process in it, and the checkpoints written under it.

The rules. A training run writes, under its `output_dir`, only the entries of `RUN_LAYOUT` (recipe.json and
model_config.json first, then metrics, the trackers' files, checkpoints/, final/, the loss curve). Runs never mix:

- a new run needs an empty (or absent) `output_dir`;
- `overwrite=True` (`angpt train --overwrite`) first deletes a previous run's entries, and only when the
  directory is recognisably a run directory (it has recipe.json); other files in it are left alone, and a
  non-empty directory that is not a run directory is refused, so a typo in `output_dir` cannot delete data;
- `resume=True` (`angpt train --resume`) continues the newest complete checkpoint only if the command's recipe and
  model config are those of the run that wrote it. Keys that only steer the run's bookkeeping or speed may
  differ (`RESUMABLE_KEYS`): `max_steps` (continue further, or stop earlier; the learning-rate schedule is
  recomputed for the new length, so a cosine schedule is stretched from the resumed step on), logging,
  evaluation and checkpoint frequencies, `bf16`, `gradient_checkpointing`, the data cache location and
  similar, and the per-device batch and accumulation when the global batch stays (resume.py). Any other
  difference is refused, naming each differing key;
- `resume="auto"` (`--resume auto`) resumes as `resume=True` when the directory holds a checkpoint, and otherwise
  starts the run: in an empty directory, or in one where this same run (the same recipe and model config) was
  started and stopped before its first checkpoint, whose files it replaces, saying so in one line.

The lock (`hold`). The rules look only at the files there: a second process given the same directory while the
first is still writing (a second `angpt train --resume`, or workers of a killed benchmark that live on) would pass
them, then continue, overwrite or delete files the first is still writing. `hold` takes an exclusive `flock` on the
directory itself (no lock file, so an empty directory stays empty) and refuses, naming the directory, when another
process holds it. The kernel drops the lock when its holder exits, however it exits, so no stale lock is ever left
behind. It is advisory and best effort: where the platform or file system has no `flock` on directories (Windows,
some network file systems), runs go on unguarded. The semantic-focus protocol holds its directories with it too.

Checkpoints are written and found by checkpoints.py; `--resume` starts from the newest complete one there, and
`--resume auto` (the one command line of every start of a requeued job) starts a new run where there is none yet.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

RECIPE_FILE = "recipe.json"
MODEL_CONFIG_FILE = "model_config.json"
# "logs", "wandb", "mlflow.db" and "trackers.json": the experiment trackers' (training/trackers.py); "tensorboard": runs
# written before the trackers went through Accelerate
RUN_LAYOUT = (RECIPE_FILE, MODEL_CONFIG_FILE, "metrics.jsonl", "loss_curve.png", "logs", "wandb", "mlflow.db",
              "trackers.json", "tensorboard", "checkpoints", "final", ".tmp_final")
RESUMABLE_KEYS = frozenset({
    "output_dir", "max_steps", "logging_steps", "eval_steps", "save_steps", "save_total_limit", "report_to",
    "disable_tqdm", "dataloader_num_workers", "eval_max_batches", "per_device_eval_batch_size", "peak_flops",
    "data_cache_dir", "bf16", "gradient_checkpointing", "preemption_signal", "async_checkpoint",
    # the batch geometry may change as long as the global batch stays (resume.check_geometry)
    "per_device_train_batch_size", "gradient_accumulation_steps"})
RESUMABLE_PREFIXES = ("torch_compile",)  # compilation settings change speed, not the math
# Config fields that follow from the tokenizer (compared through the recipe) or from the library version.
IGNORED_CONFIG_KEYS = frozenset({"vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version",
                                 "_name_or_path", "architectures", "dtype", "torch_dtype", "use_cache"})


class RunDirError(ValueError):
    """The output directory cannot be used as asked; nothing was changed in it."""


def is_main_rank() -> bool:
    """Before accelerate starts, the launcher's RANK tells which process may change the directory."""
    return int(os.environ.get("RANK", "0")) == 0


def _entries(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.is_dir() else []


def _shown(names: list[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def filled_recipe(recipe, config) -> dict:
    """The recipe as a run records it: optimiser keys left unset take the architecture's values."""
    from .recipe import architecture_defaults_for

    return recipe.with_architecture_defaults(architecture_defaults_for(config)).to_dict()


def _as_json(values: dict) -> dict:
    """As a JSON file holds it (tuples become lists, integer keys strings), so recorded and new values compare."""
    return json.loads(json.dumps(values, default=str))


def comparable_config(config) -> dict:
    return _as_json({k: v for k, v in config.to_dict().items() if k not in IGNORED_CONFIG_KEYS})


def differences(before: dict, after: dict, resumable=lambda key: False) -> list[str]:
    """"KEY: VALUE there, VALUE here" for each key (not `resumable`) whose values differ, as JSON would hold them."""
    before, after = _as_json(before), _as_json(after)
    keys = sorted(set(before) | set(after))
    return [f"{k}: {before.get(k)!r} there, {after.get(k)!r} here" for k in keys
            if not resumable(k) and before.get(k) != after.get(k)]


def _resumable(key: str) -> bool:
    return key in RESUMABLE_KEYS or key.startswith(RESUMABLE_PREFIXES)


def _check_same_run(output_dir: Path, recipe, config, what: str) -> None:
    """Refuse, naming each differing key, when the run recorded in output_dir is not this recipe's."""
    recorded = output_dir / RECIPE_FILE
    if not recorded.is_file():
        raise RunDirError(f"--resume: {output_dir} has {what} but no {RECIPE_FILE}, so the run that wrote "
                          "them cannot be checked against this recipe; start a new run in another output_dir")
    from .recipe import Recipe

    before = json.loads(recorded.read_text())
    # A key a newer library added and the older run lacks counts as its default value there.
    defaults = Recipe().to_dict()
    before = {**{k: v for k, v in defaults.items() if k not in before}, **before}
    problems = differences(before, filled_recipe(recipe, config), _resumable)
    recorded_config = output_dir / MODEL_CONFIG_FILE
    if recorded_config.is_file():
        problems += [f"model config {p}" for p in
                     differences(json.loads(recorded_config.read_text()), comparable_config(config))]
    if problems:
        raise RunDirError(f"--resume: {output_dir} ({what}) was written by a different run ({'; '.join(problems)}); "
                          "resume with that run's recipe, or start over with --overwrite or another output_dir")


def check_resume(output_dir: Path, recipe, config) -> list[Path]:
    """The checkpoints to resume from, newest complete first (checkpoints.resume_candidates names each newer
    incomplete one), after checking that they belong to this recipe and model config and that this launch can
    continue their batches (resume.check_geometry)."""
    from .checkpoints import checkpoints_root, resume_candidates
    from .resume import check_geometry, geometry, launched_processes, saved_geometry

    candidates = resume_candidates(output_dir, announce=_announce)
    if not candidates:
        raise FileNotFoundError(f"--resume: no checkpoint under {checkpoints_root(output_dir)}")
    _check_same_run(output_dir, recipe, config, f"checkpoints ({candidates[0].name})")
    recorded = json.loads((output_dir / RECIPE_FILE).read_text())
    check_geometry(candidates[0], saved_geometry(candidates[0], recorded),
                   geometry(recipe, launched_processes()), recipe.streaming)
    return candidates


def _announce(line: str) -> None:
    if is_main_rank():
        print(line, file=sys.stderr, flush=True)


def _clear_run(output_dir: Path) -> None:
    for name in RUN_LAYOUT:
        path = output_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def prepare_output_dir(recipe, config, resume: bool | str = False, overwrite: bool = False) -> list[Path]:
    """Check (and with `overwrite`, clear) the run's output_dir before any data or model work; returns the
    checkpoints to resume from, newest first (empty for a new run). Raises RunDirError naming the directory and
    what to do."""
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the run, or replace it")
    output_dir = Path(recipe.output_dir)
    if resume == "auto":
        from .checkpoints import checkpoints_root

        if not any(checkpoints_root(output_dir).glob("step_*")):
            if _entries(output_dir):  # this run, started before and stopped before its first checkpoint
                _check_same_run(output_dir, recipe, config, "the files of a run")
                _announce(f"--resume auto: {output_dir} has no checkpoint yet: starting the run from step 0")
                if is_main_rank():
                    _clear_run(output_dir)
            return []
    if resume:
        return check_resume(output_dir, recipe, config)
    if check_new_run_dir(output_dir, overwrite) and is_main_rank():
        _clear_run(output_dir)
    return []


def check_new_run_dir(output_dir: Path, overwrite: bool = False) -> bool:
    """May a new run start in `output_dir`? Raises RunDirError if not; True when a previous run must first be
    deleted (`overwrite`). Changes nothing."""
    if output_dir.exists() and not output_dir.is_dir():
        raise RunDirError(f"output_dir {output_dir} exists and is not a directory")
    entries = _entries(output_dir)
    if not entries:
        return False
    if not overwrite:
        raise RunDirError(f"output_dir {output_dir} is not empty ({_shown(entries)}); pass --resume to continue "
                          "the run there, --overwrite to replace it, or choose another output_dir")
    if RECIPE_FILE not in entries:
        raise RunDirError(f"output_dir {output_dir} is not empty ({_shown(entries)}) and is not an angpt run "
                          f"directory (no {RECIPE_FILE}); --overwrite replaces only a previous run: choose "
                          "another output_dir")
    return True


def record_run(output_dir: Path, recipe, model_config: dict) -> None:
    """recipe.json and model_config.json (`comparable_config` of the config the recipe built): what a later
    --resume is checked against. Main process only."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / RECIPE_FILE).write_text(json.dumps(recipe.to_dict(), indent=2))
    (output_dir / MODEL_CONFIG_FILE).write_text(json.dumps(model_config, indent=2, default=str))


# The lock: one live process per run directory

class RunDirInUseError(RunDirError):
    """Another live process holds the run directory."""


@contextlib.contextmanager
def hold(output_dir: str | os.PathLike, enabled: bool = True):
    """Hold `output_dir` for one run: create it if absent (and on exit remove again the directories this created,
    if the run left them empty), take the lock, release it on exit. `enabled=False` (ranks other than the main one
    of a distributed run, which share the directory with it) does nothing."""
    if not enabled:
        yield
        return
    path = Path(output_dir)
    created = [p for p in (path, *path.parents) if not p.exists()]  # the directory first, then its new parents
    path.mkdir(parents=True, exist_ok=True)
    fd = None if fcntl is None else os.open(path, os.O_RDONLY)  # Windows cannot open a directory
    try:
        if fd is not None:
            _lock(fd, path)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock
        for directory in created:
            try:
                directory.rmdir()
            except OSError:  # not empty: the run wrote there
                break


def _lock(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunDirInUseError(f"output directory {path} is in use by another running process; wait for it "
                                   "to finish or stop it, or choose another output directory") from None
        # ENOLCK, EBADF, EINVAL, EOPNOTSUPP: no directory locks on this file system; go on unguarded
