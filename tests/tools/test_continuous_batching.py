"""transformers' continuous batching (`model.generate_batch`, the paged KV cache `PagedAttentionCache`) gives the tokens
`generate` gives, greedily, for the three architectures in training and folded form (docs/tools.md, "continuous
batching"); what its paged path cannot compute is refused in one line. Also: dynamic NTK in a padding-free packed batch
scales each sequence by its own length, as when it runs alone.

The oracle is `generate` on each prompt alone (the model's own backends and DynamicCache). The batching here is
small on purpose (8 tokens per batch): prompts are prefilled in chunks, and requests prefill while others decode.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, ContinuousBatchingConfig, GenerationConfig

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.export.fold import export_checkpoint

from checkpoint_fixtures import save_source
from conftest import ARCHITECTURES

PROMPTS = [[5, 7, 9, 11], [3, 4], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
GREEDY = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
SMALL_BATCHES = dict(page_size=16, num_blocks=16, max_batch_tokens=8)  # CPU: the defaults size a cache from RAM


def tiny(architecture: str, **overrides) -> AnGPTConfig:
    fields = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, architecture=architecture)
    return AnGPTConfig(**{**fields, **overrides})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each architecture as `angpt train` saves it (scales moved off their init) and as `angpt export` folds it."""
    paths = {}
    for architecture in ARCHITECTURES:
        root = tmp_path_factory.mktemp(architecture)
        save_source(root / "training", lambda arch, **kw: tiny(arch, **kw), architecture)
        export_checkpoint(str(root / "training"), str(root / "folded"))
        paths[architecture] = root
    return paths


def greedy_alone(model, prompts=PROMPTS) -> list[list[int]]:
    return [model.generate(torch.tensor([prompt]), generation_config=GREEDY)[0, len(prompt):].tolist()
            for prompt in prompts]


def continuous_batching(model, prompts=PROMPTS) -> list[list[int]]:
    outputs = model.generate_batch(prompts, generation_config=GREEDY,
                                   continuous_batching_config=ContinuousBatchingConfig(**SMALL_BATCHES))
    ordered = sorted(outputs.values(), key=lambda output: int(output.request_id.split("_")[-1]))
    assert [output.error for output in ordered] == [None] * len(prompts)
    return [output.generated_tokens for output in ordered]


@pytest.mark.tools
@pytest.mark.parametrize("form", ["training", "folded"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_generate_batch_equals_generate(checkpoints, architecture, form):
    model = AutoModelForCausalLM.from_pretrained(checkpoints[architecture] / form, dtype=torch.float32).eval()
    assert model.config.folded == (form == "folded")
    expected = greedy_alone(model)
    for implementation in ("sdpa", "eager"):  # the manager runs transformers' "sdpa" and "paged|eager"
        model.set_attn_implementation(implementation)
        assert continuous_batching(model) == expected, implementation
    assert model.config._attn_implementation == "eager"  # the manager gave the model's implementation back


@pytest.mark.tools
def test_logn_runs_in_the_paged_path():
    """LogN is a query scaling: its n = position + 1 comes from the flattened batch's positions."""
    model = AnGPTForCausalLM(tiny("angpt", attention_logit_transform="logn")).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.query_head_scale.mul_(3.0)  # far from its init, so a wrong n shows
    assert continuous_batching(model) == greedy_alone(model)


@pytest.mark.tools
@pytest.mark.parametrize("overrides, named", [
    (dict(attention_logit_transform="alibi"), "attention_logit_transform='alibi'"),
    (dict(architecture="gptplus", attention_logit_transform="scale_invariant"), "'scale_invariant'"),
    (dict(attention_sparsity="topk"), "attention_sparsity='topk'"),
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 1.0}), "dynamic NTK"),
])
def test_what_the_paged_path_cannot_compute_is_refused_in_one_line(overrides, named):
    model = AnGPTForCausalLM(tiny(overrides.pop("architecture", "angpt"), **overrides)).eval()
    with pytest.raises(ValueError, match="continuous batching") as error:
        model.generate_batch(PROMPTS, generation_config=GREEDY)
    message = str(error.value)
    assert named in message and "\n" not in message


def test_dynamic_ntk_scales_each_packed_sequence_by_its_own_length():
    """A padding-free packed row (position_ids restart, no mask) of sequences longer than the training length (so
    the base is scaled) and of different lengths: each sequence's rotary tables and logits equal its own forward's."""
    rope = {"rope_type": "dynamic", "factor": 1.0, "rope_theta": 4.0}  # a small θ: the base's change shows in cos/sin
    model = AnGPTForCausalLM(tiny("angpt", max_position_embeddings=4, rope_parameters=rope)).eval()
    tables = []  # (cos, sin) of each forward, as the decoder blocks receive them
    model.model.rotary_emb.register_forward_hook(lambda module, args, output: tables.append(output))
    lengths = [9, 5, 14]
    sequences = [torch.randint(0, 101, (n,)) for n in lengths]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = model(torch.cat(sequences)[None], position_ids=positions).logits[0].split(lengths)
        alone = [model(sequence[None]).logits[0] for sequence in sequences]
    packed_cos = tables[0][0][0].split(lengths)
    for index, (got, expected) in enumerate(zip(packed, alone)):
        torch.testing.assert_close(packed_cos[index], tables[1 + index][0][0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (packed_cos[0] - tables[3][0][0][:9]).abs().max() > 0.05  # the bases of L = 9 and 14 do differ
