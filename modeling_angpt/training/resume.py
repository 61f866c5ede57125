"""Resuming a run from its checkpoint, on the number of processes that wrote it or on another (docs/training.md,
"Checkpoints and resuming").

What a run's batches depend on is the global batch of an optimiser step: per-device batch × processes × accumulation
(`global_batch`). The data position a checkpoint records is global (the blocks of the run's block order consumed so
far, data/loader.BlockOrder), so a launch with another number of processes that keeps the global batch, by changing
`per_device_train_batch_size` or `gradient_accumulation_steps`, continues with exactly the blocks the first launch
would have read next, step by step. A launch that cannot keep it is refused in one line. A stream is split into
`stream_parts` parts fixed at the first start, each with its own saved position (data/streaming.py): it resumes on any
number of processes that divides that number of parts.

Model, optimiser and schedule: under DDP, `Accelerator.save_state` writes them whole, and any number of processes
loads them; under FSDP2 the sharded state goes through torch.distributed.checkpoint, which reshards on load to the
launch's number of processes, and loads into a launch without FSDP too (one process, DDP), as a whole checkpoint
loads into an FSDP2 launch (`load_across_layouts`). The random states are per process: a process that had none in the checkpoint keeps
the seed's (training itself draws no random numbers: no dropout, the batch order is a function of the seed).
"""
from __future__ import annotations

import os
from pathlib import Path

from .checkpoints import ASYNC_STATE_DIR, read_state

GEOMETRY_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_processes")
# a stream's checkpoint also records "stream_parts" (saved_stream_parts)


def launched_processes() -> int:
    """The launch's number of processes, before accelerate starts (the launcher's WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def geometry(recipe, processes: int) -> dict:
    return {"per_device_train_batch_size": recipe.per_device_train_batch_size,
            "gradient_accumulation_steps": recipe.gradient_accumulation_steps, "num_processes": processes}


def global_batch(shape: dict) -> int:
    return shape["per_device_train_batch_size"] * shape["gradient_accumulation_steps"] * shape["num_processes"]


def _described(shape: dict) -> str:
    return (f"{global_batch(shape)} sequences ({shape['per_device_train_batch_size']} per device × "
            f"{shape['num_processes']} processes × {shape['gradient_accumulation_steps']} accumulation steps)")


def saved_geometry(path: Path, recorded_recipe: dict) -> dict:
    """The batch geometry that wrote the checkpoint: its own record, or (checkpoints of earlier versions) the run's
    recipe.json and the process count the checkpoint names."""
    state = read_state(path)
    saved = {key: state.get(key, recorded_recipe.get(key, 1)) for key in GEOMETRY_KEYS}
    return saved | ({"stream_parts": state["stream_parts"]} if "stream_parts" in state else {})


def check_geometry(path: Path, saved: dict, now: dict, streaming: bool) -> None:
    """Refuse, in one line, a launch whose batches would not continue the checkpoint's."""
    if global_batch(saved) != global_batch(now):
        fits = [b for b in range(1, global_batch(saved) + 1)
                if global_batch(saved) % (b * now["num_processes"]) == 0][:4]
        hint = (f"for example per_device_train_batch_size={fits[-1]} with gradient_accumulation_steps="
                f"{global_batch(saved) // (fits[-1] * now['num_processes'])}" if fits else
                f"{now['num_processes']} processes cannot split it: launch a number of processes that divides it")
        raise ValueError(f"--resume: checkpoint {path} was trained with a global batch of {_described(saved)}; "
                         f"this launch gives {_described(now)}: keep the global batch ({hint})")
    if streaming:
        check_stream_parts(saved_stream_parts(saved), now, f"--resume: the stream of checkpoint {path}")


def saved_stream_parts(saved: dict) -> int:
    """A stream checkpoint's number of parts; checkpoints of earlier versions split the stream by process."""
    return saved.get("stream_parts") or saved["num_processes"]


def stream_parts(recipe, processes: int, candidates: list[Path]) -> int | None:
    """The run's number of stream parts: the checkpoint's when resuming, else the recipe's, else `processes`."""
    if not recipe.streaming:
        return None
    if candidates:
        return saved_stream_parts(saved_geometry(candidates[0], {}))
    return recipe.stream_parts or processes


def check_stream_parts(parts: int, now: dict, what: str = "the stream (streaming: true)") -> None:
    """Refuse, in one line, a stream split that the launch cannot read in equal shares: every process reads
    parts/processes parts, and every step takes global batch/parts blocks of each part (data/streaming.py)."""
    processes, step = now["num_processes"], global_batch(now)
    if parts % processes or step % parts:
        raise ValueError(f"{what} is split into {parts} parts (recipe key stream_parts): it runs on a number of "
                         f"processes that divides {parts} with a global batch that {parts} divides; this launch "
                         f"has {processes} processes and a global batch of {_described(now)}")


FSDP_MODEL_DIR, FSDP_OPTIMIZER_DIR = "pytorch_model_fsdp_0", "optimizer_0"  # Accelerate's sharded layout (DCP)


def load_checkpoint(accelerator, path: Path, now: dict, model, optimizer, scheduler) -> dict:
    """Restore model, optimiser, schedule and random states from `path`; returns its trainer state with the data
    position in this launch's micro-batches (`batches`) and this launch's geometry. A checkpoint written under
    FSDP2 (sharded, through torch.distributed.checkpoint) loads into a launch without it, and one written without
    FSDP into an FSDP2 launch (`load_across_layouts`)."""
    state = read_state(path)
    saved = {key: state.get(key, now[key] if key != "num_processes" else 1) for key in GEOMETRY_KEYS}
    if (Path(path) / ASYNC_STATE_DIR).is_dir():  # written in the background: DCP, any layout, any process count
        load_asynchronous(accelerator, Path(path), model, optimizer, scheduler)
    elif (Path(path) / FSDP_MODEL_DIR).is_dir() == is_fsdp(accelerator):
        accelerator.load_state(str(path))
    else:
        load_across_layouts(accelerator, Path(path), model, optimizer, scheduler)
    blocks = state["batches"] * saved["per_device_train_batch_size"] * saved["num_processes"]
    per_micro_batch = now["per_device_train_batch_size"] * now["num_processes"]
    return {**state, **now, "batches": blocks // per_micro_batch}


def load_asynchronous(accelerator, path: Path, model, optimizer, scheduler) -> None:
    """A checkpoint of `checkpoints.start_async_checkpoint`: model and optimiser through torch.distributed.checkpoint
    (async_checkpoint.py), schedule and random states as Accelerate wrote them."""
    from accelerate.checkpointing import load_accelerator_state

    from .async_checkpoint import load_model_and_optimizer

    load_model_and_optimizer(model, getattr(optimizer, "optimizer", optimizer), path / ASYNC_STATE_DIR)
    load_accelerator_state(str(path), [], [], [scheduler], [], accelerator.process_index)


def is_fsdp(accelerator) -> bool:
    return str(accelerator.distributed_type).endswith("FSDP")


def load_across_layouts(accelerator, path: Path, model, optimizer, scheduler) -> None:
    """Model and optimiser state between FSDP2's sharded checkpoint and the whole one of DDP or one process, through
    torch.distributed.checkpoint's state-dict API, which names every tensor by its parameter's name whatever the
    layout. The random states are left as the seed made them (see the module docstring)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    raw_optimizer = getattr(optimizer, "optimizer", optimizer)  # inside Accelerate's wrapper
    if (path / FSDP_MODEL_DIR).is_dir():  # sharded → whole: read every shard into the full tensors
        import torch.distributed.checkpoint as dcp

        model_state, optimizer_state = get_state_dict(model, raw_optimizer)  # optimiser states initialised
        dcp.load({"model": model_state}, checkpoint_id=str(path / FSDP_MODEL_DIR))
        dcp.load({"optimizer": optimizer_state}, checkpoint_id=str(path / FSDP_OPTIMIZER_DIR))
        set_state_dict(model, raw_optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    else:  # whole → sharded: every process reads the whole state and keeps its shard
        from safetensors.torch import load_file

        whole = StateDictOptions(full_state_dict=True)
        model_state = load_file(str(path / "model.safetensors"))
        optimizer_state = _named_optimizer_state(torch.load(path / "optimizer.bin", weights_only=False),
                                                 model, raw_optimizer)
        set_state_dict(model, raw_optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state,
                       options=whole)
    scheduler.load_state_dict(torch.load(path / "scheduler.bin", weights_only=False))


def _named_optimizer_state(saved: dict, model, optimizer) -> dict:
    """A plain optimizer.state_dict() (parameters numbered in the order of its groups) with each number replaced
    by its parameter's name, found through this launch's optimiser, which holds the same parameters in the same
    groups and order (training/optim.py builds both)."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = [{**group, "params": [ordered[i] for i in group["params"]]} for group in saved["param_groups"]]
    return {"state": {ordered[i]: value for i, value in saved["state"].items()}, "param_groups": groups}
