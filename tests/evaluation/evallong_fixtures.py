"""Tiny trained checkpoints for the length and needle evaluation tests (tests/test_eval_length.py,
tests/test_eval_needle.py): `angpt train` for one step on a slice of the default corpus, so each checkpoint
carries what real ones carry (tokenizer, training_metadata.json with its recipe, the cached data split)."""
from __future__ import annotations

import json

import pytest
import yaml
from training_fixtures import TINY, data_cache  # noqa: F401 (session fixture re-exported)

from modeling_angpt.training import load_recipe, train


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, data_cache):  # noqa: F811
    """tiny_checkpoint(block_size, **model_kwargs) -> final dir of a one-step run (cached per arguments)."""
    made = {}

    def make(block_size: int, **model_kwargs):
        key = json.dumps([block_size, model_kwargs], sort_keys=True)
        if key not in made:
            root = tmp_path_factory.mktemp("ckpt")
            values = {**TINY, "data_cache_dir": str(data_cache), "output_dir": str(root / "run"),
                      "block_size": block_size, "max_steps": 1, "eval_steps": 0, "save_steps": 0,
                      "per_device_train_batch_size": 2, "report_to": ["none"],
                      "model_kwargs": {**TINY["model_kwargs"], "max_position_embeddings": block_size, **model_kwargs}}
            (root / "recipe.yaml").write_text(yaml.safe_dump(values))
            made[key] = train(load_recipe(root / "recipe.yaml")).final_dir
        return made[key]

    return make
