"""Launching a run over several processes, and what sharding needs: every launched process in one process group or
the run stops, FSDP2 on CPU processes, and the weight constraint on FSDP2 and tensor-parallel shards.

The process group. `accelerate launch --config_file configuration/accelerate/cpu_2proc.yaml ...` starts the
processes with torchrun, which sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. On a machine without
a GPU, accelerate would then pick no distributed backend at all (it looks for a GPU first, and for CPU only when
asked) and every process would train alone, all writing the same output_dir. Here the CPU is asked for whenever
several processes were launched and no GPU is there, which gives a gloo group of WORLD_SIZE processes; and after
accelerate has started, a group of another size than the launch is an error, never a silent duplicate run.

FSDP2 on CPU processes: what accelerate leaves out, added without changing its GPU path. accelerate applies FSDP
only on accelerators: with `ACCELERATE_USE_CPU=true` its state becomes MULTI_CPU and the FSDP plugin from the launch
config is silently dropped (accelerate/state.py sets DistributedType.FSDP only for MULTI_GPU-like types). torch's
`fully_shard` itself runs on CPU tensors over gloo, so when both environment flags are set
(configuration/accelerate/cpu_2proc_fsdp2.yaml, launched with ACCELERATE_USE_CPU=true) the state is switched to FSDP
with the launch config's plugin; `prepare` then shards the model exactly as on GPUs. This is how the FSDP2 path
(sharded constraint, sharded checkpoints) is tested on a machine without GPUs.
"""
from __future__ import annotations

import os
import warnings
from datetime import timedelta


# How long a collective may wait for the other ranks before it raises (NCCL on GPUs, gloo on CPUs): the bound on a
# hang that is not a lost rank (a lost rank is found by training/rank_watch.py within seconds, whatever this is). It
# must exceed the longest time one rank works while the others wait, i.e. rank 0 writing a checkpoint alone
# (docs/training.md, "A lost rank").
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


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


def bf16_pays_off() -> bool:
    """`bf16: true` asks for speed and memory. A GPU has native bfloat16; a CPU may not (AVX2 only), and there a
    bfloat16 matmul is ~100x slower than a float32 one: the run would crawl. Such a CPU trains in float32 and
    says so in one line."""
    from .metrics import cpu_lacks_native_bf16

    if _has_accelerator_device() or (ratio := cpu_lacks_native_bf16()) is None:
        return True
    warnings.warn(f"recipe key bf16: true, but this CPU has no native bfloat16 (its bfloat16 matmul runs at "
                  f"{ratio:.3f}x its float32 speed): training in float32 instead; set bf16: false to skip this "
                  "check", stacklevel=2)
    return False


def make_accelerator(recipe):
    """The run's Accelerator: mixed precision as the recipe asks (where it pays off), a process group of every
    launched process (or an error), FSDP2 on CPU processes when the launch asked for it."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs

    from .trackers import accelerator_kwargs

    # use_seedable_sampler: the shuffle is a function of (seed, epoch) only, which is what makes
    # skip-the-consumed-batches resume exact.
    accelerator = Accelerator(mixed_precision="bf16" if recipe.bf16 and bf16_pays_off() else "no",
                              step_scheduler_with_optimizer=False,  # else it steps num_processes times per step
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=COLLECTIVE_TIMEOUT)],
                              **accelerator_device_kwargs(),  # CPU-only processes form a gloo group
                              **accelerator_kwargs(recipe))  # the recipe's trackers (trackers.py)
    check_process_group(accelerator)
    enable_cpu_fsdp(accelerator)  # FSDP2 on CPU processes (gloo), which accelerate alone drops
    return accelerator


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def enable_cpu_fsdp(accelerator) -> bool:
    """Switch a MULTI_CPU accelerator to FSDP when the launch asked for FSDP; True when it did."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU or not _flag("ACCELERATE_USE_FSDP"):
        return False
    plugin = FullyShardedDataParallelPlugin()  # reads the launch config's FSDP_* environment
    if plugin.fsdp_version != 2:
        raise ValueError("FSDP on CPU processes is supported with fsdp_version: 2 (fully_shard) only")
    from accelerate.state import PartialState

    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    # AcceleratorState() re-reads PartialState's shared dict each time it is constructed; keep both in step.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def _local_shard(weight):
    """(this rank's tensor, {sharded dim: the process groups of the mesh dims that shard it}) for a parameter that may
    be a DTensor: FSDP2 shards dim 0, a tensor-parallel plan dim 0 (colwise) or dim 1 (rowwise), a 2-D mesh both;
    replicated mesh dims hold the same values."""
    if type(weight).__name__ != "DTensor":
        return weight, {}
    groups: dict[int, list] = {}
    for mesh_dim, placement in enumerate(weight.placements):
        if placement.is_shard():
            groups.setdefault(placement.dim % weight.ndim, []).append(weight.device_mesh.get_group(mesh_dim))
    return weight.to_local(), groups


def apply_weight_constraints(model) -> None:
    """`model.apply_weight_constraints()`, also when FSDP2 or a tensor-parallel plan has sharded its parameters
    (DTensors, on a 1-D or 2-D mesh): the projection of each whole matrix, computed on the shards.

    A norm along a sharded dim (anGPT's rows of a rowwise-split o_proj/down_proj; nGPT's columns of an FSDP2 shard)
    sums its squares over the process groups that shard that dim; a norm along an unsharded dim covers whole vectors
    and needs nothing from other ranks (docs/architectures.md, "Tensor and pipeline parallelism"). One matrix at a
    time, in module order: uneven shards have rank-dependent local shapes, and grouping by them could pair different
    matrices' all-reduces on different ranks. Models without a constraint (not this library's) are left alone."""
    if not hasattr(model, "apply_weight_constraints"):
        return
    if any(hasattr(p, "ds_id") or getattr(p, "_hp_mapping", None) is not None for p in model.parameters()):
        _apply_under_deepspeed(model)
        return
    matrices = list(model.constrained_matrices())
    if not any(type(weight).__name__ == "DTensor" for weight, _ in matrices):
        model.apply_weight_constraints()
        return
    import torch

    strategy = model.architecture_strategy
    with torch.no_grad():
        for weight, residual_output in matrices:
            local, groups = _local_shard(weight)
            dim = strategy.norm_axis(residual_output) % weight.ndim if strategy.norm_axis else None
            strategy.constrain_all([(local, residual_output)], reduce_group=groups.get(dim))  # the norm's dim sharded


def _apply_under_deepspeed(model) -> None:
    """The constraint on a model DeepSpeed ZeRO (stage 1-3) holds (docs/tools.md, "DeepSpeed"): its optimiser steps
    its own float32 master copy, partitioned over the ranks, and copies it into the model's parameters, so projecting
    the parameters alone would be undone at the next step. Each matrix is gathered whole (ZeRO-3 partitions the
    parameters too), projected as one process projects it, and written to both: the master copy
    (deepspeed.utils.safe_set_full_fp32_param) and the parameter (under ZeRO-3 re-partitioned from rank 0's copy,
    which every rank computed alike). Every rank calls this in the same order: the gathers are collectives."""
    import deepspeed
    import torch
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    strategy = model.architecture_strategy
    weights = [module.weight for module in model.modules() if isinstance(module, (torch.nn.Linear, torch.nn.Embedding))]
    with deepspeed.zero.GatheredParameters(weights, modifier_rank=0), torch.no_grad():
        for weight, residual_output in model.constrained_matrices():
            master = safe_get_full_fp32_param(weight)
            whole = (weight.detach().float() if master is None else master).reshape(weight.shape).clone()
            strategy.constrain(whole, residual_output)
            if master is not None:
                safe_set_full_fp32_param(weight, whole)
            weight.copy_(whole.to(weight.dtype))
