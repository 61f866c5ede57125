"""length_attention.py: its probe records the attention weights the model itself computes and the raw
logits q·k/√d_h it starts from (checked against the eager path's returned weights and against q and k taken
straight from the attention call), leaves the model's output alone, and the script runs end to end."""
from __future__ import annotations

import math

import pytest
import torch
from attention_fixtures import build, captured_attention_calls, make_config
from experiments.smoke_arguments import tiny_length_models

from modeling_angpt.logit_transforms_angpt import LOGIT_TRANSFORMS

RUNS = [("scale_invariant", {"rope_type": "scale_invariant_p", "partial_rotary_factor": 0.5}),
        ("alibi", {"rope_type": "none"}), ("logn", None), ("none", None)]


@pytest.fixture
def probes(experiment):
    """length_attention.py imported; the probe transforms it registers are removed again afterwards."""
    import length_attention

    yield length_attention
    for name in [name for name in LOGIT_TRANSFORMS if name.startswith(length_attention.PROBE_PREFIX)]:
        LOGIT_TRANSFORMS.pop(name)


def octave_of(t: int) -> int:
    return 0 if t == 0 else int(math.floor(math.log2(t))) + 1


@pytest.mark.parametrize("transform, rope", RUNS)
def test_probe_records_the_models_own_weights_and_raw_logits(probes, transform, rope):
    config = make_config(transform, architecture="gptplus", rope=rope)
    model = build(config, "eager")
    probed = build(make_config(probes.probe_transform(transform), architecture="gptplus", rope=rope), "eager")
    probed.load_state_dict(model.state_dict())
    length, rows = 40, slice(20, 40)
    ids = torch.randint(0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))

    with torch.no_grad():
        expected = model(ids, output_attentions=True)
        octaves = probes.octave_count(length)
        probes.RECORDER = probes.AttentionRecorder(config.num_hidden_layers, config.num_attention_heads, octaves)
        try:
            probes.RECORDER.start(rows)
            with captured_attention_calls() as captured:  # (q, k, scaling) of each layer: the raw-logit oracle
                logits = probed(ids).logits
            found = probes.RECORDER.summary()
        finally:
            probes.RECORDER = None
    torch.testing.assert_close(logits, expected.logits)  # the probe changes nothing

    for layer, (weights, (query, key, scaling)) in enumerate(zip(expected.attentions, captured)):
        raw = (query @ key.transpose(-1, -2))[0] * scaling  # [h, T, T]
        for octave in range(octaves):
            pairs = [(i, j) for i in range(rows.start, rows.stop) for j in range(i + 1) if octave_of(i - j) == octave]
            if not pairs:
                continue
            rows_, cols = torch.tensor(pairs).T
            mass = weights[0][:, rows_, cols].sum(-1) / (rows.stop - rows.start)
            values = raw[:, rows_, cols].double()
            torch.testing.assert_close(torch.as_tensor(found["mass"][layer, :, octave]), mass.double(),
                                       atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(torch.as_tensor(found["mean"][layer, :, octave]), values.mean(-1),
                                       atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(torch.as_tensor(found["spread"][layer, :, octave]),
                                       values.std(-1, unbiased=False), atol=1e-4, rtol=1e-3)


def test_length_attention_smoke(experiment, probes, tmp_path):
    out, results, _, _ = experiment
    import length_generalisation

    models = tiny_length_models(experiment, tmp_path, "ALiBi", "scale-invariant p-RoPE")
    length_generalisation.main([*models, *out])
    probes.main([*models, *out])
    text = results.read_text().split("<!-- length_attention:start -->")[1].split("<!-- length_attention:end")[0]
    assert "python experiments/length_generalisation/length_attention.py" in text and "Machine:" in text
    assert "## Length generalisation: where the attention goes past L, seed 0, 2 steps, d=32, 1 layer\n" in text
    rows = [line for line in text.splitlines() if line.startswith("| ALiBi, seed 0 |")
            or line.startswith("| scale-invariant p-RoPE, seed 0 |")]
    assert len(rows) == 6  # each model in the weight, per-layer and logit tables
    for row in rows[:2]:  # weight per distance bin: each query's weights sum to 1; the loss excess is filled in
        cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
        assert sum(float(c) for c in cells[:5]) == pytest.approx(1.0, abs=0.003)
        assert float(cells[5]) == pytest.approx(sum(float(c) for c in cells[1:5]), abs=0.003)
        assert cells[6].startswith(("+", "-"))
    assert (tmp_path / "plots" / "length_attention.png").is_file()
    with pytest.raises(SystemExit, match="--eval-corpus blocks: expected"):
        probes.main([*models, "--eval-corpus", "blocks", *out])
    with pytest.raises(SystemExit, match="--length 200: expected a power of two"):
        probes.main([*models, "--length", "200", *out])
