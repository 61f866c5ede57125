"""The weight constraint on FSDP2 shards (two gloo processes, no training): after `fully_shard` every matrix is a
DTensor holding a block of rows per rank; training.distributed.apply_weight_constraints must give exactly what the
model's own constraint gives to the whole matrix, including nGPT's column norms of o_proj/down_proj, which sum over
both ranks' rows (tests/parallel/test_fsdp2.py trains)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from conftest import ARCHITECTURES

pytestmark = pytest.mark.parallel  # two processes: make test-parallel


def _worker(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
    from modeling_angpt.training.distributed import apply_weight_constraints

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2,))
    for architecture in ARCHITECTURES:
        torch.manual_seed(0)  # the same weights on both ranks
        config = AnGPTConfig(architecture=architecture, vocab_size=37, hidden_size=16, num_hidden_layers=2,
                             num_attention_heads=2, max_position_embeddings=32)
        model = AnGPTForCausalLM(config)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5 + torch.rand_like(p))
        whole = {k: v.clone() for k, v in model.state_dict().items()}
        reference = AnGPTForCausalLM(config)
        reference.load_state_dict(whole)
        reference.apply_weight_constraints()
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        apply_weight_constraints(model)
        for name, param in model.state_dict().items():
            gathered = param.full_tensor() if type(param).__name__ == "DTensor" else param
            error = float((gathered - reference.state_dict()[name]).abs().max())
            if rank == 0:
                results[(architecture, name)] = error
    dist.destroy_process_group()


def test_constraint_on_fsdp2_shards_equals_the_whole_matrix():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(port, results), nprocs=2, join=True)
    results = dict(results)
    assert {a for a, _ in results} == set(ARCHITECTURES)
    # rows are whole on each rank (bit-identical); a column's sum of squares is all-reduced (rounding order only)
    bad = {k: v for k, v in results.items() if v > 1e-6}
    assert not bad, bad
