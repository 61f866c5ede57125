"""Shared pieces of the transformers-contract suite (tests/test_contract_*.py): tiny configs and models."""
from __future__ import annotations

import textwrap

import pytest
import torch

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM

VOCAB = 101

# The start of a child interpreter's script: it blocks `modeling_angpt` (installed editable here) before transformers
# is imported, and checks that it is blocked, so only the files saved beside a checkpoint can provide the model.
BLOCK_THE_PACKAGE = textwrap.dedent("""
    import importlib.abc, json, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "modeling_angpt" or name.startswith("modeling_angpt."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
    sys.meta_path.insert(0, Block())
    try:
        import modeling_angpt
        raise SystemExit("modeling_angpt is importable: the test would prove nothing")
    except ModuleNotFoundError:
        pass
""")


def config(architecture: str, **overrides) -> AnGPTConfig:
    """d=32, 2 layers, 4 heads, vocab 101: the size of conftest's tiny_config, usable outside a fixture."""
    fields = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, architecture=architecture)
    fields.update(overrides)
    return AnGPTConfig(**fields)


def causal_lm(architecture: str, implementation: str = "eager", **overrides) -> AnGPTForCausalLM:
    return AnGPTForCausalLM._from_config(config(architecture, **overrides), attn_implementation=implementation).eval()


def ids(batch: int = 2, length: int = 9, low: int = 0) -> torch.Tensor:
    return torch.randint(low, VOCAB, (batch, length))


@pytest.fixture
def single_thread():
    """One intra-op thread: these models are tiny, and on a loaded 2-core machine extra threads only wait (as in
    training_fixtures.py). Each test module uses it through `pytestmark`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
