"""Every (position × logit transform × sparsity) on every backend that supports it equals the eager reference,
cached decoding equals the full forward, and unsupported combinations raise (docs/attention.md)."""
import pytest
import torch

from modeling_angpt import AnGPTForCausalLM, attention_angpt
from modeling_angpt.configuration_angpt import LOGIT_TRANSFORMS

from attention_fixtures import (ARCHITECTURES, ROPES, VARIANTS, assert_close_on, build, decode_incrementally, logits,
                                make_config, padded_batch, supported)

FAST_BACKENDS = ("angpt_chunked", "sdpa", "flex_attention")


@pytest.fixture(autouse=True)
def _uncompiled_flex(monkeypatch):
    # Same score_mod/mask_mod math without minutes of compilation; test_flex_compiled covers the compiled kernel.
    monkeypatch.setattr(attention_angpt, "FLEX_COMPILE", False)


def _combinations():
    cases = []
    for i, (transform, sparsity) in enumerate(VARIANTS):
        rope = list(ROPES)[i % len(ROPES)]  # every rope type meets several transforms and sparsities
        for causal in (True, False):
            cases.append(pytest.param(transform, sparsity, rope, causal,
                                      id=f"{transform}-{sparsity}-{rope}-{'causal' if causal else 'bidir'}"))
    return cases


@pytest.mark.parametrize("transform,sparsity,rope,causal", _combinations())
def test_backends_equal_eager(transform, sparsity, rope, causal):
    architecture = ARCHITECTURES[VARIANTS.index((transform, sparsity)) % 3]
    config = make_config(transform, sparsity, architecture, ROPES[rope], is_causal=causal,
                         attention_query_chunk_size=7, attention_global_tokens=2 if sparsity in ("window", "block") else 0)
    model = build(config, "eager")
    ids, mask = padded_batch(left=causal)
    expected = logits(model, ids, mask)
    backends = [b for b in FAST_BACKENDS if supported(transform, sparsity, b)]
    assert "angpt_chunked" in backends
    for backend in backends:
        model.set_attn_implementation(backend)
        assert_close_on(mask, logits(model, ids, mask), expected)


@pytest.mark.parametrize("rope", list(ROPES))
def test_rope_types_on_all_backends(rope):
    config = make_config("scale_invariant", "none", "angpt", ROPES[rope], attention_query_chunk_size=5)
    model = build(config, "eager")
    ids, mask = padded_batch(length=20)
    expected = logits(model, ids, mask)
    for backend in ("angpt_chunked", "flex_attention"):
        model.set_attn_implementation(backend)
        assert_close_on(mask, logits(model, ids, mask), expected)


# FlexAttention decodes through the same positions in score_mod/mask_mod for every variant, and uncompiled it is
# slow on CPU: CI decodes three representative variants with it, the rest are marked slow.
FLEX_DECODE_IN_CI = {("none", "none"), ("scale_invariant", "window"), ("alibi", "block")}


def _decode_cases():
    cases = []
    for transform, sparsity in VARIANTS:
        for backend in ("eager",) + FAST_BACKENDS:
            if supported(transform, sparsity, backend):
                marks = []
                if backend == "flex_attention" and (transform, sparsity) not in FLEX_DECODE_IN_CI:
                    marks = [pytest.mark.slow]
                cases.append(pytest.param(transform, sparsity, backend, id=f"{transform}-{sparsity}-{backend}",
                                          marks=marks))
    return cases


@pytest.mark.parametrize("transform,sparsity,backend", _decode_cases())
def test_cached_decoding_equals_full_forward(transform, sparsity, backend):
    # absolute positions: t = P − j at decode position P, with left padding in the batch
    config = make_config(transform, sparsity, "angpt", ROPES["scale_invariant_p"], attention_query_chunk_size=4,
                         attention_global_tokens=1 if sparsity == "block" else 0)
    model = build(config, backend)
    ids, mask = padded_batch(length=14, pad=3)
    full = logits(model, ids, mask)
    assert_close_on(mask, decode_incrementally(model, ids, mask, prefill=8, steps=(1, 3, 1)), full)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_dynamic_ntk_cache_consistent(backend):
    # Training length 8, sequence 20: the NTK base is fixed for the whole sequence (rotary_angpt docstring).
    config = make_config("logn", "none", "gptplus", ROPES["dynamic"], max_position_embeddings=8)
    model = build(config, backend)
    ids, mask = padded_batch(length=20, pad=2)
    full = logits(model, ids, mask)  # base from L = 20
    steps = (1, 4, 3)
    assert_close_on(mask, decode_incrementally(model, ids, mask, prefill=12, steps=steps, rope_seq_len=20), full)
    # without the total length, the prefill length fixes the base: equal to a full forward told L = 12
    assert_close_on(mask, decode_incrementally(model, ids, mask, prefill=12, steps=steps),
                    logits(model, ids, mask, rope_seq_len=12))
    assert (full - logits(model, ids, mask, rope_seq_len=12)).abs().max() > 1e-4  # and the base does matter


def test_left_padding_changes_nothing():
    # positions count real tokens: a left-padded row equals the same tokens alone, for every position-dependent part
    config = make_config("scale_invariant", "block", "angpt", ROPES["scale_invariant_p"], attention_global_tokens=1)
    for backend in ("eager", "flex_attention"):
        model = build(config, backend)
        ids, mask = padded_batch(length=16, pad=5)
        batch = logits(model, ids, mask)
        alone = logits(model, ids[1:, 5:])
        torch.testing.assert_close(batch[1, 5:], alone[0], rtol=0, atol=1e-5)


def test_generate_with_cache_equals_without():
    config = make_config("alibi", "window", "ngpt", ROPES["none"])
    model = build(config, "sdpa")
    ids, mask = padded_batch(length=8, pad=2)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(model.generate(ids, use_cache=True, **kwargs), model.generate(ids, use_cache=False, **kwargs))


@pytest.mark.parametrize("backend,transform,sparsity", [
    ("sdpa", "scale_invariant", "none"), ("sdpa", "none", "topk"), ("flex_attention", "alibi", "topk"),
    ("flash_attention_2", "scale_invariant", "none"), ("flash_attention_2", "none", "window"),
    ("paged|sdpa", "alibi", "none")])
def test_unsupported_combination_raises_where_the_backend_is_chosen(backend, transform, sparsity):
    # Checked once where the backend is chosen, in one line (docs/attention.md, "Backends"): at config init, by
    # from_pretrained/_from_config's attn_implementation=, by set_attn_implementation (before transformers' own check
    # that flash-attn is installed), and when a serving runtime assigns its own name to config._attn_implementation.
    model = build(make_config(transform, sparsity), "eager")
    choices = {
        "config": lambda: make_config(transform, sparsity, attn_implementation=backend),
        "attn_implementation=": lambda: AnGPTForCausalLM._from_config(make_config(transform, sparsity),
                                                                       attn_implementation=backend),
        "set_attn_implementation": lambda: model.set_attn_implementation(backend),
        "runtime": lambda: setattr(model.config, "_attn_implementation", backend),
    }
    for where, choose in choices.items():
        with pytest.raises(ValueError) as error:
            choose()
        message = str(error.value)
        assert backend in message and "eager" in message and "angpt_chunked" in message, where
        assert (transform if transform != "none" else sparsity) in message and "\n" not in message, where
    assert model.config._attn_implementation == "eager"  # a refused choice leaves the model as it was


@pytest.mark.parametrize("transform", LOGIT_TRANSFORMS)
def test_default_backend_computes_the_variant(transform, tmp_path):
    # transformers defaults to sdpa; a variant sdpa cannot compute defaults to the chunked eager path instead
    for sparsity in ("none", "topk"):
        expected = "sdpa" if supported(transform, sparsity, "sdpa") else "angpt_chunked"
        assert build(make_config(transform, sparsity)).config._attn_implementation == expected
    assert make_config("alibi", attn_implementation="eager")._attn_implementation == "eager"  # an explicit choice is kept
    model = build(make_config("scale_invariant", "topk"))
    model.save_pretrained(tmp_path)
    assert AnGPTForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "angpt_chunked"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):  # an explicit choice sdpa cannot compute
        AnGPTForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
