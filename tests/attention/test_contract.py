"""The attention side of the transformers model contract (docs/attention.md): padding-free packing, a forward without
data-dependent branches (torch.export, fullgraph compile), static-cache generation, cached decoding at any
starting position with either cache, attention variants registered as plugins."""
from types import SimpleNamespace

import pytest
import torch
from transformers import CompileConfig, DataCollatorWithFlattening, DynamicCache, StaticCache

from modeling_angpt import (attention_angpt, configuration_angpt, pretrained_angpt, register_logit_transform,
                            register_sparsity)
from modeling_angpt.attention_angpt import eager_attention_forward
from modeling_angpt.logit_transforms_angpt import LOGIT_TRANSFORMS
from modeling_angpt.sparsity_angpt import SPARSITIES

from attention_fixtures import ARCHITECTURES, ROPES, VARIANTS, build, logits, make_config, padded_batch, supported

BACKENDS = ("eager", "angpt_chunked", "sdpa", "flex_attention")
STATIC_ROPES = [name for name in ROPES if name != "dynamic"]  # dynamic NTK's base depends on L: its own test


@pytest.fixture(autouse=True)
def _uncompiled_flex(monkeypatch):
    monkeypatch.setattr(attention_angpt, "FLEX_COMPILE", False)  # same mods; the compiled kernel has its own tests


def _variant_config(index, transform, sparsity, **overrides):
    rope = ROPES[STATIC_ROPES[index % len(STATIC_ROPES)]]
    fields = dict(attention_query_chunk_size=4, attention_global_tokens=1 if sparsity == "block" else 0)
    return make_config(transform, sparsity, ARCHITECTURES[index % 3], rope, **{**fields, **overrides})


VARIANT_CASES = [pytest.param(i, t, s, id=f"{t}-{s}-{ARCHITECTURES[i % 3]}") for i, (t, s) in enumerate(VARIANTS)]
# CI decodes half the variants (each transform and each sparsity twice, every architecture); the rest are slow-marked
DECODE_CASES = [pytest.param(*case.values, id=case.id, marks=[] if (i // 4 + i % 4) % 2 == 0 else [pytest.mark.slow])
                for i, case in enumerate(VARIANT_CASES)]


# --- 10.2: padding-free packing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("index,transform,sparsity", VARIANT_CASES)
def test_packed_sequences_equal_each_sequence_alone(index, transform, sparsity):
    # DataCollatorWithFlattening: one row, position_ids restarting at 0, no attention mask
    generator = torch.Generator().manual_seed(index)
    sequences = [torch.randint(1, 101, (n,), generator=generator).tolist() for n in (5, 8, 6)]
    batch = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": s} for s in sequences])
    assert "attention_mask" not in batch and batch["position_ids"][0, 5] == 0
    model = build(_variant_config(index, transform, sparsity), "eager")
    alone = torch.cat([logits(model, torch.tensor([s]))[0] for s in sequences])
    for backend in [b for b in BACKENDS if supported(transform, sparsity, b)]:
        model.set_attn_implementation(backend)
        packed = logits(model, batch["input_ids"], position_ids=batch["position_ids"])[0]
        torch.testing.assert_close(packed, alone, rtol=0, atol=1e-5, msg=backend)


# --- 10.4: no data-dependent branches: export, fullgraph compile, the backend checked where chosen ---------------
EXPORT_CASES = [("angpt", "scale_invariant", "window", "angpt_chunked"), ("gptplus", "alibi", "block", "sdpa"),
                ("ngpt", "logn", "topk", "eager")]


@pytest.mark.parametrize("architecture,transform,sparsity,backend", EXPORT_CASES)
def test_forward_exports_and_compiles_without_graph_breaks(architecture, transform, sparsity, backend, monkeypatch):
    config = make_config(transform, sparsity, architecture, attention_query_chunk_size=8, use_cache=False)
    model = build(config, backend)
    ids, mask = padded_batch(length=12, pad=3)
    expected = logits(model, ids, mask)
    exported = torch.export.export(model, (ids,), {"attention_mask": mask})
    torch.testing.assert_close(exported.module()(ids, attention_mask=mask).logits, expected, rtol=0, atol=1e-5)
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # raises on any graph break
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, attention_mask=mask).logits, expected, rtol=0, atol=1e-5)
    checks = []  # the backend is checked where it is chosen, never in the forward (docs/attention.md, "Backends")
    for module in (configuration_angpt, pretrained_angpt):
        monkeypatch.setattr(module, "check_attention_backend", lambda *a: checks.append(a))
    logits(model, ids, mask)
    assert checks == []
    other = "angpt_chunked" if backend == "eager" else "eager"  # both compute every variant
    model.set_attn_implementation(other)
    assert checks and all(implementation == other for _, implementation in checks)


# --- 10.5: static cache ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_static_cache_generation_equals_dynamic_and_no_cache(architecture):
    model = build(make_config("alibi", "window", architecture, ROPES["default"]), "sdpa")
    assert model._can_compile_fullgraph
    ids, mask = padded_batch(length=9, pad=3)
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    dynamic = model.generate(ids, **kwargs)
    torch.testing.assert_close(model.generate(ids, cache_implementation="static", **kwargs), dynamic, rtol=0, atol=0)
    torch.testing.assert_close(model.generate(ids, use_cache=False, **kwargs), dynamic, rtol=0, atol=0)
    if architecture == "angpt":  # transformers' compiled decoding path, fullgraph (the eager backend keeps it cheap)
        compile_config = CompileConfig(fullgraph=True, backend="eager", mode=None)
        compile_config._compile_all_devices = True  # transformers compiles only on accelerators otherwise
        compiled = model.generate(ids, cache_implementation="static", compile_config=compile_config, **kwargs)
        assert hasattr(model, "_compiled_call")
        torch.testing.assert_close(compiled, dynamic, rtol=0, atol=0)


# --- 10.6: cached decoding = full forward, positions from 0, at an offset, under left padding -------------------
def _starts(length):
    ids, left_padded = padded_batch(length=length, pad=3)
    offsets = torch.arange(length)[None] + torch.tensor([[7], [3]])
    return {"zero": (ids, None, None), "offset": (ids, None, offsets), "left_padding": (ids, left_padded, None)}


def _decode(model, ids, mask, positions, cache, prefill, steps=(1, 2)):
    """Prefill, then feed the rest through `cache` in pieces of `steps` tokens; all logits [b, T, V]."""
    pieces, start, end, i = [], 0, prefill, 0
    with torch.no_grad():
        while start < ids.shape[1]:
            kwargs = {} if mask is None else {"attention_mask": mask[:, :end]}
            if positions is not None:
                kwargs["position_ids"] = positions[:, start:end]
            pieces.append(model(ids[:, start:end], cache=cache, use_cache=True, **kwargs).logits)
            start, end, i = end, min(end + steps[i % len(steps)], ids.shape[1]), i + 1
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("index,transform,sparsity", DECODE_CASES)
def test_cached_decoding_equals_full_forward_at_any_start(index, transform, sparsity):
    # eager and a fast backend take turns over the variants (backend parity itself: test_attention_backends.py)
    backend = "sdpa" if index % 2 and supported(transform, sparsity, "sdpa") else ("eager", "angpt_chunked")[index % 2]
    model = build(_variant_config(index, transform, sparsity), backend)
    length = 12
    for start, (ids, mask, positions) in _starts(length).items():
        full = logits(model, ids, mask, position_ids=positions)
        keep = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
        for cache in (DynamicCache(config=model.config), StaticCache(config=model.config, max_cache_len=length + 4)):
            decoded = _decode(model, ids, mask, positions, cache, prefill=7)
            torch.testing.assert_close(decoded[keep], full[keep], rtol=0, atol=1e-5,
                                       msg=f"{backend}, {start}, {type(cache).__name__}")


# --- 10.10: attention variants as plugins ---------------------------------------------------------------------------
def log_distance_gain(scores, query_pos, key_pos, head_value, config):
    """A multiplicative test transform (not expressible as an additive mask): S·(1 + c_h·log(1 + |i − j|))."""
    return scores * (1.0 + head_value * torch.log1p((query_pos - key_pos).abs().to(scores.dtype)))


def even_distance(query_pos, key_pos, config, causal, lengths):
    return (query_pos - key_pos) % 2 == 0


@pytest.fixture
def plugins():
    transform = register_logit_transform("test_log_distance_gain", log_distance_gain,
                                         head_values=lambda config: [0.1 * (h + 1) for h in range(config.num_attention_heads)])
    sparsity = register_sparsity("test_even_distance", even_distance)
    yield transform, sparsity
    LOGIT_TRANSFORMS.pop(transform.name, None)
    SPARSITIES.pop(sparsity.name, None)


def test_registered_transform_equals_hand_written_attention(plugins):
    config = make_config("test_log_distance_gain", "test_even_distance")
    module = SimpleNamespace(config=config, is_causal=True, training=False)
    q, k, v = (torch.randn(1, 4, 9, 8) for _ in range(3))
    out, _ = eager_attention_forward(module, q, k, v, None, scaling=0.5)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None]
    gain = 1.0 + torch.tensor([0.1, 0.2, 0.3, 0.4]).view(4, 1, 1) * torch.log1p((i - j).abs().float())
    scores = (q[0] @ k[0].transpose(-1, -2)) * 0.5 * gain
    scores = scores.masked_fill(~((j <= i) & ((i - j) % 2 == 0)), float("-inf"))
    torch.testing.assert_close(out[0].transpose(0, 1), torch.softmax(scores, -1) @ v[0], rtol=0, atol=1e-5)


def test_registered_variants_run_everywhere_and_survive_folding(plugins, tmp_path):
    transform, sparsity = (p.name for p in plugins)
    config = make_config(transform, sparsity, "angpt", ROPES["scale_invariant_p"], attention_query_chunk_size=4)
    assert config._attn_implementation == "angpt_chunked"  # sdpa cannot run a multiplicative transform
    model = build(config, "eager")
    ids, mask = padded_batch(length=12, pad=3)
    expected = logits(model, ids, mask)
    for backend in ("angpt_chunked", "flex_attention"):
        model.set_attn_implementation(backend)
        torch.testing.assert_close(logits(model, ids, mask)[mask.bool()], expected[mask.bool()], rtol=0, atol=1e-5)
        decoded = _decode(model, ids, mask, None, StaticCache(config=model.config, max_cache_len=16), prefill=6)
        torch.testing.assert_close(decoded[mask.bool()], expected[mask.bool()], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="sdpa"):  # refused where it is chosen
        model.set_attn_implementation("sdpa")
    patterned = build(make_config("alibi", sparsity), "eager")  # a registered pattern runs on sdpa too
    reference = logits(patterned, ids, mask)
    patterned.set_attn_implementation("sdpa")
    torch.testing.assert_close(logits(patterned, ids, mask)[mask.bool()], reference[mask.bool()], rtol=0, atol=1e-5)
    model.set_attn_implementation("eager")
    folded = model.fold()
    assert folded.config.attention_logit_transform == transform
    tolerance = 1e-5 * max(1.0, expected.abs().max().item())  # docs/inference-fold.md
    torch.testing.assert_close(logits(folded, ids, mask)[mask.bool()], expected[mask.bool()], rtol=0, atol=tolerance)
    folded.save_pretrained(tmp_path)
    LOGIT_TRANSFORMS.pop(transform)  # a new process that never registered it: a clear error, no silent fallback
    with pytest.raises(ValueError, match="register_logit_transform"):
        type(folded).from_pretrained(tmp_path)
