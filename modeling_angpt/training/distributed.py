"""FSDP2 on CPU processes (gloo): what accelerate leaves out, added without changing its GPU path.

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
