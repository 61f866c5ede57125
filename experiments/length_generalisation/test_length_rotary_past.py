"""length_rotary_past.py: an edit past L changes the raw logit S only on the keys at distance t ≥ L (checked
by brute force against the first layer's attention weights, computed from q and k taken from the attention call);
on every key (L = 0) it is the whole drop and the scaled query of length_rotary_pairs.py; a shuffled part keeps
each query's values and moves them among its keys past L; and the script runs end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from attention_fixtures import build, captured_attention_calls, make_config
from experiments.smoke_arguments import tiny_length_models

from modeling_angpt.attention_angpt import CHUNKED

SI_P_ROPE = {"rope_type": "scale_invariant_p", "partial_rotary_factor": 0.5}
PARTIAL_ROPE = {"rope_type": "default", "partial_rotary_factor": 0.5}


@pytest.fixture
def past(experiment):
    import length_rotary_past

    return length_rotary_past


@pytest.fixture
def probe(experiment):
    import rotary_pairs_probe

    return rotary_pairs_probe


def run(probe, model, ids, *wraps):
    with torch.no_grad(), captured_attention_calls() as captured:
        if wraps:
            with probe.attention_calls(wraps[0]):
                out = model(ids, output_attentions=True)
        else:
            out = model(ids, output_attentions=True)
    return out, captured


@pytest.mark.parametrize("implementation", ["eager", CHUNKED])
def test_on_every_key_it_is_the_whole_drop_and_the_scaled_query(probe, implementation):
    config = make_config("scale_invariant", architecture="gptplus", rope=SI_P_ROPE, num_attention_heads=2,
                         attention_query_chunk_size=8)
    model = build(config, implementation)
    labels, membership = probe.components(config)
    pair = [int(c) for c in torch.nonzero(torch.as_tensor(membership[:, 1])).flatten()]
    ids = torch.randint(0, config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for edit, whole in ((probe.editing_past(0, pair), probe.dropping(pair)),
                            (probe.editing_past(0, list(range(config.head_dim)), factor=0.8), probe.scaling(0.8))):
            with probe.attention_calls(edit):
                edited = model(ids).logits
            with probe.attention_calls(whole):
                expected = model(ids).logits
            torch.testing.assert_close(edited, expected, atol=2e-5, rtol=1e-5)
            assert not torch.allclose(edited, model(ids).logits, atol=1e-3)


@pytest.mark.parametrize("shuffle", [False, True])
def test_only_keys_past_l_change(probe, shuffle):
    """Oracle: the first layer's attention weights from q and k of the attention call, with the pair's products
    removed (or, shuffled, moved among each query's keys) at t ≥ L only. No logit transform, so the weights are a
    softmax of S itself and each row's S can be read back from them."""
    config = make_config("none", architecture="gptplus", rope=PARTIAL_ROPE, num_attention_heads=2,
                         num_key_value_heads=1)
    model = build(config, "eager")
    labels, membership = probe.components(config)
    channels = [int(c) for c in torch.nonzero(torch.as_tensor(membership[:, 0])).flatten()]  # the fastest pair
    ids = torch.randint(0, config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    length = 12
    intact, _ = run(probe, model, ids)
    edited, captured = run(probe, model, ids, probe.editing_past(length, channels, shuffle=shuffle, seed=3))
    query, key, scaling = captured[0]
    key = key.repeat_interleave(2, dim=1)
    s = (query @ key.transpose(-1, -2) * scaling)[0].double()  # [h, T, T]
    part = (query[..., channels] @ key[..., channels].transpose(-1, -2) * scaling)[0].double()
    i, j = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
    far = i - j >= length
    # the queries with no key as far as L are exactly as intact, in every layer
    torch.testing.assert_close(edited.logits[:, :length], intact.logits[:, :length], atol=0, rtol=0)
    assert not torch.allclose(edited.logits[:, length:], intact.logits[:, length:], atol=1e-4)
    weights = edited.attentions[0][0].double()  # [h, T, T]
    if not shuffle:
        expected = torch.softmax((s - part * far).masked_fill(j > i, float("-inf")), dim=-1)
        torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)
        return
    # S read back from the weights, up to each row's constant, fixed by the row's own key (t = 0: not edited)
    logits = weights.log() - weights.diagonal(dim1=-2, dim2=-1).log()[..., None] + s.diagonal(dim1=-2, dim2=-1)[..., None]
    moved = logits - (s - part)  # the pair's part each key now has
    torch.testing.assert_close(moved[:, ~far & (j <= i)], part[:, ~far & (j <= i)], atol=1e-4, rtol=1e-4)
    for row in range(length, 40):
        keys = far[row]
        got, own = moved[:, row, keys], part[:, row, keys]
        torch.testing.assert_close(got.sort(-1).values, own.sort(-1).values, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(moved[:, far], part[:, far], atol=1e-3)  # they did move


def test_shuffled_past_is_a_permutation_of_each_querys_past_keys(probe):
    generator = torch.Generator().manual_seed(0)
    part = torch.randn(2, 3, 6, 10, generator=generator)
    first = torch.tensor([0, 1, 3, 10, 5, 7])  # past keys of each query: positions [0, first)
    past = (torch.arange(10) < first[:, None])[None, None].expand(2, 1, 6, 10)
    shuffled = probe.shuffled_past(part, past, torch.Generator().manual_seed(1))
    for row, count in enumerate(first.tolist()):
        torch.testing.assert_close(shuffled[..., row, :count].sort(-1).values, part[..., row, :count].sort(-1).values)
    assert not torch.equal(shuffled[..., 3, :], part[..., 3, :])
    torch.testing.assert_close(probe.shuffled_past(part, past, torch.Generator().manual_seed(1)), shuffled)
    with pytest.raises(ValueError, match="the past keys of a query must come first"):
        probe.shuffled_past(part, past.flip(-1), generator)


def test_spread_and_shuffle_adds_the_controls_rate_to_the_shuffle(past):
    """A part p independent of the rest of S (cov(p, S) = var p): dropping it takes var p from S, shuffling it
    nothing; the scale control takes 0.2 of S's variance for 0.1 of excess, so the loss of spread is worth 0.5 per
    unit, and the sum is 0.5·(−var p) + the shuffle's change."""
    def losses(far):
        return {"single": 5.0, "excess": [0.0, 0.0, 0.0, far]}

    variance = np.zeros((1, 1, 2, 3))
    variance[..., 0, 2], variance[..., 1, 2] = 0.1, 1.0  # the part, S (octave 2)
    covariance = variance.copy()  # cov(p, S) = var p, cov(S, S) = var S
    run = {"intact": losses(0.3), "spread_labels": ["1/7", "S"],
           "spread": {"long": {"variance": variance, "covariance": covariance}},
           "dropped": {"1/7": losses(0.1), past.WHOLE_SCALED: losses(0.25)},
           "past": {"1/7": {past.PAST: losses(0.12), past.SHUFFLED: losses(0.27)}, past.SCALED: {past.PAST: losses(0.2)}}}
    found = past.changes(run, "1/7", "long", 2)
    assert found["dropped"][0] == pytest.approx(-0.1) and found[past.SHUFFLED][0] == pytest.approx(0.0)
    assert past.changes(run, past.SCALED, "long", 2)[past.PAST][0] == pytest.approx(-0.2)
    assert past.spread_and_shuffle(run, "1/7", "long", 2) == pytest.approx(-0.1 * 0.5 - 0.03)
    assert past.spread_and_shuffle(run, past.SCALED, "long", 2) is None
    assert [past.kind(label, 256) for label in ("1/53", "1/141", f"{past.STATIC}: channels 8, 24", past.SCALED)] \
        == list(past.KINDS)


def test_length_rotary_past_smoke(experiment, past, tmp_path):
    out, results, _, _ = experiment
    models = tiny_length_models(experiment, tmp_path, "scale-invariant p-RoPE")
    past.main([*models, *out])
    text = results.read_text()
    section = text.split("<!-- length_rotary_past:start -->")[1].split("<!-- length_rotary_past:end")[0]
    assert "python experiments/length_generalisation/length_rotary_past.py" in section and "Machine:" in section
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| scale-invariant p-RoPE, seed 0 | ")]
    assert "length_rotary_pairs:start" not in text  # it reads the pairs' cache, it does not write their section
    labels = [row[1] for row in rows]
    assert labels[0] == "none" and labels[-1] == past.SCALED
    assert labels[1:5] == ["1", "1/10", "1/102", "1/1024"] and labels[5].startswith(past.STATIC)
    runs = tmp_path / "runs"
    checkpoint = next(runs.glob("scale-invariant_p-rope-s0"))
    cache = json.loads((checkpoint / "rotary_past.json").read_text())
    whole = json.loads((checkpoint / "rotary_pairs.json").read_text())
    for label in labels[1:]:  # an edit past L leaves the 1× windows alone
        for found in cache["past"][label].values():
            assert found["single"] == whole["intact"]["single"]
    for row in rows[1:-1]:  # the whole drop's column is length_rotary_pairs.py's
        dropped = whole["dropped"][row[1]]["excess"]
        assert float(row[5]) == pytest.approx(dropped[-1] - whole["intact"]["excess"][-1], abs=6e-4)
    # the summary: the rows of each kind (ω·L ≥ π: 1 and 1/10 at L = 256), their mean, the control's variance
    summary = [[c.strip() for c in line.strip("|").split("|")] for line in section.split("The same at")[1].splitlines()
               if line.startswith("| scale-invariant p-RoPE | ")]
    assert [(row[1], row[2]) for row in summary] == [(past.KINDS[0], "2"), (past.KINDS[1], "2"), (past.KINDS[2], "4"),
                                                     (past.KINDS[3], "1")]
    fast = [float(row[8]) for row in rows if row[1] in ("1", "1/10")]  # Δ var S, dropped
    assert float(summary[0][6]) == pytest.approx(sum(fast) / 2, abs=6e-4) and abs(sum(fast)) > 0.05
    assert float(summary[3][6]) == pytest.approx(-0.2 * float(rows[0][8]), abs=1.1e-3)
    with pytest.raises(SystemExit, match="--variants ALiBi: expected variants with rotary pairs"):
        past.main([*models, "--variants", "ALiBi", *out])
