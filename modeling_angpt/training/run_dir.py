"""A run's output directory: what a run owns there, when a run may start in, resume from or overwrite it, the lock
that keeps one live process in it, and the checkpoints written under it.

The rules. A training run writes, under its `output_dir`, only the entries of `RUN_LAYOUT` (recipe.json and
model_config.json first, then metrics, the trackers' files, checkpoints/, final/, the loss curve). Runs never mix:

- a new run needs an empty (or absent) `output_dir`;
- `overwrite=True` (`angpt train --overwrite`) first deletes a previous run's entries, and only when the
  directory is recognisably a run directory (it has recipe.json); other files in it are left alone, and a
  non-empty directory that is not a run directory is refused, so a typo in `output_dir` cannot delete data;
- `resume=True` (`angpt train --resume`) continues the newest checkpoint only if the command's recipe and
  model config are those of the run that wrote it. Keys that only steer the run's bookkeeping or speed may
  differ (`RESUMABLE_KEYS`): `max_steps` (continue further, or stop earlier; the learning-rate schedule is
  recomputed for the new length, so a cosine schedule is stretched from the resumed step on), logging,
  evaluation and checkpoint frequencies, `bf16`, `gradient_checkpointing`, the data cache location and
  similar. Any other difference is refused, naming each differing key.

The lock (`hold`). The rules look only at the files there: a second process given the same directory while the
first is still writing (a second `angpt train --resume`, or workers of a killed benchmark that live on) would pass
them, then continue, overwrite or delete files the first is still writing. `hold` takes an exclusive `flock` on the
directory itself (no lock file, so an empty directory stays empty) and refuses, naming the directory, when another
process holds it. The kernel drops the lock when its holder exits, however it exits, so no stale lock is ever left
behind. It is advisory and best effort: where the platform or file system has no `flock` on directories (Windows,
some network file systems), runs go on unguarded. The semantic-focus protocol holds its directories with it too.

Checkpoints (`save_checkpoint`, `load_checkpoint`). A checkpoint is OUTPUT_DIR/checkpoints/step_XXXXXXX holding what
`Accelerator.save_state` writes (model, optimizer, scheduler, every rank's RNG states) plus trainer_state.json (step,
batches consumed, data epoch, loss history) and, for a stream, each rank's position in it (data_state_<rank>.pt). It
is first written to a hidden temp dir and renamed into place (os.replace is atomic on POSIX), so a run killed while
saving never leaves a half checkpoint that --resume would pick.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
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
    "data_cache_dir", "bf16", "gradient_checkpointing"})
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


def check_resume(output_dir: Path, recipe, config) -> Path:
    """The checkpoint to resume from, after checking that it belongs to this recipe and model config."""
    resume_from = latest_checkpoint(output_dir)
    if resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {checkpoints_root(output_dir)}")
    recorded = output_dir / RECIPE_FILE
    if not recorded.is_file():
        raise RunDirError(f"--resume: {output_dir} has checkpoints but no {RECIPE_FILE}, so the run that wrote "
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
        raise RunDirError(f"--resume: {resume_from} was written by a different run ({'; '.join(problems)}); "
                          "resume with that run's recipe, or start over with --overwrite or another output_dir")
    return resume_from


def prepare_output_dir(recipe, config, resume: bool = False, overwrite: bool = False) -> Path | None:
    """Check (and with `overwrite`, clear) the run's output_dir before any data or model work; returns the
    checkpoint to resume from (None for a new run). Raises RunDirError naming the directory and what to do."""
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the run, or replace it")
    output_dir = Path(recipe.output_dir)
    if resume:
        return check_resume(output_dir, recipe, config)
    if check_new_run_dir(output_dir, overwrite) and is_main_rank():
        for name in RUN_LAYOUT:
            path = output_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    return None


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


# Checkpoints

STATE_FILE = "trainer_state.json"


def checkpoints_root(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return checkpoints_root(output_dir) / f"step_{step:07d}"


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temp dirs start with '.' and never match)."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def data_state_file(path: Path, rank: int) -> Path:
    return Path(path) / f"data_state_{rank}.pt"


def save_checkpoint(accelerator, output_dir: Path, state: dict, keep: int | None,
                    data_state: dict | None = None) -> Path:
    """Every rank must call this (save_state writes per-rank RNG files into the shared directory). `data_state` is
    this rank's position in a stream (train_loader.loader_state), when its data has one."""
    final = checkpoint_path(output_dir, state["step"])
    tmp = final.parent / f".tmp_{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # debris of a run killed mid-save
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    if data_state is not None:
        import torch

        torch.save(data_state, data_state_file(tmp, accelerator.process_index))
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(state))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune_checkpoints(output_dir, keep)
    accelerator.wait_for_everyone()
    return final


def prune_checkpoints(output_dir: Path, keep: int | None) -> None:
    """Keep the newest `keep` checkpoints (save_total_limit); None or 0 keeps all."""
    if not keep:
        return
    for old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(accelerator, path: Path) -> dict:
    """The checkpoint's trainer state, after restoring model, optimiser, schedule and random states. A run resumes with
    the number of processes that wrote it: each process's batches, random states and stream position are its own,
    so another count would silently train on other data."""
    state = json.loads((Path(path) / STATE_FILE).read_text())
    saved, processes = state.get("num_processes"), accelerator.num_processes
    if saved is not None and saved != processes:
        raise ValueError(f"--resume: checkpoint {path} was written by {saved} process(es), this launch has {processes}; "
                         f"launch it with {saved} (num_machines × processes per machine)")
    accelerator.load_state(str(path))
    return state


def load_data_state(accelerator, path: Path) -> dict | None:
    """This rank's saved stream position, or None when the checkpoint has none."""
    import torch

    file = data_state_file(path, accelerator.process_index)
    return torch.load(file, weights_only=False) if file.is_file() else None
