"""A run's checkpoints: written so that a cut-short write is never taken for a checkpoint, found again on resume with
the damaged ones named and passed over, and pruned without ever removing the last good one (docs/training.md,
"Checkpoints and resuming").

A checkpoint is OUTPUT_DIR/checkpoints/step_XXXXXXX holding what `Accelerator.save_state` writes (model, optimizer,
scheduler, every rank's RNG states), trainer_state.json (step, the global data position, the batch geometry, loss
history), for a stream each rank's position in it (data_state_<rank>.pt), and last the completion marker
(`MARKER`): the size of every file the checkpoint holds. The directory is written under a hidden temporary name,
the marker is written and flushed to disk last, and only then is the directory renamed into place (os.replace is
atomic on POSIX). So a process killed while saving, a lost node or a full disk leave at most a hidden temporary
directory, never a step_* directory without its marker; and a step_* directory whose files no longer have the sizes
its marker recorded (truncated or replaced later) is found before anything is loaded from it.

Resuming takes the newest checkpoint that is complete (its marker is there and every size agrees) and loads; each
newer one that is not is named in one line and the previous one is used. A run never starts from scratch silently:
when checkpoints exist and none loads, the resume stops with one line. Checkpoints written before the marker existed
(trainer_state.json without a "format" entry) were committed by the same rename and count as complete.

Pruning (`save_total_limit`) runs after the new checkpoint is committed and counts complete checkpoints only, so it
never removes the last complete one before the new one exists.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

STATE_FILE = "trainer_state.json"
MARKER = "checkpoint_complete.json"
FORMAT = 2  # trainer_state.json's "format": 2 checkpoints carry MARKER; older ones have no "format" entry


class CheckpointError(ValueError):
    """No checkpoint of the run can be resumed from; nothing was changed."""


def checkpoints_root(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return checkpoints_root(output_dir) / f"step_{step:07d}"


def data_state_file(path: Path, rank: int) -> Path:
    return Path(path) / f"data_state_{rank}.pt"


def data_state_files(path: Path) -> list[Path]:
    """Every process's data state in checkpoint `path` (a stream's parts, streaming.py)."""
    return sorted(Path(path).glob("data_state_*.pt"))


def _committed(root: Path) -> list[Path]:
    """step_* directories, oldest first (temporary ones start with '.' and never match)."""
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []


def problem(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be resumed from, or None when it is complete."""
    path = Path(path)
    marker, state = path / MARKER, path / STATE_FILE
    if not marker.is_file():
        if not state.is_file():
            return f"no {MARKER} and no {STATE_FILE}: written only in part"
        try:
            legacy = "format" not in json.loads(state.read_text())
        except (OSError, ValueError):
            return f"{STATE_FILE} is unreadable"
        return None if legacy else f"no {MARKER}: written only in part"
    try:
        sizes = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MARKER} is unreadable"
    for name, size in sizes.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, {size} were written"
    return None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    return [p for p in _committed(checkpoints_root(output_dir)) if problem(p) is None]


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def resume_candidates(output_dir: Path, announce=print) -> list[Path]:
    """The checkpoints to try, newest first, from the newest complete one on; each newer incomplete one is named in
    one line (`announce`). Raises CheckpointError when checkpoints exist and none is complete."""
    committed = _committed(checkpoints_root(output_dir))
    candidates = []
    for path in reversed(committed):
        why = problem(path)
        if why is None:
            candidates.append(path)
        elif not candidates:
            announce(f"--resume: checkpoint {path} is incomplete ({why}); using the one before it")
    if committed and not candidates:
        raise CheckpointError(f"--resume: no complete checkpoint under {checkpoints_root(output_dir)} (the newest, "
                              f"{committed[-1].name}: {problem(committed[-1])}); nothing was resumed or changed")
    return candidates


def _sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(directory: Path) -> None:
    """The completion marker, written last: every file's size, the files and the marker flushed to disk first."""
    files = {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        _sync_file(file)
        files[str(file.relative_to(directory))] = file.stat().st_size
    tmp = directory / f".{MARKER}"
    tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))
    _sync_file(tmp)
    os.replace(tmp, directory / MARKER)


def commit(tmp: Path, final: Path, output_dir: Path, keep: int | None) -> None:
    """Main process: the marker, the rename into place, then pruning."""
    write_marker(tmp)
    if final.exists():  # a checkpoint of this step from an earlier attempt (--resume of an older one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _sync_file(final.parent)
    prune_checkpoints(output_dir, keep)


def save_checkpoint(accelerator, output_dir: Path, state: dict, keep: int | None,
                    data_state: dict | None = None) -> Path:
    """Every rank must call this (save_state writes per-rank RNG files into the shared directory). `data_state` is
    this rank's position in a stream (data/loader.loader_state), when its data has one."""
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
        (tmp / STATE_FILE).write_text(json.dumps({**state, "format": FORMAT}))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        commit(tmp, final, output_dir, keep)
    accelerator.wait_for_everyone()
    return final


ASYNC_STATE_DIR = "model_and_optimizer"  # an asynchronous checkpoint's model and optimiser (async_checkpoint.py)


def start_async_checkpoint(accelerator, checkpointer, model, optimizer, scheduler, output_dir: Path, state: dict,
                           keep: int | None, data_state: dict | None = None) -> Path:
    """The checkpoint of `state["step"]` with the model and optimiser written in the background (recipe key
    async_checkpoint): the schedule, the random states, the stream position and trainer_state.json are written now,
    the model and optimiser state is copied to CPU memory and written by the checkpointer's thread, and the commit
    (marker, rename, pruning) runs at the step boundary where every rank's write is done. Every rank calls this."""
    from accelerate.checkpointing import save_accelerator_state

    checkpointer.wait()  # at most one in flight: the previous one is committed first
    final = checkpoint_path(output_dir, state["step"])
    tmp = final.parent / f".tmp_{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    save_accelerator_state(str(tmp), [], [], [scheduler], [], accelerator.process_index, accelerator.step)
    if data_state is not None:
        import torch

        torch.save(data_state, data_state_file(tmp, accelerator.process_index))
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps({**state, "format": FORMAT}))
    accelerator.wait_for_everyone()  # every rank's files are written before any rank's commit can run
    main = accelerator.is_main_process
    checkpointer.start(model, getattr(optimizer, "optimizer", optimizer), tmp / ASYNC_STATE_DIR,
                       on_done=lambda: commit(tmp, final, output_dir, keep) if main else None)
    return final


def prune_checkpoints(output_dir: Path, keep: int | None) -> None:
    """Keep the newest `keep` complete checkpoints (save_total_limit; None or 0 keeps all). Incomplete step_*
    directories older than the newest complete one are debris of an earlier attempt and go too."""
    complete = list_checkpoints(output_dir)
    if not complete:
        return
    doomed = complete[:-keep] if keep else []
    doomed += [p for p in _committed(checkpoints_root(output_dir)) if p < complete[-1] and p not in complete]
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)


def read_state(path: Path) -> dict:
    return json.loads((Path(path) / STATE_FILE).read_text())


def load_newest(accelerator, candidates: list[Path], load) -> tuple[Path, dict]:
    """(checkpoint, its state) for the newest candidate that `load(accelerator, path)` restores on every rank; each
    that fails is named in one line and the one before it is tried (the ranks agree through one all-reduce per try,
    so none resumes from another step than the others)."""
    import torch

    for path in candidates:
        try:
            state, failed = load(accelerator, path), None
        except Exception as error:  # any damage a size check cannot see: a corrupt header, a bad pickle
            state, failed = None, f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        flag = torch.tensor([0.0 if failed is None else 1.0], device=accelerator.device)
        if accelerator.reduce(flag, reduction="sum").item() == 0:
            return path, state
        if accelerator.is_main_process:
            print(f"--resume: checkpoint {path} does not load ({failed or 'on another rank'}); using the one before "
                  "it", file=sys.stderr, flush=True)
    raise CheckpointError(f"--resume: none of the checkpoints under {candidates[0].parent} loads (the oldest tried: "
                          f"{candidates[-1].name}); nothing was resumed")
