"""Compiled FlexAttention compiles once for every length, batch size and layer, never falls back to the unfused
path, and equals the eager reference (docs/attention.md, flex_angpt.py)."""
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from modeling_angpt import attention_angpt, flex_angpt
from modeling_angpt.configuration_angpt import LOGIT_TRANSFORMS, SPARSITIES

from attention_fixtures import assert_close_on, build, decode_incrementally, logits, make_config, supported

LENGTHS, BATCHES = (64, 128, 256, 512), (1, 2)
FLEX_VARIANTS = [(t, s) for t in LOGIT_TRANSFORMS for s in SPARSITIES if supported(t, s, "flex_attention")]
FAST = {("alibi", "none"), ("scale_invariant", "window")}  # the rest: same code paths, one compilation each


def _inputs(batch, length, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 101, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1:, : length // 8] = 0  # every row after the first is left-padded
    return ids, mask


def _compilations() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("transform,sparsity,causal", [
    pytest.param(t, s, True, id=f"{t}-{s}", marks=() if (t, s) in FAST else pytest.mark.slow) for t, s in FLEX_VARIANTS
] + [pytest.param("scale_invariant", "window", False, id="scale_invariant-window-bidirectional", marks=pytest.mark.slow)])
def test_flex_compiles_once_for_every_length_and_batch(transform, sparsity, causal, monkeypatch):
    assert attention_angpt.FLEX_COMPILE
    monkeypatch.setattr(flex_angpt, "_compiled", None)  # a fresh compiled function: count this variant only
    monkeypatch.setattr(flex_angpt, "_failed", False)
    torch._dynamo.reset()
    config = make_config(transform, sparsity, "angpt", {"rope_type": "default", "partial_rotary_factor": 0.5},
                         attention_window=48, attention_block_size=40, max_position_embeddings=512, is_causal=causal)
    model = build(config, "eager")
    cases = [(length, batch, _inputs(batch, length, seed=length + batch)) for length in LENGTHS for batch in BATCHES]
    expected = [logits(model, ids, mask) for _, _, (ids, mask) in cases]
    model.set_attn_implementation("flex_attention")
    before = _compilations()
    with warnings.catch_warnings(), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        warnings.simplefilter("error", RuntimeWarning)  # flex_angpt's "compiling failed, chunked path" warning
        for (length, batch, (ids, mask)), reference in zip(cases, expected):
            assert_close_on(mask, logits(model, ids, mask), reference)
        if causal:  # decoding (one query against a cache, four steps) adds at most one graph for all of them
            ids, mask = cases[-1][2]
            model.set_attn_implementation("eager")
            reference = decode_incrementally(model, ids[:, :40], mask[:, :40], prefill=36)
            model.set_attn_implementation("flex_attention")
            decoded = decode_incrementally(model, ids[:, :40], mask[:, :40], prefill=36)
            assert_close_on(mask[:, :40], decoded, reference)
    assert not flex_angpt._failed
    assert 1 <= _compilations() - before <= 2


def test_compiled_flex_decoding_on_cpu_equals_eager_for_every_piece_size():
    """Decoding one query, and chunked prefill of 4 or 16, through compiled flex_attention equal the eager path at
    every cache length (torch 2.13's compiled CPU kernel is wrong by up to 1e-2 for a few queries at a time on an
    AVX2 CPU; fewer than CPU_FLEX_MIN_QUERIES take the chunked eager path)."""
    assert attention_angpt.FLEX_COMPILE
    config = make_config("alibi", "none", "angpt", {"rope_type": "default", "partial_rotary_factor": 0.5},
                         max_position_embeddings=128)
    model = build(config, "eager")
    ids, _ = _inputs(1, 70, seed=3)
    with torch.no_grad():
        reference = model(ids).logits
    model.set_attn_implementation("flex_attention")
    for step in (1, 4, 16):
        assert_close_on(None, decode_incrementally(model, ids, None, prefill=20, steps=(step,)), reference)


# elements per step, for 3 batch rows of 300 (3 block rows of 128 queries × 384 keys): one batch row and block row;
# two batch rows; all batch rows and two block rows (the last slab overhangs); everything at once
@pytest.mark.parametrize("chunk_elements", [1, 2 * 128 * 384, 6 * 128 * 384, 1 << 22])
def test_flex_block_mask_equals_torch_create_block_mask(chunk_elements, monkeypatch):
    # The eagerly built BlockMask (slabs of 128-query block rows and batch rows) holds the same blocks as torch's.
    from torch.nn.attention.flex_attention import create_block_mask

    monkeypatch.setitem(flex_angpt.MASK_CHUNK_ELEMENTS, "cpu", chunk_elements)
    config = make_config("alibi", "window", "angpt", attention_window=100, attention_global_tokens=3)
    model = build(config, "flex_attention")
    ids, mask = _inputs(3, 300, seed=0)
    layout = {}
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: layout.update(kwargs), with_kwargs=True)
    logits(model, ids, mask)
    layout = layout["attention_layout"]
    mask_mod, _ = flex_angpt.mods(config, layout, ids.device, 3, 300, 300)
    ours = flex_angpt.block_mask(mask_mod, 3, 300, 300, ids.device)
    theirs = create_block_mask(mask_mod, 3, None, 300, 300, device="cpu")
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=0, atol=0)
    assert torch.equal(ours.to_dense(), theirs.to_dense())


def test_flex_compiler_failure_falls_back_to_chunked_once(monkeypatch):
    # A compiler error (torch 2.13 CPU codegen had some) warns once and runs the chunked path: same logits.
    config = make_config("scale_invariant", "block", "angpt")
    model = build(config, "eager")
    ids, mask = _inputs(2, 30, seed=3)
    expected = logits(model, ids, mask)

    def broken(*args, **kwargs):
        raise torch._dynamo.exc.BackendCompilerFailed(broken, RuntimeError("C++ compile error"), None)

    monkeypatch.setattr(flex_angpt, "_compiled", broken)
    monkeypatch.setattr(flex_angpt, "_failed", False)
    model.set_attn_implementation("flex_attention")
    with pytest.warns(RuntimeWarning, match="compiling flex_attention failed"):
        assert_close_on(mask, logits(model, ids, mask), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close_on(mask, logits(model, ids, mask), expected)


def test_flex_past_its_recompile_limit_warns_and_takes_the_chunked_path(monkeypatch):
    """Every variant compiles the kernel once more; past the limit dynamo would run flex_attention unfused (T×T
    scores, seen at 16k on a GPU). flex_angpt makes that an error: one warning, then the chunked path, same logits."""
    monkeypatch.setattr(flex_angpt, "_compiled", None)
    monkeypatch.setattr(flex_angpt, "_failed", False)
    monkeypatch.setattr(flex_angpt, "RECOMPILE_LIMIT", 1)
    torch._dynamo.reset()
    ids, mask = _inputs(2, 64, seed=1)
    # config.patch, not monkeypatch: restoring the alias by setattr leaves dynamo's config in a state where later
    # compiles cannot read `recompile_limit`
    with torch._dynamo.config.patch(recompile_limit=1), pytest.warns(RuntimeWarning,
                                                                     match="compiling flex_attention failed"):
        for transform, sparsity in sorted(FAST):
            model = build(make_config(transform, sparsity, "angpt", {"rope_type": "default"},
                                      attention_window=48, max_position_embeddings=128), "eager")
            expected = logits(model, ids, mask)
            model.set_attn_implementation("flex_attention")
            assert_close_on(mask, logits(model, ids, mask), expected)
    assert flex_angpt._failed
