"""Sharded training: the weight constraint on FSDP2 shards, and FSDP2 on CPU processes (gloo).

FSDP2 on CPU processes: what accelerate leaves out, added without changing its GPU path.

accelerate applies FSDP only on accelerators: with `ACCELERATE_USE_CPU=true` its state becomes MULTI_CPU and the
FSDP plugin from the launch config is silently dropped (accelerate/state.py sets DistributedType.FSDP only for
MULTI_GPU-like types). torch's `fully_shard` itself runs on CPU tensors over gloo, so when both environment flags
are set (configuration/accelerate/cpu_2proc_fsdp2.yaml, launched with ACCELERATE_USE_CPU=true) the state is
switched to FSDP with the launch config's plugin; `prepare` then shards the model exactly as on GPUs. This is how
the FSDP2 path (sharded constraint, sharded checkpoints) is tested on a machine without GPUs.
"""
from __future__ import annotations

import os


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
    """(this rank's tensor, the process group its dim 0 is sharded over or None) for a parameter that may be a
    DTensor (FSDP2 shards dim 0 with `Shard(0)`; replicated mesh dims hold the same values)."""
    if type(weight).__name__ != "DTensor":
        return weight, None
    local, group = weight.to_local(), None
    for mesh_dim, placement in enumerate(weight.placements):
        if placement.is_shard():
            if placement.dim != 0:
                raise NotImplementedError(f"weight constraint on a DTensor sharded along dim {placement.dim}; "
                                          "FSDP2 shards dim 0")
            if group is not None:
                raise NotImplementedError("weight constraint on a DTensor sharded over several mesh dims")
            group = weight.device_mesh.get_group(mesh_dim)
    return local, group


def apply_weight_constraints(model) -> None:
    """`model.apply_weight_constraints()`, also when FSDP2 has sharded its parameters (DTensors).

    Every DTensor is one rank's dim-0 shard (whole rows). Row norms need nothing from other ranks; a norm along dim
    0 (nGPT's o_proj/down_proj columns) is summed over the shards' process group. One matrix at a time, in module
    order: uneven shards have rank-dependent local shapes, and grouping by them could pair different matrices'
    all-reduces on different ranks. Models without a constraint (not this library's) are left alone."""
    if not hasattr(model, "apply_weight_constraints"):
        return
    matrices = list(model.constrained_matrices())
    if not any(type(weight).__name__ == "DTensor" for weight, _ in matrices):
        model.apply_weight_constraints()
        return
    import torch

    with torch.no_grad():
        for weight, residual_output in matrices:
            local, group = _local_shard(weight)
            model.architecture_strategy.constrain_all([(local, residual_output)], reduce_group=group)
