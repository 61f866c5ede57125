"""The tensor- and pipeline-parallel plans each architecture declares (docs/architectures.md, "Tensor and pipeline
parallelism"), checked on one process against the model they describe; tests/parallel runs them on two."""
from __future__ import annotations

import pytest
from torch import nn
from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES, replace_layer_number_by_wildcard

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM

SHAPE = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# the per-feature vectors that multiply a split projection's outputs, by the projection
SPLIT_WITH = {"self_attn.qk_scale": "self_attn.k_proj", "self_attn.query_gain": "self_attn.q_proj",
              "mlp.up_scale": "mlp.up_proj", "mlp.gate_scale": "mlp.gate_proj"}


def _model(architecture: str, folded: bool) -> AnGPTForCausalLM:
    model = AnGPTForCausalLM(AnGPTConfig(architecture=architecture, **SHAPE))
    return model.fold() if folded else model


def _halve(attention: nn.Module, *names: str) -> None:
    """Each named projection replaced by one of half its output features: one rank's part of a split."""
    for name in names:
        linear = getattr(attention, name)
        setattr(attention, name, nn.Linear(linear.in_features, linear.out_features // 2, bias=False))


@pytest.mark.parametrize("folded", [False, True], ids=["training", "folded"])
@pytest.mark.parametrize("architecture", ["gptplus", "ngpt", "angpt"])
def test_the_plan_splits_every_projection_and_every_scale_with_its_projection(architecture, folded):
    model = _model(architecture, folded)
    plan = model.tp_plan
    names = {replace_layer_number_by_wildcard(n) for n, _ in [*model.named_modules(), *model.named_parameters()]}
    assert set(plan) <= names and set(plan.values()) <= set(ALL_PARALLEL_STYLES)  # every rule names something
    layer = "model.layers.*."
    for name, module in model.model.layers[0].named_modules():
        if isinstance(module, nn.Linear):
            assert plan[layer + name] == ("rowwise" if getattr(module, "residual_output", False) else "colwise")
    assert plan["lm_head"] == "colwise_gather_output"
    block = model.model.layers[0]
    scales = {name for name in SPLIT_WITH if getattr(block.get_submodule(name.split(".")[0]), name.split(".")[1])
              is not None}
    for name in scales - {"self_attn.query_gain"}:  # the vector split like its projection's outputs, its module
        assert plan[layer + name + ".weight"] == plan[layer + SPLIT_WITH[name]] == "colwise"  # run on this rank's part
        assert plan[layer + name] == "local_params"
    if "self_attn.query_gain" in scales:  # the folded c_q: a map from 1, split as a linear layer (layers_angpt.Gain)
        assert plan[layer + "self_attn.query_gain"] == "colwise"
    expected = {"gptplus": set(), "ngpt": {"self_attn.qk_scale", "mlp.up_scale", "mlp.gate_scale"}}
    expected["angpt"] = expected["ngpt"]
    assert scales == ({"self_attn.query_gain"} if folded and architecture != "gptplus" else expected[architecture])
    # whatever else is a vector stays whole: it multiplies the whole (replicated) stream or the gathered logits
    whole = [n for n, p in model.named_parameters() if p.ndim == 1 and replace_layer_number_by_wildcard(n) not in plan
             and replace_layer_number_by_wildcard(n).rpartition(".")[0] not in plan]
    assert all(any(part in n for part in ("alpha", "layernorm", "model.norm", "logit_scale")) for n in whole), whole


@pytest.mark.parametrize("architecture", ["gptplus", "ngpt", "angpt"])
def test_the_pipeline_plan_names_each_stage_module_and_what_it_hands_on(architecture):
    """The stages transformers cuts (tests/parallel runs two of them): embeddings, the layers, the final norm (an
    identity for nGPT/anGPT), the head; each module named exists."""
    model = _model(architecture, False)
    plan = model.pp_plan
    assert plan == {"model.embed_tokens": (["input_ids"], ["inputs_embeds"]),
                    "model.layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
                    "model.norm": (["hidden_states"], ["hidden_states"]), "lm_head": (["hidden_states"], ["logits"])}
    assert all(model.get_submodule(name) is not None for name in plan)


def test_a_runtime_that_splits_q_proj_but_not_the_query_gain_is_told_in_one_line():
    """What a runtime splitting by other rules than the plan's would meet in a folded nGPT/anGPT: this rank's q holds
    half the heads, c_q all of them."""
    import re

    import torch

    from modeling_angpt.modeling_angpt import QUERY_GAIN_UNSPLIT

    model = _model("angpt", True)
    _halve(model.model.layers[0].self_attn, "q_proj")
    with pytest.raises(ValueError, match="^" + re.escape(QUERY_GAIN_UNSPLIT)):
        model(input_ids=torch.arange(5)[None])


def test_logn_splits_its_per_head_scale_with_q_proj_and_a_runtime_that_does_not_is_told_in_one_line():
    import re

    import torch

    from modeling_angpt.modeling_angpt import QUERY_HEAD_SCALE_UNSPLIT

    model = AnGPTForCausalLM(AnGPTConfig(architecture="ngpt", attention_logit_transform="logn", **SHAPE)).eval()
    plan = model.tp_plan
    assert plan["model.layers.*.self_attn.query_head_scale"] == plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.*.self_attn"] == "local_params"  # the attention runs on this rank's part of s_h
    attention = model.model.layers[0].self_attn
    _halve(attention, "q_proj", "k_proj", "v_proj")  # split as vLLM would, s_h left whole
    attention.qk_scale.weight = nn.Parameter(attention.qk_scale.weight[: attention.qk_scale.weight.numel() // 2])
    with pytest.raises(ValueError, match="^" + re.escape(QUERY_HEAD_SCALE_UNSPLIT)):
        model(input_ids=torch.arange(5)[None])


def test_alibi_under_a_split_is_refused_in_one_line():
    """ALiBi's slopes are computed from the config for every head; a rank holding half of them cannot tell which."""
    import torch

    from modeling_angpt.modeling_angpt import HEAD_VALUES_UNSPLIT

    model = AnGPTForCausalLM(AnGPTConfig(architecture="gptplus", attention_logit_transform="alibi", **SHAPE)).eval()
    _halve(model.model.layers[0].self_attn, "q_proj", "k_proj", "v_proj")
    with pytest.raises(ValueError) as refused:
        model(input_ids=torch.arange(5)[None])
    assert str(refused.value) == f"attention_logit_transform='alibi': {HEAD_VALUES_UNSPLIT}"


@pytest.mark.parametrize("architecture", ["ngpt", "angpt"])
def test_the_folded_query_gain_is_a_linear_layer_only_where_vllm_builds_the_model(architecture, monkeypatch):
    """Tools that take every nn.Linear (torchao's quantize_, PEFT's all-linear, GPTQ/AWQ-style walkers) meet no
    c_q; vLLM, which splits only nn.Linear modules, builds it as one (layers_angpt.gain_for). Both hold the same
    weight [H·d_h, 1] under the same name, so one checkpoint loads into either."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from modeling_angpt.layers_angpt import LinearGain

    model = _model(architecture, True)
    gain = model.model.layers[0].self_attn.query_gain
    assert not isinstance(gain, nn.Linear) and gain.weight.shape == (32, 1)
    config = model.config
    # vLLM registers its attention function as "vllm" and names it in the config before it builds the model
    monkeypatch.setitem(AttentionInterface._global_mapping, "vllm", sdpa_attention_forward)
    config._attn_implementation = "vllm"
    built = AnGPTForCausalLM(config)
    assert type(built.model.layers[0].self_attn.query_gain) is LinearGain
    built.load_state_dict(model.state_dict())
    assert torch.equal(built.model.layers[0].self_attn.query_gain.weight, gain.weight)
