"""Grouped-query attention with a free head_dim: every architecture, backend, the KV cache, folding,
save/load, the ν constants (docs/architectures.md), and the Qwen3/Llama → GPT+ converter on GQA checkpoints."""
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from modeling_angpt import AnGPTForCausalLM, attention_angpt
from modeling_angpt.architectures_angpt import get_architecture
from modeling_angpt.conversion.llama_qwen3 import gptplus_from_transformers

from conftest import ARCHITECTURES
from contract_fixtures import causal_lm, config, ids, single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

GQA = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=12)  # H·d_h = 48 ≠ d = 32


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_gqa_backends_cache_fold_and_reload(tmp_path, monkeypatch, architecture):
    monkeypatch.setattr(attention_angpt, "FLEX_COMPILE", False)  # same math, no compilation (see attention tests)
    model = causal_lm(architecture, attention_query_chunk_size=4, **GQA)
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.shape == attn.v_proj.weight.shape == (24, 32) and attn.q_proj.weight.shape == (48, 32)
    assert attn.o_proj.weight.shape == (32, 48)
    tokens = ids(length=10)
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        reference = model(tokens, attention_mask=mask).logits
        for backend in ("sdpa", "angpt_chunked", "flex_attention"):
            model.set_attn_implementation(backend)
            got = model(tokens, attention_mask=mask).logits
            torch.testing.assert_close(got[mask.bool()], reference[mask.bool()], rtol=0, atol=1e-5, msg=backend)
        model.set_attn_implementation("eager")
        full = model(tokens).logits
        out = model(tokens[:, :6], use_cache=True)
        assert out.cache.layers[0].keys.shape == (2, 2, 6, 12)  # the cache holds the key/value heads
        steps = [out.logits] + [model(tokens[:, t:t + 1], cache=out.cache, use_cache=True).logits
                                for t in range(6, 10)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
        torch.testing.assert_close(model.fold()(tokens).logits, full, rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(AnGPTForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")(tokens).logits, full)


def test_gqa_nu_constants_keep_unit_norms_at_init():
    """docs/architectures.md's sanity property with d_h = head_dim, H·d_h ≠ d and 4 query heads per key/value head: each value
    head and the attention sublayer's output x_A = ν_p W_o y (unit head outputs y) have norm ≈ 1 at init."""
    torch.manual_seed(0)
    d, heads, kv_heads, d_h = 256, 8, 2, 48
    cfg = config("angpt", hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=d_h,
                 num_hidden_layers=1)
    nu = get_architecture(cfg).constants(cfg)
    assert nu["v"] == pytest.approx(math.sqrt(d / d_h)) and nu["o"] == pytest.approx(math.sqrt(d_h / d))
    attn = AnGPTForCausalLM(cfg).double().model.layers[0].self_attn
    h = torch.nn.functional.normalize(torch.randn(512, d, dtype=torch.float64), dim=-1)
    value = (nu["v"] * h @ attn.v_proj.weight.T).view(512, kv_heads, d_h)
    assert value.norm(dim=-1).mean().item() == pytest.approx(1.0, abs=0.1)
    y = torch.nn.functional.normalize(torch.randn(512, heads, d_h, dtype=torch.float64), dim=-1).flatten(1)
    assert (nu["o"] * y @ attn.o_proj.weight.T).norm(dim=-1).mean().item() == pytest.approx(1.0, abs=0.1)


SHAPE = dict(vocab_size=113, hidden_size=48, intermediate_size=88, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64,
             rope_parameters={"rope_type": "default", "rope_theta": 5000.0})


def _assert_same(ours, theirs, implementation: str) -> None:
    """Bit-identical with the torch make test installs (2.13); at make test-min-versions' floors (torch 2.8.0,
    transformers 5.24.0) the padded batch through SDPA is 1.4e-7 apart from transformers' own model (float32 round-off
    of another kernel for a masked batch; the unpadded batch stays bit-identical there too)."""
    if implementation == "sdpa" and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    else:
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("source_class, config_class, extra", [
    (Qwen3ForCausalLM, Qwen3Config, dict(head_dim=16, tie_word_embeddings=True)),  # Qwen3-0.6B's shape, in small
    (LlamaForCausalLM, LlamaConfig, dict()),
])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gqa_checkpoints_convert_bit_identically(source_class, config_class, extra, implementation):
    """Bit-identical (torch.equal, float32): GPT+ runs the same operations in the same order as transformers' Qwen3 and
    Llama, so the same positions give the same bits. Generation (greedy, one prompt and a left-padded batch, where
    generate derives the positions for both alike) is identical token for token."""
    torch.manual_seed(0)
    source = source_class(config_class(**SHAPE, **extra, attn_implementation=implementation)).eval()
    with torch.no_grad():
        for name, parameter in source.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    model = gptplus_from_transformers(source)
    model.set_attn_implementation(implementation)
    assert model.config.num_key_value_heads == 2 and model.config.head_dim == source.config.head_dim
    tokens = torch.randint(0, 113, (2, 20))
    mask = torch.ones_like(tokens)
    mask[1, :6] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, source(tokens).logits)
        padded = model(tokens, attention_mask=mask, position_ids=positions).logits
        expected = source(tokens, attention_mask=mask, position_ids=positions).logits
        _assert_same(padded[mask.bool()], expected[mask.bool()], implementation)
    greedy = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(tokens[:1, :7], **greedy), source.generate(tokens[:1, :7], **greedy))
    prompts, prompt_mask = tokens[:, :10], mask[:, :10]
    assert torch.equal(model.generate(prompts, attention_mask=prompt_mask, **greedy),
                       source.generate(prompts, attention_mask=prompt_mask, **greedy))


def test_converter_refuses_a_rope_it_cannot_represent():
    rope = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    source = LlamaForCausalLM(LlamaConfig(**{**SHAPE, "rope_parameters": rope}))
    with pytest.raises(ValueError, match=r"rope_type'\]='llama3'.*refusing to approximate") as error:
        gptplus_from_transformers(source)
    assert "\n" not in str(error.value)
