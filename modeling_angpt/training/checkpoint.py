"""Checkpoints: accelerate's save_state written atomically, the last N kept, exact resume.

A checkpoint is OUTPUT_DIR/checkpoints/step_XXXXXXX holding what `Accelerator.save_state` writes (model,
optimizer, scheduler, every rank's RNG states) plus trainer_state.json (step, batches consumed, data
epoch, loss history) and, for a stream, each rank's position in it (data_state_<rank>.pt). It is first
written to a hidden temp dir and renamed into place (os.replace is atomic on POSIX), so a run killed while
saving never leaves a half checkpoint that --resume would pick.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

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
    file = data_state_file(path, accelerator.process_index)
    return torch.load(file, weights_only=False) if file.is_file() else None
