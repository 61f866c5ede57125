"""Recipes, overrides, optimiser and schedule, and the shipped configuration files (no training here)."""
import math

import pytest
import torch
import yaml
from training_fixtures import REPO

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training.model_setup import architecture_defaults
from modeling_angpt.training.optim import build_optimizer, build_scheduler, lr_multiplier
from modeling_angpt.training.recipe import (ARCHITECTURE_DEFAULTS, FALLBACK_DEFAULTS, apply_overrides, load_recipe,
                                            recipe_from_dict)


def test_overrides_coerce_to_the_declared_types(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"learning_rate": "3e-4", "max_steps": 10}))
    recipe = load_recipe(path, ["max_steps=25", "bf16=true", "learning_rate=1e-3", "report_to=jsonl",
                                "model_kwargs.attention_sparsity=topk", "weight_decay=0"])
    assert recipe.max_steps == 25 and recipe.bf16 is True
    assert recipe.learning_rate == pytest.approx(1e-3) and isinstance(recipe.weight_decay, float)
    assert recipe.report_to == ["jsonl"]
    assert recipe.model_kwargs == {"attention_sparsity": "topk"}


@pytest.mark.parametrize("bad, message", [
    ({"learning_rat": 0.1}, "unknown recipe key 'learning_rat'.*did you mean learning_rate"),
    ({"max_steps": "many"}, "max_steps='many' has the wrong type"),
    ({"max_steps": 0}, "max_steps=0 must be > 0"),
    ({"learning_rate": float("nan")}, "learning_rate=nan must be a finite number > 0"),
    ({"eval_max_batches": 0}, "eval_max_batches=0 must be > 0, or null"),
])
def test_bad_recipe_values_name_the_key(bad, message):
    with pytest.raises(ValueError, match=message):
        recipe_from_dict(bad)


def test_validation_is_capped_by_default_and_null_lifts_the_cap():
    """A recipe that keeps the defaults scores 8 batches of 16 blocks per process, whatever the corpus's size
    (docs/training.md, "Validation"); eval_max_batches: null scores every held-out block."""
    from modeling_angpt.data.loader import scored_validation_blocks

    default = recipe_from_dict({})
    assert scored_validation_blocks(default, 1_000_000) == 8 * 16
    assert scored_validation_blocks(default, 1_000_000, processes=2) == 2 * 8 * 16
    assert scored_validation_blocks(default, 50) == 50
    assert scored_validation_blocks(recipe_from_dict({"eval_max_batches": None}), 1_000_000) == 1_000_000


def test_override_of_unknown_key_suggests_close_names():
    with pytest.raises(ValueError, match="'per_device_batch_size'.*per_device_train_batch_size"):
        apply_overrides({}, ["per_device_batch_size=4"])


def _tiny(architecture):
    return AnGPTForCausalLM(AnGPTConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, architecture=architecture))


def test_architecture_fills_unset_optimiser_keys_and_recipe_wins():
    plus = recipe_from_dict({"max_steps": 100}).with_architecture_defaults(architecture_defaults(_tiny("gptplus")))
    assert (plus.optim, plus.weight_decay, plus.warmup_ratio, plus.min_lr_ratio) == ("adamw", 0.1, 0.2, 0.01)
    assert plus.lr_width_rule is None
    angpt = recipe_from_dict({"max_steps": 100, "warmup_ratio": 0.05}).with_architecture_defaults(
        architecture_defaults(_tiny("angpt")))
    assert angpt.optim == "adam" and angpt.weight_decay == 0.0 and angpt.warmup_ratio == 0.05  # the recipe wins
    assert (angpt.adam_beta1, angpt.adam_beta2, angpt.adam_epsilon) == (0.9, 0.95, 1e-9)
    assert (angpt.lr_width_rule, angpt.lr_base_width) == ("inverse_width", 128)
    ngpt = recipe_from_dict({}).with_architecture_defaults(architecture_defaults(_tiny("ngpt")))
    assert (ngpt.optim, ngpt.weight_decay, ngpt.warmup_ratio, ngpt.lr_width_rule) == ("adam", 0.0, 0.0, None)


def test_a_model_of_another_library_trains_with_the_fallback_defaults():
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    assert architecture_defaults(llama) == FALLBACK_DEFAULTS == ARCHITECTURE_DEFAULTS["gptplus"]


def test_gptplus_decays_matrices_only_and_schedule_matches_spec():
    model = _tiny("gptplus")
    recipe = recipe_from_dict({"max_steps": 100, "learning_rate": 1.0}).with_architecture_defaults(
        architecture_defaults(model))
    optimizer = build_optimizer(model, recipe)
    for group in optimizer.param_groups:
        assert all(p.ndim >= 2 for p in group["params"]) or group["weight_decay"] == 0.0
    assert any(g["weight_decay"] == 0.1 for g in optimizer.param_groups)
    scheduler = build_scheduler(optimizer, recipe)
    lrs = []
    for _ in range(100):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(1 / 20) and lrs[19] == pytest.approx(1.0)  # 20 % linear warm-up
    assert lrs[-1] == pytest.approx(0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * 79 / 80)))
    assert lr_multiplier(100, 100, 0, "cosine", 0.01) == pytest.approx(0.01)  # floor at 0.01 × peak


def test_shipped_recipes_and_presets_load():
    for path in sorted((REPO / "configuration" / "recipes").glob("*.yaml")):
        load_recipe(path)
    sizes = {}
    for arch in ("angpt", "ngpt", "gptplus"):
        for name in ("10m", "0.5b", "1b"):
            from transformers import AutoConfig
            config = AutoConfig.from_pretrained(REPO / "configuration" / "presets" / f"{arch}-{name}.json")
            assert config.architecture == arch
            with torch.device("meta"):
                model = AnGPTForCausalLM(config)
            sizes[arch, name] = sum(p.numel() for p in model.parameters())
    paper = AutoConfig.from_pretrained(REPO / "configuration" / "presets" / "angpt-0.5b.json")
    assert (paper.hidden_size, paper.num_hidden_layers, paper.num_attention_heads) == (1024, 24, 16)
    assert 9e6 < sizes["angpt", "10m"] < 12e6 and 0.45e9 < sizes["angpt", "0.5b"] < 0.56e9
    assert 0.95e9 < sizes["gptplus", "1b"] < 1.15e9


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file
    configs = {p.stem: load_config_from_file(str(p))
               for p in (REPO / "configuration" / "accelerate").glob("*.yaml")}
    assert configs["a100x8_ddp"].num_processes == 8
    fsdp = configs["a100x8_fsdp2"]
    assert fsdp.fsdp_config["fsdp_version"] == 2
    assert fsdp.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "AnGPTDecoderLayer"
    assert configs["cpu_2proc"].num_processes == 2


def test_split_is_deterministic_disjoint_and_independent_of_the_training_seed():
    import numpy as np
    from modeling_angpt.data.blocks import split_blocks
    blocks = np.arange(200 * 4).reshape(200, 4)
    train_a, val_a = split_blocks(blocks, 0.1, seed=7)
    train_b, val_b = split_blocks(blocks, 0.1, seed=7)
    assert len(val_a) == 20 and len(train_a) == 180
    np.testing.assert_array_equal(val_a, val_b)
    assert not set(train_a[:, 0]) & set(val_a[:, 0])                  # no block in both
    assert set(train_a[:, 0]) | set(val_a[:, 0]) == set(blocks[:, 0])  # none lost


def test_a_dataset_directory_ignores_the_cache_written_beside_it(tmp_path):
    from modeling_angpt.data.sources import resolve_source

    (tmp_path / "a.txt").write_text("hello")
    cache = tmp_path / ".angpt_cache" / "tokenizer-bpe300-x"
    cache.mkdir(parents=True)
    (cache / "tokenizer.json").write_text("{}")  # what a first run leaves behind
    assert [p.rsplit("/", 1)[-1] for p in resolve_source(str(tmp_path)).files] == ["a.txt"]


def _corpus_with_numbers(tmp_path):
    import random

    rng = random.Random(0)
    tmp_path.mkdir()
    lines = [f"Order {rng.randint(1000, 99999)} shipped on day {rng.randint(1, 31)} for {rng.randint(10, 999)} units."
             for _ in range(3000)]
    (tmp_path / "numbers.txt").write_text("\n\n".join(lines))
    return tmp_path


def _trained_tokenizer(corpus, tmp_path, **keys):
    from modeling_angpt.data.build import load_texts
    from modeling_angpt.data.sources import resolve_corpus
    from modeling_angpt.data.tokenizer import get_tokenizer

    recipe = recipe_from_dict({"dataset": str(corpus), "tokenizer_vocab_size": 400, "data_cache_dir": str(tmp_path / "cache"),
                               **keys})
    corpus = resolve_corpus(recipe)
    return get_tokenizer(recipe, corpus, load_texts(corpus.source, recipe))


def test_split_digits_makes_a_number_the_same_digit_tokens_wherever_it_stands(tmp_path):
    corpus = _corpus_with_numbers(tmp_path / "data")
    plain = _trained_tokenizer(corpus, tmp_path)
    split = _trained_tokenizer(corpus, tmp_path, tokenizer_split_digits=True)
    assert plain.name_or_path != split.name_or_path  # cached apart: neither run adopts the other's tokenizer

    def number_tokens(tokenizer, text):
        pieces = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
        return [p for p in pieces if any(c.isdigit() for c in p)], tokenizer.decode(tokenizer(text)["input_ids"])

    for text in ("The magic number is 9004803.", "Answer: Lima=9004803;Riga=1234567"):
        tokens, decoded = number_tokens(split, text)
        assert decoded == text
        assert all(len(t) == 1 for t in tokens)  # one token per digit, never merged with text or other digits
    in_needle = split(" is 9004803.")["input_ids"]
    in_answer = split("=9004803;")["input_ids"]
    digits = [split.convert_tokens_to_ids(d) for d in "9004803"]
    for ids in (in_needle, in_answer):
        assert any(ids[i:i + 7] == digits for i in range(len(ids) - 6))
    # the oracle: trained on the same numbers-heavy text, the plain BPE does merge digits
    assert any(len(t) > 1 for t in number_tokens(plain, "Order 12345 shipped")[0])


def test_split_digits_with_a_named_tokenizer_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="tokenizer_split_digits"):
        recipe_from_dict({"tokenizer": "gpt2", "tokenizer_split_digits": True})
