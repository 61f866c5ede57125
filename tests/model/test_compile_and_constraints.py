"""Compiled training: regional compilation without graph breaks, the same losses as eager,
and the grouped weight constraint bit-identical to the per-matrix one."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import ARCHITECTURES
from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training.model_setup import compile_blocks


def _model(architecture: str, layers: int = 3, dtype=torch.float32) -> AnGPTForCausalLM:
    config = AnGPTConfig(architecture=architecture, vocab_size=101, hidden_size=32, num_hidden_layers=layers,
                         num_attention_heads=4, max_position_embeddings=64, use_cache=False)
    return AnGPTForCausalLM._from_config(config, attn_implementation="sdpa").to(dtype).train()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_grouped_constraint_is_bit_identical_to_per_matrix(architecture, dtype):
    model = _model(architecture, dtype=dtype)
    with torch.no_grad():  # rows and columns off the unit sphere, some inside and some outside the ball
        for p in model.parameters():
            p.mul_(0.5 + torch.rand_like(p))
    reference = copy.deepcopy(model)
    strategy = reference.architecture_strategy
    for weight, residual_output in reference.constrained_matrices():
        strategy.constrain(weight, residual_output)
    model.apply_weight_constraints()
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


def _train(model, steps: int = 3) -> list[float]:
    torch.manual_seed(1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 101, (2, 16))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.apply_weight_constraints()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("architecture", [pytest.param(a, marks=() if a == "angpt" else pytest.mark.slow)
                                          for a in ARCHITECTURES])
def test_compiled_blocks_trace_one_graph_without_breaks_and_match_eager(architecture):
    """fullgraph=True makes any graph break an error; one graph for both blocks means the warm-up does not grow
    with depth. aot_eager traces forward and backward (AOT autograd) without inductor's minutes of C++ builds on
    CPU; inductor itself runs in the gpu-marked tests and bench/gpu_suite.sh."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    eager = _model(architecture, layers=2)
    compiled = copy.deepcopy(eager)
    assert compile_blocks(compiled, fullgraph=True, backend="aot_eager") == 2
    compiled_losses = _train(compiled, steps=2)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert compiled_losses == pytest.approx(_train(eager, steps=2), rel=1e-5, abs=1e-5)
