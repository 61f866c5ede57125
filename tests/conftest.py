"""Shared test setup: offline, deterministic, float32, tiny models on CPU."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

ARCHITECTURES = ("gptplus", "ngpt", "angpt")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session", autouse=True)
def _isolated_hf_home(tmp_path_factory):
    # Remote-code modules are cached under HF_HOME; keep each run's cache out of the user's home.
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf_home"))
    yield


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


@pytest.fixture
def semantic_focus_bench():
    """bench/semantic_focus.py as a module of its own (bench/ is scripts, not a package)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "bench" / "semantic_focus.py"
    spec = importlib.util.spec_from_file_location("bench_semantic_focus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
