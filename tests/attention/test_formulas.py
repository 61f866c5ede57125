"""The attention axes against their formulas (docs/attention.md) and the
neutral settings that must reduce to plain attention."""
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from modeling_angpt import attention_angpt
from modeling_angpt.attention_angpt import eager_attention_forward
from modeling_angpt.logit_transforms_angpt import alibi_slopes, scale_invariant_coefficients
from modeling_angpt.rotary_angpt import AnGPTRotaryEmbedding
from modeling_angpt.rotary_angpt import compute_inv_freq

from attention_fixtures import assert_close_on, build, logits, make_config, padded_batch

# the paper's table (τ = 10)
SCALE_INVARIANT_TABLE = {0: (1.0, 0.0), 1: (1.091, -0.191), 10: (1.545, -1.386), 100: (2.407, -4.796),
                         4095: (3.610, -12.035)}


@pytest.mark.parametrize("t", sorted(SCALE_INVARIANT_TABLE))
def test_scale_invariant_coefficients(t):
    a, m = scale_invariant_coefficients(torch.tensor([t]), 10.0)
    a_table, m_table = SCALE_INVARIANT_TABLE[t]
    assert a.item() == pytest.approx(a_table, abs=1e-3) and m.item() == pytest.approx(m_table, abs=1e-3)
    # eq. 16a/16b with α = β = e^0.5: a² = 2[log(t/τ + 1) − log α + β/α], m = −a² + β/α
    alpha = beta = math.exp(0.5)
    a_paper = math.sqrt(2 * (math.log(t / 10 + 1) - math.log(alpha) + beta / alpha))
    assert a.item() == pytest.approx(a_paper, rel=1e-6) and m.item() == pytest.approx(-a_paper**2 + beta / alpha, abs=1e-5)


def test_alibi_slopes():
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(6) == pytest.approx([0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125])
    assert alibi_slopes(4) == [0.25, 0.0625, 0.015625, 0.00390625]


@pytest.mark.parametrize("multiple", [4, 16])
def test_dynamic_ntk_base_matches_transformers(multiple):
    config = make_config(rope={"rope_type": "dynamic", "partial_rotary_factor": 1.0}, hidden_size=512,
                         num_attention_heads=4, max_position_embeddings=4096)  # d_h = 128 as in the paper
    length = multiple * 4096
    d = config.head_dim
    base = 10000.0 * (length / 4096) ** (d / (d - 2))  # θ' = θ (L/L_train)^(d/(d−2))
    expected = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    hf = ROPE_INIT_FUNCTIONS["dynamic"](config, None, seq_len=length)[0]
    ours = compute_inv_freq(config, None, seq_len=length)[0]
    torch.testing.assert_close(hf, expected, rtol=1e-5, atol=0)
    torch.testing.assert_close(ours, hf, rtol=0, atol=0)
    # and the model's rotary module uses it for a forward of that length (no cache, L from the positions)
    rotary = AnGPTRotaryEmbedding(config)
    positions = torch.tensor([[0, 1, length - 1]])
    cos, _ = rotary(torch.zeros(1), positions, rotary.sequence_length(positions))
    torch.testing.assert_close(cos[0, 2, : d // 2], torch.cos((length - 1) * expected), rtol=0, atol=1e-4)
    # called on its own (as transformers' rope tests call it), the module takes L from the positions it is given
    alone, _ = rotary(torch.zeros(1), positions)
    torch.testing.assert_close(alone, cos, rtol=0, atol=0)
    within, _ = rotary(torch.zeros(1), torch.tensor([[0, 1, 4095]]))  # L <= L_train: the base is unchanged
    torch.testing.assert_close(within[0, 2, : d // 2], torch.cos(4095 * (1.0 / 10000.0 ** (
        torch.arange(0, d, 2, dtype=torch.float32) / d))), rtol=0, atol=1e-4)


def test_p_rope_frequencies():
    config = make_config(rope={"rope_type": "scale_invariant_p"}, hidden_size=512, num_attention_heads=4)
    inv_freq = compute_inv_freq(config)[0]  # d_h = 128: 32 rotating pairs from 1 to 1/1024, then 32 zeros
    assert inv_freq.shape == (64,)
    torch.testing.assert_close(inv_freq[:32], 1024.0 ** -(torch.arange(32) / 31.0))
    assert inv_freq[0] == 1.0 and inv_freq[31] == pytest.approx(1 / 1024) and (inv_freq[32:] == 0).all()
    barbero = make_config(rope={"rope_type": "proportional", "partial_rotary_factor": 0.25}, hidden_size=512,
                          num_attention_heads=4)
    inv_freq = compute_inv_freq(barbero)[0]  # keep the highest-frequency quarter of RoPE's 64 pairs
    torch.testing.assert_close(inv_freq[:16], 10000.0 ** -(torch.arange(0, 32, 2) / 128.0))
    assert (inv_freq[16:] == 0).all()


def _oracle(q, k, v, scale, transform, sparsity, causal=True, tau=10.0, k_top=3, window=4, block=5):
    """Independent loop implementation of docs/attention.md for one [h, T, d] problem."""
    heads, length, _ = q.shape
    slopes = alibi_slopes(heads)
    out = torch.zeros_like(q)
    for h in range(heads):
        for i in range(length):
            logit, keys = [], []
            for j in range(length):
                if causal and j > i:
                    continue
                if sparsity == "window" and not i - j < window:
                    continue
                if sparsity == "block" and i // block != j // block:
                    continue
                s = float(q[h, i] @ k[h, j]) * scale
                t = i - j
                if transform == "alibi":
                    s = s - slopes[h] * t
                elif transform == "scale_invariant":
                    ell = math.log(1 + t / tau)
                    s = math.sqrt(1 + 2 * ell) * s - 2 * ell
                logit.append(s)
                keys.append(j)
            if sparsity == "topk" and len(keys) > k_top:
                chosen = sorted(range(len(keys)), key=lambda n: -logit[n])[:k_top]
                logit, keys = [logit[n] for n in chosen], [keys[n] for n in chosen]
            p = torch.softmax(torch.tensor(logit, dtype=torch.float64), 0)
            out[h, i] = sum(p[n] * v[h, keys[n]].double() for n in range(len(keys))).float()
    return out


@pytest.mark.parametrize("transform", ["none", "alibi", "scale_invariant"])
@pytest.mark.parametrize("sparsity", ["none", "topk", "window", "block"])
def test_eager_matches_loop_oracle(transform, sparsity):
    config = make_config(transform, sparsity, scale_invariant_tau=3.0)
    module = SimpleNamespace(config=config, is_causal=True, training=False)
    q, k, v = (torch.randn(1, 4, 12, 8) for _ in range(3))
    out, probs = eager_attention_forward(module, q, k, v, None, scaling=0.7)
    expected = _oracle(q[0], k[0], v[0], 0.7, transform, sparsity, tau=3.0)
    torch.testing.assert_close(out[0].transpose(0, 1), expected, rtol=0, atol=1e-5)


def test_topk_keeps_exactly_k_even_with_ties():
    config = make_config("none", "topk", attention_topk=5, is_causal=False)
    module = SimpleNamespace(config=config, is_causal=False, training=False)
    q = torch.zeros(1, 2, 9, 4)  # every logit equal: a threshold at the k-th value would keep all 9
    k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
    _, probs = eager_attention_forward(module, q, k, v, None, scaling=1.0)
    assert ((probs > 0).sum(-1) == 5).all()
    causal = SimpleNamespace(config=make_config("none", "topk", attention_topk=5), is_causal=True, training=False)
    _, probs = eager_attention_forward(causal, torch.randn(1, 2, 9, 4), k, v, None, scaling=1.0)
    assert (probs > 0).sum(-1)[0, 0].tolist() == [1, 2, 3, 4, 5, 5, 5, 5, 5]  # fewer than k visible: all kept


def test_logn_is_a_query_scaling_by_log_position(monkeypatch):
    # the query reaching the kernel is s_h·log(i+1)·q, i = absolute position (n = i + 1 visible keys)
    model = build(make_config("logn", "none", "gptplus", {"rope_type": "none"}, logn_init=0.4), "eager")
    plain = build(make_config("none", "none", "gptplus", {"rope_type": "none"}), "eager")
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "query_head_scale" not in k})
    backend = attention_angpt.ATTENTION_BACKENDS["eager"]
    captured, original = [], backend.function

    def spy(module, query, *args, **kwargs):
        captured.append(query)
        return original(module, query, *args, **kwargs)

    monkeypatch.setitem(attention_angpt.ATTENTION_BACKENDS, "eager", dataclasses.replace(backend, function=spy))
    ids = torch.randint(1, 101, (1, 10))
    logits(model, ids)
    logits(plain, ids)
    s_h = model.model.layers[0].self_attn.query_head_scale.detach().view(1, 4, 1, 1)
    assert not torch.allclose(s_h, torch.full_like(s_h, 0.4))  # perturbed per head, so a wrong head order shows
    scale = s_h * torch.log(torch.arange(1, 11.0)).view(1, 1, 10, 1)
    torch.testing.assert_close(captured[0], captured[2] * scale, rtol=1e-6, atol=1e-6)


# Neutral settings reduce to plain attention (docs/attention.md)
NEUTRAL = [
    ("topk k >= T", dict(attention_sparsity="topk", attention_topk=18), {}),
    ("window >= T", dict(attention_sparsity="window", attention_window=18), {}),
    ("block >= T", dict(attention_sparsity="block", attention_block_size=18), {}),
    ("partial_rotary_factor 0 = NoPE", dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.0}),
     dict(rope_parameters={"rope_type": "none"})),
    ("proportional p=1 = RoPE", dict(rope_parameters={"rope_type": "proportional", "partial_rotary_factor": 1.0}),
     dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 1.0})),
    ("dynamic within L_train = RoPE", dict(rope_parameters={"rope_type": "dynamic"}), {}),
    ("scale_invariant with tau -> inf", dict(attention_logit_transform="scale_invariant", scale_invariant_tau=1e30), {}),
]


@pytest.mark.parametrize("name,variant,reference", NEUTRAL, ids=[n for n, _, _ in NEUTRAL])
def test_neutral_settings_reduce_to_plain(name, variant, reference):
    base = dict(rope_parameters={"rope_type": "default"}, attention_sparsity="none")
    model = build(make_config(**{**base, **variant}), "angpt_chunked")
    plain = build(make_config(**{**base, **reference}), "eager")
    plain.load_state_dict(model.state_dict())
    ids, mask = padded_batch(length=18, pad=3)
    assert_close_on(mask, logits(model, ids, mask), logits(plain, ids, mask))


def test_scale_invariant_at_t0_only_is_plain():
    # one token: only t = 0 exists, where a_0 = 1 and m_0 = 0; and with block size 1 every key is t = 0
    model = build(make_config("scale_invariant", "block", attention_block_size=1), "eager")
    plain = build(make_config("none", "block", attention_block_size=1), "eager")
    plain.load_state_dict(model.state_dict())
    ids, mask = padded_batch(length=12)
    assert_close_on(mask, logits(model, ids, mask), logits(plain, ids, mask))
    assert_close_on(None, logits(model, ids[:, :1]), logits(plain, ids[:, :1]))
