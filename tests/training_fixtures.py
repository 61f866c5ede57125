"""Shared helpers for tests/test_training_*.py and tests/training/test_run_lock.py (imported by them; tests/conftest.py
belongs to the lead).

Every training test uses a tiny float32 anGPT-family model (d=32, 2 layers, blocks of 64 tokens) on a
slice of the real default corpus (Shakespeare), with a 512-token byte-level BPE trained once per test
session and cached, like the packed blocks, in one session-wide directory."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]

TINY = {
    "model": "angpt-tiny",
    "model_kwargs": {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 64},
    "max_corpus_chars": 200_000,
    "tokenizer_vocab_size": 512,
    "block_size": 64,
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 32,
    "learning_rate": 0.01,
    "max_steps": 60,
    "logging_steps": 10,
    "eval_steps": 30,
    "save_steps": 30,
    "eval_max_batches": 4,
    "disable_tqdm": True,
    "bf16": False,   # float32: exactness checks need it
}


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("angpt-data-cache")


@pytest.fixture
def write_recipe(tmp_path, data_cache):
    """write_recipe(**overrides) -> path of a recipe YAML for a tiny run under tmp_path."""
    def write(name: str = "recipe.yaml", **overrides) -> Path:
        values = {**TINY, "data_cache_dir": str(data_cache), "output_dir": str(tmp_path / "run"), **overrides}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(values))
        return path
    return write


def corpus_files(directory: Path, files: int, chars: int) -> Path:
    """A small corpus of `files` text files cut from the default corpus (`chars` characters each) in `directory`:
    one source shard per file for a stream or angpt prepare."""
    from modeling_angpt.data.sources import shakespeare_files

    directory.mkdir(parents=True, exist_ok=True)
    for index, path in enumerate(shakespeare_files()[:files]):
        (directory / f"part{index}.txt").write_text(path.read_text(errors="replace")[:chars])
    return directory


def max_row_norm(model) -> float:
    """Largest L2 norm of any row (last axis) of any matrix of the model (anGPT's row-ball constraint)."""
    return max(float(p.detach().norm(dim=-1).max()) for p in model.parameters() if p.ndim == 2)


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded 2-core machine spinning OpenMP
    threads multiply the wall time; restore the setting so other test modules are unaffected."""
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def fake_previous_run(run, recipe_path, **recipe_changes):
    """What an earlier run leaves: recipe.json (filled as training records it), a checkpoint, metrics."""
    from modeling_angpt.training.model_setup import build_config
    from modeling_angpt.training.recipe import load_recipe
    from modeling_angpt.training.run_dir import comparable_config, filled_recipe

    recipe = load_recipe(recipe_path, [f"{k}={v}" for k, v in recipe_changes.items()])
    config = build_config(recipe)
    step = run / "checkpoints" / "step_0000010"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 10}))
    (run / "recipe.json").write_text(json.dumps(filled_recipe(recipe, config)))
    (run / "model_config.json").write_text(json.dumps(comparable_config(config)))
    (run / "metrics.jsonl").write_text('{"step": 10, "loss": 9.9}\n')
