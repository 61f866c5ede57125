"""AnGPTConfig: HF-canonical fields, every SPEC flag reachable, clear errors for bad values."""
import pytest
from transformers import AutoConfig

from modeling_angpt import AnGPTConfig


def test_defaults_follow_spec():
    config = AnGPTConfig(hidden_size=64, num_attention_heads=4)
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
