"""The three architectures as transformers models: Auto loading, backends, cache, generation, padding."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from modeling_angpt import AnGPTForCausalLM, AnGPTForSequenceClassification, AnGPTModel

from conftest import ARCHITECTURES, fit_classifier


def build(config, implementation="eager"):
    return AnGPTForCausalLM._from_config(config, attn_implementation=implementation).eval()


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("tied", [False, True])
def test_save_and_auto_reload_identical(tmp_path, tiny_config, architecture, tied):
    model = build(tiny_config(architecture, tie_word_embeddings=tied))
    ids = torch.randint(0, 101, (2, 12))
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_angpt.AnGPTForCausalLM"
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "modeling_angpt.py").exists()
    assert ("lm_head.weight" in load_file(tmp_path / "model.safetensors")) is not tied
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(loaded) is AnGPTForCausalLM
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) is tied
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_auto_model_and_sequence_classification_registered(tmp_path, tiny_config):
    AnGPTForSequenceClassification(tiny_config("angpt", num_labels=3)).save_pretrained(tmp_path)
    assert type(AutoModelForSequenceClassification.from_pretrained(tmp_path)) is AnGPTForSequenceClassification
    assert type(AutoModel.from_pretrained(tmp_path)) is AnGPTModel


def test_dtype_loading(tmp_path, tiny_config):
    build(tiny_config("angpt")).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        assert model(torch.randint(0, 101, (1, 8))).logits.dtype == torch.bfloat16


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_eager_and_sdpa_agree_with_padding(tiny_config, architecture):
    eager = build(tiny_config(architecture))
    sdpa = build(tiny_config(architecture), "sdpa")
    sdpa.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 101, (3, 14))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    mask[2, :2] = 0
    with torch.no_grad():
        a = eager(ids, attention_mask=mask).logits
        b = sdpa(ids, attention_mask=mask).logits
    assert (a - b)[mask.bool()].abs().max() <= 1e-5


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_cached_decoding_equals_full_forward(tiny_config, architecture, implementation):
    model = build(tiny_config(architecture), implementation)
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        steps = [out.logits]
        cache = out.cache
        for t in range(5, 12):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits)
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-5


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_generate_with_and_without_cache(tiny_config, architecture):
    # Seeded: a random tiny model has near-ties among its logits, and a prompt drawn from whatever RNG state the
    # previous tests left can land on one where cached and uncached float sums round the other way.
    torch.manual_seed(0)
    model = build(tiny_config(architecture), "sdpa")
    prompt = torch.randint(0, 101, (1, 6))
    cached = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True)
    uncached = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=False)
    assert cached.shape == (1, 16) and torch.equal(cached, uncached)
    torch.manual_seed(3)
    sampled = model.generate(prompt, max_new_tokens=10, do_sample=True, top_k=20, temperature=1.0)
    torch.manual_seed(3)
    again = model.generate(prompt, max_new_tokens=10, do_sample=True, top_k=20, temperature=1.0, use_cache=False)
    assert sampled.shape == (1, 16) and torch.equal(sampled, again)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_left_padded_batch_generates_like_each_prompt_alone(tiny_config, architecture, implementation):
    model = build(tiny_config(architecture, pad_token_id=0), implementation)
    prompts = [torch.randint(1, 101, (n,)) for n in (7, 4, 5)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(batched[row, width:], alone[0, len(prompt):])


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_gradient_checkpointing_gives_same_gradients(tiny_config, architecture):
    model = AnGPTForCausalLM(tiny_config(architecture)).train()
    ids = torch.randint(0, 101, (2, 10))

    def grads():
        model.zero_grad()
        model(ids, labels=ids, use_cache=False).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_activation_checkpointing
    checkpointed = grads()
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_shape_mismatch_names_the_tensor(tmp_path, tiny_config):
    build(tiny_config("angpt")).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.1.mlp.up_proj.weight"] = torch.zeros(7, 32)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(Exception) as error:
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert "model.layers.1.mlp.up_proj.weight" in str(error.value)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_sequence_classification_pools_over_real_tokens(tiny_config, pooling):
    config = tiny_config("angpt", num_labels=3, is_causal=False, classifier_pooling=pooling, pad_token_id=0)
    model = AnGPTForSequenceClassification(config).eval()
    ids = torch.randint(1, 101, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 4)], dim=1).long()
    with torch.no_grad():
        alone = model(ids).logits
        with_padding = model(padded, attention_mask=mask).logits
    torch.testing.assert_close(alone, with_padding, rtol=1e-5, atol=1e-6)


def test_sequence_classification_learns(tiny_config):
    # Label = whether token 7 occurs; a few Adam steps must fit a 16-example batch (bidirectional, mean pool).
    config = tiny_config("angpt", num_labels=2, is_causal=False)
    model = AnGPTForSequenceClassification(config).train()
    ids = torch.randint(8, 101, (16, 10))
    labels = torch.arange(16) % 2
    ids[labels == 1, 3] = 7
    losses = fit_classifier(model, ids, labels, steps=40, lr=3e-3)
    assert losses[-1] < 0.5 * losses[0]
    assert (model.eval()(ids).logits.argmax(-1) == labels).float().mean() >= 0.9
