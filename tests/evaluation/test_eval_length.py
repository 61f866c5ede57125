"""Length generalisation (docs/evaluation.md): losses against an independent computation, 16× the
training length within the chunked path's memory bound for a scale-invariant and a RoPE model, the suite on a trained
checkpoint's held-out text, and one-line errors for lengths the checkpoint cannot take."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from evallong_fixtures import tiny_checkpoint  # noqa: F401 (fixture)
from training_fixtures import data_cache, single_thread  # noqa: F401 (fixtures)

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.evaluation import EvalOptions, length
from modeling_angpt.evaluation.length import length_generalisation, per_token_losses, write_artifacts

VARIANTS = {  # same shape, two position schemes (docs/attention.md)
    "scale_invariant": dict(rope_parameters={"rope_type": "scale_invariant_p"},
                            attention_logit_transform="scale_invariant"),
    "rope": dict(rope_parameters={"rope_type": "default"}),
}


def options(**values):
    return EvalOptions(**{**dict(seed=0, device="cpu"), **values})


def test_losses_equal_eager_cross_entropy(tiny_config, monkeypatch):
    # The reference: the plain forward on the eager backend and F.cross_entropy on the full logits.
    model = AnGPTForCausalLM(tiny_config("angpt", **VARIANTS["scale_invariant"], attn_implementation="eager")).eval()
    stream = torch.randint(0, 101, (2 * 4 * 8,))
    with torch.no_grad():
        windows = {m: stream.view(-1, m * 8) for m in (1, 2, 4)}
        expected = {m: F.cross_entropy(model(w).logits[:, :-1].transpose(1, 2), w[:, 1:], reduction="none").mean(0)
                    for m, w in windows.items()}
    monkeypatch.setattr(length, "LOGIT_BUDGET", 3 * 101)  # logits three positions at a time
    torch.testing.assert_close(per_token_losses(model, windows[4]), F.cross_entropy(
        model(windows[4]).logits[:, :-1].transpose(1, 2), windows[4][:, 1:], reduction="none"), rtol=0, atol=1e-5)
    report = length_generalisation(model, stream, 8, [4, 1, 2], query_chunk_size=3)
    assert model.config._attn_implementation == "eager"  # the suite's settings do not leak
    for m in (1, 2, 4):
        np.testing.assert_allclose(report.position_loss[m], expected[m].numpy(), rtol=0, atol=1e-5)
        assert report.loss(m) == pytest.approx(float(expected[m].mean()), abs=1e-6)
        buckets = [expected[m][max(0, 8 * b - 1): 8 * (b + 1) - 1].mean().item() for b in range(m)]
        assert report.bucket_losses(m) == pytest.approx(buckets, abs=1e-6)
    assert report.windows == {1: 8, 2: 4, 4: 2}  # every multiple on the same 64 tokens
    # Each token's loss against its own loss in the 1x window that holds it, counted token by token from the
    # stream: token s (s % 8 != 0) is entry s % 8 - 1 of 1x window s // 8.
    with torch.no_grad():
        single = {s: F.cross_entropy(model(windows[1]).logits[:, :-1].transpose(1, 2), windows[1][:, 1:],
                                     reduction="none")[s // 8, s % 8 - 1].item() for s in range(64) if s % 8}
        for m in (2, 4):
            full = F.cross_entropy(model(windows[m]).logits[:, :-1].transpose(1, 2), windows[m][:, 1:],
                                   reduction="none")
            for t in range(1, 8 * m):  # target position in the window
                diffs = [full[w, t - 1].item() - single[w * 8 * m + t] for w in range(len(full))] if t % 8 else []
                got = report.position_excess[m][t - 1]
                if t < 8 or not diffs:  # bucket 0 (the 1x window's own context) and window starts: nothing to compare
                    assert np.isnan(got)
                else:
                    assert got == pytest.approx(np.mean(diffs), abs=1e-5)
    assert 1 not in report.position_excess


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sixteen_times_training_length_stays_within_the_chunked_memory_bound(variant, tiny_config, tmp_path,
                                                                             monkeypatch):
    from modeling_angpt import attention_angpt

    heads, train_length, chunk = 4, 32, 16
    tokens = 16 * train_length
    model = AnGPTForCausalLM(tiny_config("angpt", **VARIANTS[variant])).eval()
    scores, logits = [], []  # the shapes of every attention score block and every logits slice formed

    def attend(*args, **kwargs):
        output, probs = real_attend(*args, **kwargs)
        scores.append(tuple(probs.shape))
        return output, probs

    def output_logits(hidden):
        logits.append(tuple(hidden.shape[:2]))
        return real_logits(hidden)

    real_attend, real_logits = attention_angpt._attend, model.output_logits
    monkeypatch.setattr(attention_angpt, "_attend", attend)
    monkeypatch.setattr(model, "output_logits", output_logits)
    monkeypatch.setattr(length, "LOGIT_BUDGET", 64 * 101)
    report = length_generalisation(model, torch.randint(0, 101, (tokens,)), train_length, query_chunk_size=chunk)
    # Per layer and chunk at most [1, h, 16, T] scores: 1/32 of the dense [h, T, T] at 16x; logits 64 rows at a time.
    assert (1, heads, chunk, tokens) in scores and max(rows for _, _, rows, _ in scores) == chunk
    assert max(h * rows * keys for _, h, rows, keys in scores) * 32 == heads * tokens * tokens
    assert max(rows for _, rows in logits) == 64 and sum(rows for _, rows in logits) == 5 * tokens - 31

    paths = write_artifacts(report, tmp_path, title=variant)
    metrics = report.metrics()
    assert list(metrics) == [f"length_x{m}" for m in (1, 2, 4, 8, 16)]
    assert all(np.isfinite(v) for row in metrics.values() for v in row.values())
    assert len([k for k in metrics["length_x16"] if k.startswith("loss_")]) == 16
    table = paths["markdown"].read_text()
    assert "| 16× | 512 | 1 |" in table and "15-16×" in table
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths["png"].stat().st_size > 10_000
    saved = json.loads(paths["json"].read_text())
    assert len(saved["position_loss"]["x16"]) == tokens - 1
    assert len(saved["position_excess"]["x16"]) == tokens - 1 and saved["position_excess"]["x16"][0] is None
    excess = saved["position_excess"]["x16"]
    assert np.isfinite(excess[train_length]) and excess[train_length - 1] is None  # position L opens a 1x window
    assert saved["metrics"]["length_x16"] == pytest.approx(metrics["length_x16"])


def test_suite_on_a_trained_checkpoint_uses_its_held_out_split(tiny_checkpoint, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tiny_checkpoint(32)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    results = length.run_suite(model, AutoTokenizer.from_pretrained(directory), directory,
                               options(limit=2, batch_size=2), tmp_path / "out")
    assert list(results) == ["length_x1", "length_x2", "length_x4", "length_x8", "length_x16"]
    assert results["length_x16"]["windows"] == 2 and results["length_x1"]["windows"] == 32
    assert results["length_x16"]["tokens"] == 512
    saved = json.loads((tmp_path / "out" / "length.json").read_text())
    assert saved["train_length"] == 32 and saved["source"].startswith("validation split of shakespeare")
    assert (tmp_path / "out" / "length.png").is_file() and (tmp_path / "out" / "length.md").is_file()


def test_corpus_file_gives_windows_of_one_running_text(tiny_checkpoint, tmp_path):  # noqa: F811
    """--corpus FILE: the 4L window is the file's first 4L tokens in order (checked against the plain forward on
    them), not four unrelated validation blocks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tiny_checkpoint(32)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    text = tmp_path / "held_out.txt"
    text.write_text("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 12)
    results = length.run_suite(model, tokenizer, directory, options(lengths=[1, 4], limit=1, corpus=str(text)),
                               tmp_path / "out")
    ids = torch.tensor([tokenizer(text.read_text())["input_ids"][:4 * 32]])
    with torch.no_grad():
        expected = F.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:]).item()
    assert results["length_x4"]["loss"] == pytest.approx(expected, abs=1e-4)
    assert json.loads((tmp_path / "out" / "length.json").read_text())["source"].startswith(str(text))


@pytest.mark.parametrize("lengths,message", [
    ([2 ** 20], r"--lengths 1048576: 1048576 × 32 = 33554432 tokens exceeds the 16777216 positions that "
                r"rope_type='default' represents exactly in float32"),
    ("1,x", r"--lengths x: expected positive integer multiples"),
    ([0], r"--lengths 0: expected positive integer multiples"),
    ([4000], r"held-out text .* has \d+ tokens, fewer than the 128000 of one window at 4000 × 32"),
])
def test_bad_lengths_fail_with_one_line(lengths, message, tiny_checkpoint, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    directory = tiny_checkpoint(32)
    if lengths != [4000]:  # what needs no held-out text is refused before the weights load
        with pytest.raises(ValueError, match=message):
            length.preflight(directory, options(lengths=lengths))
    model = AutoModelForCausalLM.from_pretrained(directory)
    with pytest.raises(ValueError, match=message) as info:
        length.run_suite(model, None, directory, options(lengths=lengths), tmp_path)
    assert "\n" not in str(info.value)


def test_other_model_types_are_refused():
    from transformers import LlamaConfig

    from modeling_angpt.evaluation.long_context import check_lengths

    with pytest.raises(ValueError, match=r"DIR: the length and needle suites evaluate anGPT-family checkpoints "
                                         r"\(model_type 'angpt'\); this one has model_type 'llama'"):
        check_lengths(LlamaConfig(), 128, [1, 4], "DIR")


def test_a_checkpoint_without_its_training_length_needs_it_given(tiny_config, tmp_path):
    model = AnGPTForCausalLM(tiny_config())
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"no training_metadata.json .* pass it explicitly \(train_length=N\)"):
        length.run_suite(model, None, tmp_path, options(), tmp_path / "out")
