"""The setup every test shares, under tests/ and experiments/ alike (each conftest.py imports it): offline, no
tokenizer threads, torch seeded before each test, and a Hugging Face cache of the run's own."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one thread each, no oversubscription
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session", autouse=True)
def _isolated_hf_home(tmp_path_factory):
    # Remote-code modules are cached under HF_HOME; keep each run's cache out of the user's home.
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf_home"))
    yield
