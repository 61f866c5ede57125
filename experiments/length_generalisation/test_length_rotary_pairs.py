"""length_rotary_pairs.py: its parts of the raw logit are the rotary pairs, and their spread is each query's
variance over its keys (both checked by brute force against q and k taken from the attention call, and by the
relative-position property: shifting every position leaves each pair's products unchanged); S's variance after a
drop, computed from the intact model, is the changed model's; dropping a pair is zeroing its query channels
(checked against the model with those channels' QK-norm gain at zero); and the script runs end to end, its intact
row reproducing the experiment's loss."""
from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from attention_fixtures import build, captured_attention_calls, make_config
from experiments.smoke_arguments import tiny_length_models


SI_P_ROPE = {"rope_type": "scale_invariant_p", "partial_rotary_factor": 0.5}
PARTIAL_ROPE = {"rope_type": "default", "partial_rotary_factor": 0.5}


@pytest.fixture
def pairs(experiment):
    import length_rotary_pairs

    return length_rotary_pairs


def octave_of(t: int) -> int:
    return 0 if t == 0 else int(math.floor(math.log2(t))) + 1


def record(pairs, model, ids, rows, octaves, position_ids=None, stride=1):
    """The recorder's mean parts [layers, heads, parts, octaves] and spread (per unit of `spread_units`), and
    (q, k, scaling) of each layer as captured by a plain wrapper of the attention call."""
    labels, membership = pairs.components(model.config)
    _, units = pairs.spread_units(labels, membership)
    recorder = pairs.PairRecorder(model.config.num_hidden_layers, model.config.num_attention_heads, membership,
                                  octaves, rows, units, stride)
    with torch.no_grad(), captured_attention_calls() as captured, \
            pairs.attention_calls(pairs.recording({ids.shape[1]: recorder})):
        model(ids, position_ids=position_ids)
    return recorder.mean(), recorder.spread(), captured


@pytest.mark.parametrize("rope, kv_heads, stride", [(SI_P_ROPE, 4, 1), (PARTIAL_ROPE, 2, 3), (None, 4, 1)])
def test_parts_are_the_rotary_pairs(pairs, rope, kv_heads, stride):
    config = make_config("scale_invariant" if rope is SI_P_ROPE else "none", architecture="gptplus", rope=rope,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=2048)
    model = build(config, "eager")
    length, rows = 40, slice(20, 40)
    octaves = 7  # t up to 39
    ids = torch.randint(0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    found, spread, captured = record(pairs, model, ids, rows, octaves, stride=stride)

    # brute force: each rotating channel c pairs with its rotate-half partner c + r/2; the rest do not turn
    inv_freq = model.model.rotary_emb.inv_freq
    half = len(inv_freq)
    groups = [[c, c + half] for c in range(half) if inv_freq[c] > 0]
    static = [c for c in range(config.head_dim) if not any(c in g for g in groups)]
    units = [*groups, *([static[i], static[i + len(static) // 2]] for i in range(len(static) // 2)), static,
             list(range(config.head_dim))]  # turning pairs, static pairs, all static channels, all channels (S)
    groups.append(static)
    assert found.shape == (config.num_hidden_layers, 4, len(groups), octaves)
    assert spread["variance"].shape == spread["covariance"].shape == (config.num_hidden_layers, 4, len(units),
                                                                      octaves)
    for layer, (query, key, scaling) in enumerate(captured):
        key = key.repeat_interleave(4 // kv_heads, dim=1)

        def products(channels):
            return (query[0][..., channels] @ key[0][..., channels].transpose(-1, -2)).double() * scaling

        for octave in range(octaves):
            cells = [(i, j) for i in range(rows.start, rows.stop) for j in range(i + 1) if octave_of(i - j) == octave]
            i, j = torch.tensor(cells).T
            for part, channels in enumerate(groups):
                torch.testing.assert_close(torch.as_tensor(found[layer, :, part, octave]),
                                           products(channels)[:, i, j].mean(-1), atol=1e-6, rtol=1e-5)
            # spread: each query's variance over its keys in the octave (and covariance with S), mean over every
            # stride-th query
            s = products(list(range(config.head_dim)))
            queries = [q for q in range(rows.start, rows.stop, stride) if q in set(i.tolist())]
            for unit, channels in enumerate(units):
                part = products(channels)
                variance, covariance = [], []
                for query_row in queries:
                    keys = j[i == query_row]
                    x, y = part[:, query_row, keys], s[:, query_row, keys]
                    variance.append(x.var(-1, unbiased=False))
                    covariance.append(((x - x.mean(-1, keepdim=True)) * (y - y.mean(-1, keepdim=True))).mean(-1))
                for name, oracle in (("variance", variance), ("covariance", covariance)):
                    torch.testing.assert_close(torch.as_tensor(spread[name][layer, :, unit, octave]),
                                               torch.stack(oracle).mean(0), atol=1e-6, rtol=1e-5)

    # relative position: the same tokens at positions shifted by 100 give the same part of every pair
    shifted, shifted_spread, _ = record(pairs, model, ids, rows, octaves,
                                        position_ids=torch.arange(100, 100 + length)[None], stride=stride)
    torch.testing.assert_close(torch.as_tensor(shifted), torch.as_tensor(found), atol=2e-4, rtol=1e-3)
    torch.testing.assert_close(torch.as_tensor(shifted_spread["variance"]), torch.as_tensor(spread["variance"]),
                               atol=2e-4, rtol=1e-3)


def test_variance_without_a_part_is_the_changed_models(pairs):
    """The ablation table's S variance after a drop (or a scaled query) comes from the intact model's variances and
    covariances; the oracle is the recorder run on the model with that change made, in the first layer (whose
    input the change leaves alone)."""
    config = make_config("scale_invariant", architecture="gptplus", rope=SI_P_ROPE, num_attention_heads=2,
                         max_position_embeddings=2048)
    model = build(config, "eager")
    labels, membership = pairs.components(model.config)
    unit_labels, units = pairs.spread_units(labels, membership)
    ids = torch.randint(0, config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(2))
    rows, octaves = slice(24, 48), 7

    def spread(*changes):
        recorder = pairs.PairRecorder(config.num_hidden_layers, 2, membership, octaves, rows, units)
        with torch.no_grad(), contextlib.ExitStack() as stack:
            stack.enter_context(pairs.attention_calls(pairs.recording({48: recorder})))
            for wrap in changes:  # entered after the recording: the recorder sees the changed query
                stack.enter_context(pairs.attention_calls(wrap))
            model(ids)
        return {"spread": {"long": {k: v[:1] for k, v in recorder.spread().items()}}, "spread_labels": unit_labels}

    intact = spread()
    static_label, static_channels = pairs.static_pairs(membership)[0]
    changes = [(label, pairs.dropping(units[unit_labels.index(label)])) for label in labels[:-1]]
    changes += [(static_label, pairs.dropping(static_channels))]
    changes += [(pairs.shrunk_label(share), pairs.scaling(share ** 0.5)) for share in pairs.SHRUNK_VARIANCE]
    for label, wrap in changes:
        changed = spread(wrap)
        for octave in range(2, octaves):
            expected = pairs.variance_without(changed, "none", "long", octave)
            assert pairs.variance_without(intact, label, "long", octave) == pytest.approx(expected, rel=1e-6), label


def test_dropping_a_pair_is_zeroing_its_query_channels(pairs):
    config = make_config("scale_invariant", architecture="gptplus", rope=SI_P_ROPE, num_attention_heads=2)
    model = build(config, "eager")
    labels, membership = pairs.components(model.config)
    assert labels[-1] == pairs.STATIC and len(labels) == config.head_dim // 4 + 1  # p = 0.5: a quarter of d_h turns
    ids = torch.randint(0, config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    channels = list(torch.nonzero(torch.as_tensor(membership[:, 1])).flatten().tolist())
    oracle = build(config, "eager")
    oracle.load_state_dict(model.state_dict())
    with torch.no_grad():
        for layer in oracle.model.layers:  # QK-norm's gain scales q's channels before the rotation mixes a pair
            layer.self_attn.q_norm.weight[channels] = 0.0
        expected = oracle(ids).logits
        with pairs.attention_calls(pairs.dropping(channels)):
            dropped = model(ids).logits
        intact = model(ids).logits  # the wrap is gone again
    torch.testing.assert_close(dropped, expected)
    assert not torch.allclose(intact, expected)


def test_length_rotary_pairs_smoke(experiment, pairs, tmp_path):
    out, results, _, _ = experiment
    import length_attention
    import length_generalisation

    models = tiny_length_models(experiment, tmp_path, "p-RoPE", "scale-invariant p-RoPE")
    length_generalisation.main([*models, *out])
    length_attention.main([*models, *out])
    pairs.main([*models, *out])
    text = results.read_text()
    section = text.split("<!-- length_rotary_pairs:start -->")[1].split("<!-- length_rotary_pairs:end")[0]
    assert "python experiments/length_generalisation/length_rotary_pairs.py" in section and "Machine:" in section
    assert "## Length generalisation: which rotary pairs make the distance penalty, seed 0, 2 steps" in section

    def rows(body: str, start: str) -> list[list[str]]:
        return [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines() if line.startswith(start)]

    profile = text.split("<!-- length_attention:start -->")[1].split("<!-- length_attention:end")[0]
    losses = text.split("<!-- length_generalisation:start -->")[1].split("<!-- length_generalisation:end")[0]
    for variant in ("p-RoPE", "scale-invariant p-RoPE"):
        parts = rows(section.split("The spread of each part")[0], f"| {variant}, seed 0 | ")
        turning = ["1", "1/10", "1/102", "1/1024"]  # d_h = 16: 8 pairs, 4 turning at 1024^(−k/3) radians per token
        assert [row[1] for row in parts] == [*turning, pairs.STATIC, "S"]
        for column in range(2, len(parts[0])):  # the parts add up to S
            assert sum(float(row[column]) for row in parts[:-1]) == pytest.approx(float(parts[-1][column]), abs=0.003)
        mean_of_s = rows(profile, f"| {variant}, seed 0 | ")[-1][1].split(",")[0]  # length_attention.py's μ
        assert float(parts[-1][2]) == pytest.approx(float(mean_of_s), abs=0.006)
        spread = rows(section.split("The spread of each part")[1].split("Each rotating pair")[0], f"| {variant}, s")
        assert [row[1] for row in spread] == [*turning, pairs.STATIC, "S", "between parts"]
        for column in range(2, len(spread[0])):  # S's variance: the parts' own and what lies between them
            own = sum(float(row[column]) for row in spread[:-2])
            assert own + float(spread[-1][column]) == pytest.approx(float(spread[-2][column]), abs=0.003)
            assert all(float(row[column]) >= 0 for row in spread[:-1])
        ablation = rows(section.split("Each rotating pair dropped")[1], f"| {variant}, seed 0 | ")
        assert [row[1] for row in ablation] == ["none", *turning]
        assert ablation[0][2] == rows(losses, f"| {variant} | ")[0][1]  # the intact model: the experiment's 1× loss
        assert len(ablation[0]) == 9 and all(cell.startswith(("+", "-")) for cell in ablation[0][3:7])
        assert ablation[0][7:] == [spread[-2][2], spread[-2][-1]]  # the intact S's variance, within L and farthest
    assert (tmp_path / "plots" / "length_rotary_pairs.png").is_file()
    kept = tmp_path / "runs" / "p-rope-s0" / "rotary_pairs.json"
    assert json.loads(kept.read_text())["dropped"].keys() == set(turning)
    kept.write_text(kept.read_text().replace('"single": ', '"single": 1'))  # a run again reads what was kept
    pairs.main([*models, *out])
    assert "| p-RoPE, seed 0 | none | 15." in results.read_text()
    # the control: the channels that do not turn, dropped two at a time with their rotate-half partners
    static = [f"{pairs.STATIC}: channels {c}, {c + 8}" for c in range(4, 8)]
    scaled = ["q × 0.949 (S's variance × 0.9)", "q × 0.894 (S's variance × 0.8)"]
    for drop, shown in (("all", ["none", *turning, *static, *scaled]), ("turning", ["none", *turning])):
        pairs.main([*models, "--drop", drop, *out])
        section = results.read_text().split("<!-- length_rotary_pairs:start -->")[1].split("<!-- length_rotary")[0]
        ablation = rows(section.split("Each rotating pair dropped")[1], "| scale-invariant p-RoPE, seed 0 | ")
        assert [row[1] for row in ablation] == shown
        if drop == "all":  # the scaled queries' S variance: the intact one times the share
            assert float(ablation[-1][-1]) == pytest.approx(0.8 * float(ablation[0][-1]), abs=0.0011)
    with pytest.raises(SystemExit, match="--variants NoPE: expected variants with rotary pairs"):
        pairs.main([*models, "--variants", "NoPE", *out])
    with pytest.raises(SystemExit, match="--length 200: expected a power of two"):
        pairs.main([*models, "--length", "200", *out])
