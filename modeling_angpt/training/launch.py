"""Multi-process launches: the processes of one run must form one process group, or the run stops.

`accelerate launch --config_file configuration/accelerate/cpu_2proc.yaml ...` starts the processes with
torchrun, which sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. On a machine without a GPU,
accelerate would then pick no distributed backend at all (it looks for a GPU first, and for CPU only when
asked) and every process would train alone, all writing the same output_dir. Here the CPU is asked for
whenever several processes were launched and no GPU is there, which gives a gloo group of WORLD_SIZE processes;
and after accelerate has started, a group of another size than the launch is an error, never a silent
duplicate run.
"""
from __future__ import annotations

import os


class LaunchError(ValueError):
    """The processes of a launch do not form one run."""


def _world_size() -> int:
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"environment variable WORLD_SIZE={value!r}: expected a whole number of processes") from None


def _has_accelerator_device() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def check_launch_environment() -> None:
    """Before any work: a WORLD_SIZE > 1 needs the rest of a launcher's environment."""
    world = _world_size()
    if world < 1:
        raise LaunchError(f"environment variable WORLD_SIZE={world}: expected at least 1 process")
    if world == 1:
        return
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise LaunchError(f"WORLD_SIZE={world} is set but {', '.join(missing)} not: this process was not started "
                          "by a launcher, so it cannot join a run of several processes; start it with "
                          "`accelerate launch` or `torchrun`, or unset WORLD_SIZE for one process")
    rank = os.environ["RANK"]
    if not rank.isdigit() or int(rank) >= world:
        raise LaunchError(f"RANK={rank} does not fit WORLD_SIZE={world}: expected 0 to {world - 1}")


def accelerator_device_kwargs() -> dict:
    """Accelerator(...) arguments: CPU processes of a multi-process launch form a gloo group."""
    return {"cpu": True} if _world_size() > 1 and not _has_accelerator_device() else {}


def check_process_group(accelerator) -> None:
    """After accelerate has started: one group holding every launched process, or a clear error."""
    world = _world_size()
    if accelerator.num_processes != world:
        raise LaunchError(
            f"launched as {world} processes (WORLD_SIZE={world}) but accelerate formed a group of "
            f"{accelerator.num_processes} ({accelerator.distributed_type}); the processes would train "
            "independently into one output_dir, so the run stops; check the accelerate config "
            "(configuration/accelerate/cpu_2proc.yaml is a working 2-process CPU example)")


def group_peak_flops(accelerator, per_process_peak: float, override: bool = False) -> float:
    """The peak FLOP/s of the whole process group, for MFU. A GPU process owns its device: the peaks add up.
    CPU processes on one machine share its cores, and each one's peak already counts its own threads: add them,
    but never beyond the cores the machine has (two processes of two threads on two cores have the peak of two
    cores, not four). An explicit per-device `peak_flops` is taken as given for each process."""
    import torch

    processes = accelerator.num_processes
    if override or accelerator.device.type != "cpu":
        return per_process_peak * processes
    threads = max(1, torch.get_num_threads())
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", processes)))
    machines = max(1, processes // local)
    per_core = per_process_peak / threads
    return per_core * min(threads * local, os.cpu_count() or threads * local) * machines
