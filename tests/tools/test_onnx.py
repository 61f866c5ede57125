"""ONNX Runtime runs the folded form (docs/inference-fold.md, "ONNX"; docs/tools.md, "ONNX Runtime"): `angpt onnx`
writes a graph whose logits match the *training-form* model's (the unfolded oracle, not the folded model the export
traced) at batch sizes and lengths other than the traced ones, left padding included; a training-form checkpoint is
refused in one line naming `angpt export`. With the KV cache, greedy decoding in onnxruntime gives the tokens and
logits of `generate` on the training form. One export takes 10-60 s on a busy 2-core CPU: one anGPT of one layer
runs in make test, the rest is marked slow."""
from __future__ import annotations

import pytest
import torch
from checkpoint_fixtures import save_source
from cli_helpers import REPO, angpt, assert_one_line_error, snapshot

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.export.fold import export_checkpoint, probe_batch

pytestmark = pytest.mark.tools  # make test-tools

TOLERANCE = 1e-4  # relative to max(1, max|logit|), as the export's self-check


def _folded_checkpoint(tmp_path, tiny_config, architecture, **overrides):
    torch.manual_seed(0)
    save_source(tmp_path / "train", tiny_config, architecture, **overrides)
    export_checkpoint(tmp_path / "train", tmp_path / "folded")
    return tmp_path / "train", tmp_path / "folded"


def _assert_onnxruntime_matches_training_form(training_dir, onnx_path):
    import onnx
    import onnxruntime

    graph = onnx.load(str(onnx_path)).graph
    for value in graph.input:  # batch and sequence are symbolic, not the traced 2 x 16
        assert [bool(d.dim_param) for d in value.type.tensor_type.shape.dim] == [True, True], value
    reference = AnGPTForCausalLM.from_pretrained(training_dir, dtype=torch.float32).eval()
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for batch, length, padding in ((1, 5, 0), (4, 33, 6)):
        input_ids = probe_batch(reference.config.vocab_size, batch, length, seed=length)
        mask = torch.ones_like(input_ids)
        mask[-1, :padding] = 0
        with torch.no_grad():
            expected = reference(input_ids=input_ids, attention_mask=mask).logits
        (actual,) = session.run(["logits"], {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
        real = mask.bool()
        error = (torch.from_numpy(actual) - expected)[real].abs().max()
        assert error <= TOLERANCE * max(1.0, float(expected.abs().max())), (batch, length, float(error))
        # the padded row's real positions equal the same tokens alone: positions follow the mask, not the index
        if padding:
            alone = reference(input_ids=input_ids[-1:, padding:]).logits
            assert torch.allclose(torch.from_numpy(actual[-1:, padding:]), alone, atol=TOLERANCE)


def test_angpt_onnx_command_matches_the_training_form(tmp_path, tiny_config, capsys, monkeypatch):
    from modeling_angpt.cli import main

    # one layer (still two sublayers, whose constants fold across each other): the export's time is the tracing's
    training_dir, folded_dir = _folded_checkpoint(tmp_path, tiny_config, "angpt", num_hidden_layers=1)
    assert main(["onnx", str(folded_dir), str(tmp_path / "model.onnx")]) == 0
    assert "self-check passed" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folded", "model.onnx", "train"]  # no partial left
    _assert_onnxruntime_matches_training_form(training_dir, tmp_path / "model.onnx")
    # docs/inference-fold.md's example, as written, beside the file (a `py` block: the guides' `python` blocks run
    # in tests/commands/test_readme.py, where there is no model.onnx to open)
    text = (REPO / "docs" / "inference-fold.md").read_text().split("## ONNX", 1)[1]
    example = text.split("```py\n", 1)[1].split("```", 1)[0]
    namespace = {}
    monkeypatch.chdir(tmp_path)
    exec(example, namespace)
    assert namespace["logits"].shape == (1, 4, 101)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["gptplus", "ngpt"])
def test_onnx_export_matches_the_training_form(tmp_path, tiny_config, architecture):
    from modeling_angpt.export.onnx import export_onnx

    training_dir, folded_dir = _folded_checkpoint(tmp_path, tiny_config, architecture)
    report = export_onnx(folded_dir, tmp_path / "model.onnx")
    assert report["max_abs_logit_error"] <= report["allowed_error"]
    _assert_onnxruntime_matches_training_form(training_dir, tmp_path / "model.onnx")


def _greedy_onnxruntime(session, config, input_ids, attention_mask, new_tokens: int):
    """Greedy decoding as a user writes it: a first call with an empty past, then one token per call."""
    import numpy

    layers, batch = config.num_hidden_layers, input_ids.shape[0]
    empty = numpy.zeros((batch, config.num_key_value_heads, 0, config.head_dim), dtype=numpy.float32)
    past = {f"past_key_values.{i}.{kind}": empty for i in range(layers) for kind in ("key", "value")}
    present_names = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    tokens, mask, steps = input_ids.numpy(), attention_mask.numpy(), []
    for _ in range(new_tokens):
        logits, *presents = session.run(["logits", *present_names],
                                        {"input_ids": tokens, "attention_mask": mask, **past})
        past = {name.replace("present", "past_key_values"): value for name, value in zip(present_names, presents)}
        steps.append(torch.from_numpy(logits[:, -1]))
        tokens = logits[:, -1:].argmax(-1)
        mask = numpy.concatenate([mask, numpy.ones_like(tokens)], axis=1)
    return torch.stack([s.argmax(-1) for s in steps], dim=1), steps


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["gptplus", "ngpt", "angpt"])
def test_onnx_with_cache_decodes_as_generate_on_the_training_form(tmp_path, tiny_config, architecture):
    import onnxruntime

    from modeling_angpt.export.onnx import export_onnx

    training_dir, folded_dir = _folded_checkpoint(tmp_path, tiny_config, architecture)
    export_onnx(folded_dir, tmp_path / "model.onnx", with_cache=True)
    reference = AnGPTForCausalLM.from_pretrained(training_dir, dtype=torch.float32).eval()
    input_ids = probe_batch(reference.config.vocab_size, 2, 9, seed=5)
    mask = torch.ones_like(input_ids)
    mask[0, :3] = 0  # left padding
    expected = reference.generate(input_ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                  output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    tokens, logits = _greedy_onnxruntime(session, reference.config, input_ids, mask, 6)
    assert torch.equal(tokens, expected.sequences[:, 9:])
    for step, (actual, oracle) in enumerate(zip(logits, expected.logits)):
        assert torch.allclose(actual, oracle, atol=TOLERANCE * max(1.0, float(oracle.abs().max()))), step


@pytest.mark.parametrize("target, expected", [
    ("train", ["is in training form", "angpt export"]),
    ("missing", ["CHECKPOINT", "no such checkpoint directory"]),
    ("folded-to-dir", ["PATH", "is a directory"]),
    ("folded-over-a-file", ["PATH", "exists (pass --overwrite to replace it)"]),
])
def test_onnx_command_refuses_in_one_line_before_loading(tmp_path, tiny_config, target, expected):
    training_dir, folded_dir = _folded_checkpoint(tmp_path, tiny_config, "angpt")
    checkpoint = training_dir if target == "train" else tmp_path / "missing" if target == "missing" else folded_dir
    out = tmp_path if target == "folded-to-dir" else tmp_path / "model.onnx"
    if target == "folded-over-a-file":
        out.write_text("an earlier file")
    before = snapshot(tmp_path)
    assert_one_line_error(angpt("onnx", checkpoint, out), *expected)
    assert snapshot(tmp_path) == before
