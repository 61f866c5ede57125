"""Shared test setup: offline, deterministic, float32, tiny models on CPU."""
from __future__ import annotations

# first: it sets the offline environment before anything reads it; its autouse fixtures seed torch per test
from environment_fixtures import _deterministic, _isolated_hf_home  # noqa: F401, I001

import pytest
import torch

ARCHITECTURES = ("gptplus", "ngpt", "angpt")


@pytest.fixture
def tiny_config():
    """Factory for small configs: d=32, 2 layers, 4 heads, vocab 101."""
    from modeling_angpt import AnGPTConfig

    def make(architecture: str = "angpt", **overrides):
        fields = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=64, architecture=architecture)
        fields.update(overrides)
        return AnGPTConfig(**fields)

    return make


def fit_classifier(model, ids, labels, steps: int, lr: float) -> list[float]:
    """A few Adam steps with the architecture's weight constraint after each (as training does); the losses."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model.apply_weight_constraints()
        losses.append(loss.item())
    return losses


def pytest_ignore_collect(collection_path, config):
    """transformers' common tests (tests/contract/test_transformers_common.py) download transformers' sdist when
    imported: collect that module only when the run selects its marker (`make test-transformers`)."""
    if collection_path.name == "test_transformers_common.py":
        selection = config.getoption("markexpr") or ""
        return "transformers_common" not in selection.replace("not transformers_common", "")
    return None
