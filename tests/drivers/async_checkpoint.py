"""Run by tests/parallel/test_async_checkpoint_two_processes.py under torchrun (2 CPU processes, gloo): an
asynchronous save of a DDP or FSDP2 model (modeling_angpt/training/async_checkpoint.py) while training goes on, then a
load on the same two processes. Rank 0 writes the full state at the moment of the save (the oracle) and each rank its
report.

    torchrun --nproc_per_node 2 tests/drivers/async_checkpoint.py WORK ddp fsdp2
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training.async_checkpoint import AsyncCheckpointer, load_model_and_optimizer

SHAPE = dict(architecture="angpt", vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=32)
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def build(mode: str):
    torch.manual_seed(0)  # the same initial weights on every rank
    model = AnGPTForCausalLM(AnGPTConfig(**SHAPE))
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model, optimizer, seed: int) -> None:
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(seed))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(equal, a, b))
    return a == b


def full_state(model, optimizer) -> dict:
    model_state, optimizer_state = get_state_dict(model, optimizer, options=FULL)  # collective
    # a copy: without sharding, get_state_dict returns the live parameters themselves
    return copy.deepcopy({"model": model_state, "optimizer": optimizer_state})


def whole_checkpoint_on_rank0(directory: Path, expected: dict) -> bool:
    """Rank 0 alone reads every rank's part of the checkpoint (no collective) and compares it with the oracle."""
    model = AnGPTForCausalLM(AnGPTConfig(**SHAPE))
    model_state, optimizer_state = get_state_dict(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=directory, no_dist=True)
    return (equal(state["model"], expected["model"])
            and equal(state["optimizer"]["state"], expected["optimizer"]["state"]))


def save_while_training(work: Path, mode: str, rank: int) -> None:
    model, optimizer = build(mode)
    for step in range(2):
        train_step(model, optimizer, seed=100 * step + rank)
    expected = full_state(model, optimizer)
    if rank == 0:
        torch.save(expected, work / f"{mode}_expected.pt")
    checkpointer, report = AsyncCheckpointer(), {"rank": rank, "commits": []}
    directory = work / f"{mode}_checkpoint"

    def commit(step: int) -> None:
        report["commits"].append(step)
        if rank == 0:  # inside the commit: is every rank's data already written?
            report["files_at_commit"] = sorted(p.name for p in directory.iterdir())
            report["whole_checkpoint_at_commit"] = whole_checkpoint_on_rank0(directory, expected)

    step = 2
    checkpointer.start(model, optimizer, directory, on_done=lambda: commit(step))
    while True:  # training goes on: the first step changes every tensor the save holds
        step += 1
        train_step(model, optimizer, seed=100 * step + rank)
        if checkpointer.poll():
            break
    after = full_state(model, optimizer)
    if rank == 0:
        report["changed_after_start"] = not equal(after["model"], expected["model"])
    checkpointer.close()

    fresh, fresh_optimizer = build(mode)
    load_model_and_optimizer(fresh, fresh_optimizer, directory)
    loaded = full_state(fresh, fresh_optimizer)
    if rank == 0:
        report["loaded_on_two_equal"] = equal(loaded, expected)
    (work / f"{mode}_rank{rank}.json").write_text(json.dumps(report))


def main() -> None:
    work, modes = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")
    for mode in modes:
        save_while_training(work, mode, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
