"""End-to-end CPU training on real text (the default Shakespeare corpus), float32, tiny models."""
import json
import re

import numpy as np
import pytest
from training_fixtures import data_cache, max_row_norm, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt.training import NonFiniteLossError, load_recipe, train
from modeling_angpt.training.checkpoints import list_checkpoints


@pytest.mark.parametrize("architecture", ["gptplus", "ngpt", "angpt"])
def test_sixty_steps_lower_validation_loss(architecture, write_recipe, tmp_path):
    recipe = load_recipe(write_recipe(), [f"architecture={architecture}"])
    result = train(recipe)
    steps, vals = zip(*result.val_losses)
    assert steps == (0, 30, 60) and result.step == 60
    assert vals[-1] < vals[0] - 0.5, f"{architecture}: validation loss {vals[0]:.3f} -> {vals[-1]:.3f}"
    if architecture == "angpt":
        assert max_row_norm(result.model) <= 1 + 1e-5   # anGPT's row-ball constraint held to the end

    # What the run leaves behind: final model + tokenizer that the Auto classes reload, metadata, metrics.
    from transformers import AutoModelForCausalLM, AutoTokenizer
    final = tmp_path / "run" / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.config.architecture == architecture and model.config.vocab_size == len(tokenizer)
    meta = json.loads((final / "training_metadata.json").read_text())
    assert meta["tokens_seen"] == 60 * 8 * 64 and meta["final_val_loss"] == pytest.approx(vals[-1])
    assert meta["dataset"].startswith("shakespeare")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "loss" in r]
    assert [r["step"] for r in logged] == [10, 20, 30, 40, 50, 60]
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in logged)
    # each evaluation: tokens seen and the norms the architecture's constants assume (training/norm_health.py)
    evaluations = [r for r in rows if "val_loss" in r]
    assert [r["tokens"] for r in evaluations] == [0, 30 * 8 * 64, 60 * 8 * 64]
    norms = {"gptplus": set(), "ngpt": {"h_dist"}, "angpt": {"h", "attn", "mlp"}}[architecture]
    assert {k.split("/")[1].rsplit("_", 1)[0] for k in evaluations[-1] if k.startswith("norm/")} == norms
    assert (tmp_path / "run" / "loss_curve.png").stat().st_size > 10_000
    # Accelerate's TensorBoard tracker: OUTPUT_DIR/logs/<run directory name>/ (training/trackers.py)
    assert list((tmp_path / "run" / "logs" / "run").glob("events.out.tfevents.*"))


def test_kill_and_resume_reproduces_the_uninterrupted_losses(write_recipe, tmp_path):
    # A 12k-character slice gives fewer than 20 batches per epoch, so the resumed stretch crosses an epoch
    # boundary (the reshuffle must be the one the uninterrupted run drew).
    common = ["max_steps=40", "eval_steps=0", "save_steps=10", "save_total_limit=2", "max_corpus_chars=12000"]
    full = train(load_recipe(write_recipe(), common + [f"output_dir={tmp_path / 'full'}"]))
    parted = load_recipe(write_recipe(), common + [f"output_dir={tmp_path / 'parted'}"])
    first = train(parted, stop_after_steps=20)
    assert first.final_dir is None and first.step == 20
    resumed = train(parted, resume=True)

    assert resumed.start_step == 20 and len(resumed.losses) == 40
    np.testing.assert_allclose(resumed.losses, full.losses, rtol=0, atol=1e-6)
    kept = [p.name for p in list_checkpoints(tmp_path / "parted")]
    assert kept == ["step_0000030", "step_0000040"]               # save_total_limit=2
    assert not list((tmp_path / "parted" / "checkpoints").glob(".tmp*"))
    state = json.loads((tmp_path / "parted" / "checkpoints" / "step_0000040" / "trainer_state.json").read_text())
    assert state["batches"] == 40 and state["rng"]["sampler_epoch"] >= 2


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(write_recipe, tmp_path):
    # A learning rate of 1e30 makes the weights overflow within a few steps.
    recipe = load_recipe(write_recipe(), ["architecture=gptplus", "learning_rate=1e30", "warmup_ratio=0",
                                          "save_steps=1", "eval_steps=0", "max_steps=20"])
    with pytest.raises(NonFiniteLossError, match=r"non-finite (training loss|gradient norm) \((nan|inf)\) at step (\d+)") as info:
        train(recipe)
    step = int(re.search(r"at step (\d+)", info.value.args[0]).group(1))
    assert info.value.step == step  # benchmarks read where a run diverged from the error, not its text
    # the knob to turn: the matrices' rate at that step (GPT+ has no α)
    assert re.search(r"at step \d+ with matrices' learning rate [0-9.]+e\+(29|30); stopped", info.value.args[0])
    last = tmp_path / "run" / "checkpoints" / f"step_{step - 1:07d}"
    assert str(last) in str(info.value) and (last / "model.safetensors").is_file()
    assert not (tmp_path / "run" / "final").exists()


def test_accumulation_and_checkpointing_reproduce_the_plain_step(write_recipe, tmp_path):
    # Batch 8 in one go vs 2 micro-batches of 4 with gradient checkpointing: the seeded sampler draws
    # the same samples in the same order, so each optimiser step sees the same 8 blocks.
    common = ["max_steps=5", "eval_steps=0", "save_steps=0", "report_to=none"]
    plain = train(load_recipe(write_recipe(), common + [f"output_dir={tmp_path / 'plain'}"]))
    accumulated = train(load_recipe(write_recipe(), common + [
        f"output_dir={tmp_path / 'acc'}", "per_device_train_batch_size=4", "gradient_accumulation_steps=2",
        "gradient_checkpointing=true"]))
    np.testing.assert_allclose(accumulated.losses, plain.losses, rtol=0, atol=2e-5)
    assert accumulated.tokens_seen == plain.tokens_seen == 5 * 8 * 64
    assert accumulated.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps mixed precision in a process-wide singleton: reset it around a test that changes it (as
    accelerate's own AccelerateTestCase does), so neither this test nor the float32 ones after it inherit it."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.parametrize("ratio, precision", [(0.01, "no"), (2.0, "bf16")])
def test_bf16_on_a_cpu_without_native_bfloat16_trains_in_float32_and_says_so(ratio, precision, write_recipe,
                                                                             monkeypatch, fresh_accelerate_state):
    """bf16: true is for speed: where this CPU's bfloat16 matmul is far slower than its float32 one (AVX2 only:
    ~100x), the run trains in float32 with one warning naming the key; where bfloat16 is fast it autocasts."""
    import warnings

    import torch

    from modeling_angpt.training import loop, metrics

    measured = metrics.cpu_bf16_speed_ratio(size=64, seconds=0.01)  # the real probe: a finite positive ratio
    assert 0 < measured < float("inf")
    monkeypatch.setattr(metrics, "cpu_bf16_speed_ratio", lambda: ratio)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(load_recipe(write_recipe(), ["bf16=true", "max_steps=2", "eval_steps=0", "save_steps=0"]))
    assert result.accelerator.mixed_precision == precision
    fallback = [str(w.message) for w in caught if "bf16" in str(w.message)]
    assert (len(fallback) == 1 and "float32" in fallback[0]) if precision == "no" else not fallback
    with result.accelerator.autocast():  # what the training forward ran under
        product = torch.ones(2, 2) @ torch.ones(2, 2)
    assert product.dtype == (torch.float32 if precision == "no" else torch.bfloat16)
