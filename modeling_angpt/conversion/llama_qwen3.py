"""Conversion of transformers Llama and Qwen3 checkpoints into GPT+ (docs/architectures.md).

With `partial_rotary_factor=1`, QK-norm on and the source's MLP width, GPT+ is exactly Qwen3 (and, with
QK-norm off, exactly Llama), and the parameter names are the same: the conversion is key for key.
"""
from __future__ import annotations

from ..configuration_angpt import AnGPTConfig

SUPPORTED_MODEL_TYPES = {"qwen3": True, "llama": False}  # model_type -> has QK-norm


def _require(condition: bool, field: str, value, expected: str) -> None:
    if not condition:
        raise ValueError(f"cannot convert to GPT+: source config {field}={value!r}, expected {expected}")


def gptplus_config_from(source) -> AnGPTConfig:
    """The GPT+ config that reproduces a LlamaConfig or Qwen3Config exactly; refuses what GPT+ cannot express."""
    model_type = getattr(source, "model_type", None)
    _require(model_type in SUPPORTED_MODEL_TYPES, "model_type", model_type, f"one of {sorted(SUPPORTED_MODEL_TYPES)}")
    heads = source.num_attention_heads
    kv_heads = getattr(source, "num_key_value_heads", None) or heads
    _require(getattr(source, "hidden_act", "silu") == "silu", "hidden_act", source.hidden_act, "'silu'")
    _require(not getattr(source, "attention_bias", False), "attention_bias", True, "False (GPT+ has no biases)")
    _require(not getattr(source, "mlp_bias", False), "mlp_bias", True, "False (GPT+ has no biases)")
    _require(not getattr(source, "use_sliding_window", False), "use_sliding_window", True, "False")
    rope = dict(source.rope_parameters or {})
    rope_type = rope.get("rope_type", "default")
    _require(rope_type == "default", "rope_parameters['rope_type']", rope_type,
             "'default' (GPT+ has no exact equivalent of this RoPE scaling; refusing to approximate it)")
    return AnGPTConfig(
        architecture="gptplus",
        qk_norm=SUPPORTED_MODEL_TYPES[model_type],
        vocab_size=source.vocab_size,
        hidden_size=source.hidden_size,
        intermediate_size=source.intermediate_size,
        num_hidden_layers=source.num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=getattr(source, "head_dim", None) or source.hidden_size // heads,
        max_position_embeddings=source.max_position_embeddings,
        rms_norm_eps=source.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0),
                         "partial_rotary_factor": 1.0},
        tie_word_embeddings=bool(getattr(source, "tie_word_embeddings", False)),
        pad_token_id=source.pad_token_id, bos_token_id=source.bos_token_id, eos_token_id=source.eos_token_id,
    )


def gptplus_from_transformers(source_model):
    """Convert an in-memory LlamaForCausalLM / Qwen3ForCausalLM into an AnGPTForCausalLM (GPT+)."""
    from ..modeling_angpt import AnGPTForCausalLM

    config = gptplus_config_from(source_model.config)
    model = AnGPTForCausalLM(config).to(next(source_model.parameters()).dtype)
    source_state = source_model.state_dict()
    target_state = model.state_dict()
    missing = sorted(set(target_state) - set(source_state))
    unexpected = sorted(set(source_state) - set(target_state))
    if missing or unexpected:
        raise ValueError(f"cannot convert to GPT+: keys missing from the source {missing[:5]}, "
                         f"source keys with no GPT+ counterpart {unexpected[:5]}")
    for name, tensor in source_state.items():
        if tensor.shape != target_state[name].shape:
            raise ValueError(f"cannot convert to GPT+: tensor {name} has shape {tuple(tensor.shape)}, "
                             f"GPT+ expects {tuple(target_state[name].shape)}")
    model.load_state_dict(source_state, strict=True)
    return model.eval()
