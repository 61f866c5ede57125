"""Shared helpers for tests/test_attention_*.py: tiny models over the attention axes (docs/attention.md)."""
from __future__ import annotations

import contextlib

import torch

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.configuration_angpt import LOGIT_TRANSFORMS, SPARSITIES, attention_backends_supporting

ARCHITECTURES = ("gptplus", "ngpt", "angpt")
VARIANTS = [(t, s) for t in LOGIT_TRANSFORMS for s in SPARSITIES]
# small enough that every pattern bites at T ≈ 16–24
SPARSITY_SIZES = dict(attention_topk=3, attention_window=4, attention_block_size=5)


def make_config(transform="none", sparsity="none", architecture="angpt", rope=None, **overrides) -> AnGPTConfig:
    fields = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, architecture=architecture, attention_logit_transform=transform,
                  attention_sparsity=sparsity, rope_parameters=rope, **SPARSITY_SIZES)
    if transform == "logn":
        fields["logn_init"] = 0.4  # far from 1 so a missing scaling shows
    fields.update(overrides)
    return AnGPTConfig(**fields)


def build(config, implementation=None):
    kwargs = {} if implementation is None else {"attn_implementation": implementation}
    model = AnGPTForCausalLM._from_config(config, **kwargs).eval()
    return perturb(model)


@torch.no_grad()
def perturb(model):
    """Move every learnable scale away from its init so a scale applied in the wrong place shows."""
    for name, parameter in model.named_parameters():
        if parameter.ndim == 1:
            parameter.mul_(1.0 + 0.3 * torch.rand_like(parameter))
    return model


def supported(transform, sparsity, backend) -> bool:
    return backend in attention_backends_supporting(transform, sparsity)


def padded_batch(length=18, pad=4, left=True, seed=1):
    """Two rows: one full, one with `pad` padding tokens on the left (or right)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 101, (2, length), generator=generator)
    mask = torch.ones(2, length, dtype=torch.long)
    if left:
        mask[1, :pad] = 0
    else:
        mask[1, length - pad:] = 0
    return ids, mask


def logits(model, ids, mask=None, **kwargs):
    with torch.no_grad():
        return model(ids, attention_mask=mask, **kwargs).logits


def decode_incrementally(model, ids, mask, prefill: int, steps=(1,), **kwargs) -> torch.Tensor:
    """Prefill `prefill` tokens, then feed the rest through the KV cache in pieces of `steps` tokens (cycled):
    one token at a time is decoding, several at a time is chunked prefill. Returns all logits [b, T, V]."""
    with torch.no_grad():
        out = model(ids[:, :prefill], attention_mask=None if mask is None else mask[:, :prefill], use_cache=True,
                    **kwargs)
        pieces, cache = [out.logits], out.cache
        start, i = prefill, 0
        while start < ids.shape[1]:
            end, i = min(start + steps[i % len(steps)], ids.shape[1]), i + 1
            out = model(ids[:, start:end], attention_mask=None if mask is None else mask[:, :end],
                        cache=cache, use_cache=True, **kwargs)
            pieces.append(out.logits)
            cache, start = out.cache, end
    return torch.cat(pieces, dim=1)


def assert_close_on(mask, actual, expected, atol=1e-5):
    """Compare logits at real (non-padding) positions only."""
    keep = torch.ones(actual.shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    torch.testing.assert_close(actual[keep], expected[keep], rtol=0, atol=atol)


@contextlib.contextmanager
def captured_attention_calls():
    """[(q, k, scaling)] of every attention call made inside the block, as the decoder hands them to its attention
    function (after the rotation and any query scaling): the oracle for what attention receives."""
    import modeling_angpt.modeling_angpt as decoder

    captured, inner = [], decoder.get_attention_function

    def capturing(config):
        attend = inner(config)

        def run(module, query, key, value, attention_mask, scaling, **kwargs):
            captured.append((query.detach(), key.detach(), scaling))
            return attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        return run

    decoder.get_attention_function = capturing
    try:
        yield captured
    finally:
        decoder.get_attention_function = inner


# rope types every backend test runs over
ROPES = {
    "default": {"rope_type": "default", "partial_rotary_factor": 0.5},
    "full": {"rope_type": "default", "partial_rotary_factor": 1.0, "rope_theta": 500.0},
    "none": {"rope_type": "none"},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5},
    "scale_invariant_p": {"rope_type": "scale_invariant_p"},
    "dynamic": {"rope_type": "dynamic"},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
}
