"""bench/length_rotary_pairs.py: its parts of the raw logit are the rotary pairs (checked by brute force against q
and k taken from the attention call, and by the relative-position property: shifting every position leaves each
pair's products unchanged), dropping a pair is zeroing its query channels (checked against the model with those
channels' QK-norm gain at zero), and the script runs end to end, its intact row reproducing the benchmark's loss."""
from __future__ import annotations

import json
import math

import pytest
import torch
from attention_fixtures import build, captured_attention_calls, make_config
from bench_fixtures import bench, tiny_length_models  # noqa: F401 (fixture)


SI_P_ROPE = {"rope_type": "scale_invariant_p", "partial_rotary_factor": 0.5}
PARTIAL_ROPE = {"rope_type": "default", "partial_rotary_factor": 0.5}


@pytest.fixture
def pairs(bench):  # noqa: F811
    import length_rotary_pairs

    return length_rotary_pairs


def octave_of(t: int) -> int:
    return 0 if t == 0 else int(math.floor(math.log2(t))) + 1


def record(pairs, model, ids, rows, octaves, position_ids=None):
    """The recorder's mean parts [layers, heads, parts, octaves], and (q, k, scaling) of each layer as captured by a
    plain wrapper of the attention call."""
    _, membership = pairs.components(model.config)
    recorder = pairs.PairRecorder(model.config.num_hidden_layers, model.config.num_attention_heads, membership,
                                  octaves, rows)
    with torch.no_grad(), captured_attention_calls() as captured, \
            pairs.attention_calls(pairs.recording({ids.shape[1]: recorder})):
        model(ids, position_ids=position_ids)
    return recorder.mean(), captured


@pytest.mark.parametrize("rope, kv_heads", [(SI_P_ROPE, 4), (PARTIAL_ROPE, 2), (None, 4)])
def test_parts_are_the_rotary_pairs(pairs, rope, kv_heads):
    config = make_config("scale_invariant" if rope is SI_P_ROPE else "none", architecture="gptplus", rope=rope,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=2048)
    model = build(config, "eager")
    length, rows = 40, slice(20, 40)
    octaves = 7  # t up to 39
    ids = torch.randint(0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    found, captured = record(pairs, model, ids, rows, octaves)

    # brute force: each rotating channel c pairs with its rotate-half partner c + r/2; the rest do not turn
    inv_freq = model.model.rotary_emb.inv_freq
    half = len(inv_freq)
    groups = [[c, c + half] for c in range(half) if inv_freq[c] > 0]
    groups.append([c for c in range(config.head_dim) if not any(c in g for g in groups)])
    assert found.shape == (config.num_hidden_layers, 4, len(groups), octaves)
    for layer, (query, key, scaling) in enumerate(captured):
        key = key.repeat_interleave(4 // kv_heads, dim=1)
        for part, channels in enumerate(groups):
            products = (query[0][..., channels] @ key[0][..., channels].transpose(-1, -2)).double() * scaling
            for octave in range(octaves):
                cells = [(i, j) for i in range(rows.start, rows.stop) for j in range(i + 1) if octave_of(i - j) == octave]
                i, j = torch.tensor(cells).T
                torch.testing.assert_close(torch.as_tensor(found[layer, :, part, octave]),
                                           products[:, i, j].mean(-1), atol=1e-6, rtol=1e-5)

    # relative position: the same tokens at positions shifted by 100 give the same part of every pair
    shifted, _ = record(pairs, model, ids, rows, octaves, position_ids=torch.arange(100, 100 + length)[None])
    torch.testing.assert_close(torch.as_tensor(shifted), torch.as_tensor(found), atol=2e-4, rtol=1e-3)


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


def test_length_rotary_pairs_smoke(bench, pairs, tmp_path):  # noqa: F811
    out, results, _, _ = bench
    import length_attention
    import length_generalisation

    models = tiny_length_models(bench, tmp_path, "p-RoPE", "scale-invariant p-RoPE")
    length_generalisation.main([*models, *out])
    length_attention.main([*models, *out])
    pairs.main([*models, *out])
    text = results.read_text()
    section = text.split("<!-- length_rotary_pairs:start -->")[1].split("<!-- length_rotary_pairs:end")[0]
    assert "python bench/length_rotary_pairs.py" in section and "Machine:" in section
    assert "## Length generalisation: which rotary pairs make the distance penalty, seed 0, 2 steps" in section

    def rows(body: str, start: str) -> list[list[str]]:
        return [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines() if line.startswith(start)]

    profile = text.split("<!-- length_attention:start -->")[1].split("<!-- length_attention:end")[0]
    losses = text.split("<!-- length_generalisation:start -->")[1].split("<!-- length_generalisation:end")[0]
    for variant in ("p-RoPE", "scale-invariant p-RoPE"):
        parts = rows(section.split("Each rotating pair dropped")[0], f"| {variant}, seed 0 | ")
        turning = ["1", "1/10", "1/102", "1/1024"]  # d_h = 16: 8 pairs, 4 turning at 1024^(−k/3) radians per token
        assert [row[1] for row in parts] == [*turning, pairs.STATIC, "S"]
        for column in range(2, len(parts[0])):  # the parts add up to S
            assert sum(float(row[column]) for row in parts[:-1]) == pytest.approx(float(parts[-1][column]), abs=0.003)
        mean_of_s = rows(profile, f"| {variant}, seed 0 | ")[-1][1].split(",")[0]  # bench/length_attention.py's μ
        assert float(parts[-1][2]) == pytest.approx(float(mean_of_s), abs=0.006)
        ablation = rows(section.split("Each rotating pair dropped")[1], f"| {variant}, seed 0 | ")
        assert [row[1] for row in ablation] == ["none", *turning]
        assert ablation[0][2] == rows(losses, f"| {variant} | ")[0][1]  # the intact model: the benchmark's 1× loss
        assert len(ablation[0]) == 7 and all(cell.startswith(("+", "-")) for cell in ablation[0][3:])
    assert (tmp_path / "plots" / "length_rotary_pairs.png").is_file()
    kept = tmp_path / "runs" / "p-rope-s0" / "rotary_pairs.json"
    assert json.loads(kept.read_text())["dropped"].keys() == set(turning)
    kept.write_text(kept.read_text().replace('"single": ', '"single": 1'))  # a run again reads what was kept
    pairs.main([*models, *out])
    assert "| p-RoPE, seed 0 | none | 15." in results.read_text()
    # the control: the channels that do not turn, dropped two at a time with their rotate-half partners
    static = [f"{pairs.STATIC}: channels {c}, {c + 8}" for c in range(4, 8)]
    for drop, shown in (("all", ["none", *turning, *static]), ("turning", ["none", *turning])):
        pairs.main([*models, "--drop", drop, *out])
        section = results.read_text().split("<!-- length_rotary_pairs:start -->")[1].split("<!-- length_rotary")[0]
        ablation = rows(section.split("Each rotating pair dropped")[1], "| scale-invariant p-RoPE, seed 0 | ")
        assert [row[1] for row in ablation] == shown
    with pytest.raises(SystemExit, match="--variants NoPE: expected variants with rotary pairs"):
        pairs.main([*models, "--variants", "NoPE", *out])
    with pytest.raises(SystemExit, match="--length 200: expected a power of two"):
        pairs.main([*models, "--length", "200", *out])
