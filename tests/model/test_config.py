"""AnGPTConfig: HF-canonical fields, every [flag] choice reachable, clear errors for bad values."""
import logging

import pytest
from transformers import AutoConfig
from transformers.utils import logging as transformers_logging

from modeling_angpt import AnGPTConfig
from modeling_angpt.configuration_angpt import ROPE_TYPES


def test_defaults_follow_spec():
    config = AnGPTConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2)  # shallow: the paper's α
    assert config.model_type == "angpt" and config.architecture == "angpt"
    assert config.intermediate_size == 4 * 64 and config.head_dim == 16
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    assert (config.alpha_shape, config.alpha_init, config.alpha_abs, config.gate_sqrt_d, config.nu_att) == (
        "vector", 0.05, False, "gate", 1.0)
    assert config.tie_word_embeddings is False and config.is_causal and not config.folded


def test_round_trip_through_autoconfig(tmp_path):
    config = AnGPTConfig(architecture="ngpt", hidden_size=48, num_attention_heads=3, alpha_shape="scalar",
                         rope_parameters={"rope_theta": 500.0, "partial_rotary_factor": 1.0})
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, AnGPTConfig)
    drop = {"_name_or_path"}
    assert {k: v for k, v in loaded.to_dict().items() if k not in drop} == {
        k: v for k, v in config.to_dict().items() if k not in drop}


@pytest.mark.parametrize("field, value, words", [
    ("architecture", "transformer", ["architecture", "'angpt'", "'ngpt'", "'gptplus'"]),
    ("alpha_shape", "matrix", ["alpha_shape", "'vector'", "'scalar'"]),
    ("gate_sqrt_d", "up", ["gate_sqrt_d", "'gate'", "'both'"]),
    ("nu_att", 0, ["nu_att", "positive"]),
    ("hidden_size", -8, ["hidden_size", "positive"]),
    ("num_attention_heads", 5, ["hidden_size", "num_attention_heads"]),
    ("intermediate_size", 100, ["intermediate_size", "4*hidden_size"]),
    ("attention_logit_transform", "cosine", ["attention_logit_transform", "'scale_invariant'"]),
    ("attention_sparsity", "random", ["attention_sparsity", "'topk'"]),
    ("rope_parameters", {"rope_type": "spiral"}, ["rope_type", "'default'"]),
    ("rope_parameters", {"partial_rotary_factor": 1.5}, ["partial_rotary_factor", "[0, 1]"]),
])
def test_bad_values_name_the_field(field, value, words):
    with pytest.raises(ValueError) as error:
        AnGPTConfig(**{"hidden_size": 64, "num_attention_heads": 4, field: value})
    for word in words:
        assert word in str(error.value)


def test_gptplus_accepts_any_mlp_width():
    assert AnGPTConfig(architecture="gptplus", hidden_size=64, intermediate_size=100).intermediate_size == 100


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_every_rope_type_saves_without_a_transformers_warning(tmp_path, rope_type):
    """save_pretrained runs transformers' own RoPE validation again; our types (scale_invariant_p, none) have
    validators, so saving a p-RoPE or NoPE model warns of nothing, while a key no type knows still warns."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = transformers_logging.get_logger("transformers")
    logger.addHandler(handler)
    try:
        rope = {"rope_type": rope_type, **({"factor": 2.0} if rope_type in ("dynamic", "yarn", "linear") else {})}
        AnGPTConfig(hidden_size=64, num_attention_heads=4, rope_parameters=rope).save_pretrained(tmp_path)
        assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
        AnGPTConfig(hidden_size=64, num_attention_heads=4, rope_parameters={**rope, "spin": 1.0}).validate_rope()
        assert any("Unrecognized keys" in r.getMessage() and "spin" in r.getMessage() for r in records)
    finally:
        logger.removeHandler(handler)


def test_alpha_init_default_follows_the_depth_rule():
    """A config without alpha_init gets the papers' 0.05 while anGPT's α·L stays within the limit the seed sweep
    found (experiments/deep_alpha: α·L = 0.10, clean in 10 seeds of 10 at 24 layers), and that limit / L beyond; nGPT
    renormalises exactly and keeps 0.05."""
    from modeling_angpt.architectures_angpt import ALPHA_DEPTH_LIMIT

    hand_built = AnGPTConfig(architecture="angpt", num_hidden_layers=24, hidden_size=256, num_attention_heads=4)
    assert hand_built.alpha_init * 24 <= ALPHA_DEPTH_LIMIT + 1e-9
    assert hand_built.alpha_init == pytest.approx(0.10 / 24)  # the sweep's limit
    for layers in range(1, 49):
        alpha = AnGPTConfig(architecture="angpt", num_hidden_layers=layers, hidden_size=32, num_attention_heads=2).alpha_init
        assert alpha * layers <= ALPHA_DEPTH_LIMIT + 1e-9, layers
        shallow = 0.05 * layers <= ALPHA_DEPTH_LIMIT + 1e-9
        assert alpha == pytest.approx(0.05 if shallow else ALPHA_DEPTH_LIMIT / layers), layers
    assert AnGPTConfig(architecture="angpt", num_hidden_layers=2).alpha_init == 0.05  # the paper's, shallow
    assert AnGPTConfig(architecture="ngpt", num_hidden_layers=24).alpha_init == 0.05


def test_explicit_and_resolved_alpha_init_survive_save_and_reload(tmp_path):
    """An explicit alpha_init is kept whatever the depth rule says, through save_pretrained and back; a resolved
    default is saved as the number it resolved to; a stored value (a checkpoint from before the rule) loads as it
    is; a config.json without the key gets the rule."""
    import json

    explicit = AnGPTConfig(architecture="angpt", num_hidden_layers=24, alpha_init=0.05)
    assert explicit.alpha_init == 0.05
    explicit.save_pretrained(tmp_path / "explicit")
    assert json.loads((tmp_path / "explicit" / "config.json").read_text())["alpha_init"] == 0.05
    assert AutoConfig.from_pretrained(tmp_path / "explicit").alpha_init == 0.05
    resolved = AnGPTConfig(architecture="angpt", num_hidden_layers=24)
    resolved.save_pretrained(tmp_path / "resolved")
    assert json.loads((tmp_path / "resolved" / "config.json").read_text())["alpha_init"] == resolved.alpha_init
    assert AutoConfig.from_pretrained(tmp_path / "resolved").alpha_init == resolved.alpha_init
    stored = json.loads((tmp_path / "explicit" / "config.json").read_text())
    stored["alpha_init"] = 0.03
    (tmp_path / "explicit" / "config.json").write_text(json.dumps(stored))
    assert AutoConfig.from_pretrained(tmp_path / "explicit").alpha_init == 0.03
    del stored["alpha_init"]
    (tmp_path / "explicit" / "config.json").write_text(json.dumps(stored))
    assert AutoConfig.from_pretrained(tmp_path / "explicit").alpha_init == pytest.approx(0.10 / 24)
