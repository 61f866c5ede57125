"""The route matrix, runtimes (docs/tools.md, "Routes and forms tested"): ONNX Runtime through the project's export
(`angpt onnx`, `export_onnx`: the folded form, its own self-check; the training form refused in one line) and
through torch's own exporter (`torch.onnx.export(..., dynamo=True)` on the model as loaded, either form), and
transformers' continuous batching through `generate_batch` and through its manager (`init_continuous_batching`,
requests added and read back one by one); the three architectures in both forms, a transformers Qwen3 beside them.

Each cell asserts the effect: onnxruntime's logits against PyTorch's (max |Δlogit| within 1e-4 of the largest
logit), continuous batching's greedy tokens equal to `generate` on each prompt alone. One ONNX export takes 10-60 s
on a busy 2-core CPU: the exports of torch's exporter beyond one per form are marked slow."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, ContinuousBatchingConfig, GenerationConfig

from modeling_angpt.export.onnx import check_batches, compare_with_onnxruntime, export_onnx, to_onnx_program

from route_matrix_fixtures import ARCHITECTURE_ROWS, QWEN3, ROW_IDS, ROWS, record, refusal_figure  # noqa: F401
from route_matrix_fixtures import route_checkpoints  # noqa: F401

pytestmark = pytest.mark.tools  # make test-tools

TOLERANCE = 1e-4  # × max(1, max|logit|), as the export's self-check
FAST_ONNX = {("angpt", "training"), ("angpt", "folded")}  # every route once per form; the rest is slow


def onnx_rows(fast):
    return [pytest.param(row, id=row_id, marks=() if row in fast else pytest.mark.slow)
            for row, row_id in zip(ROWS, ROW_IDS)]


@pytest.mark.parametrize("row", onnx_rows(FAST_ONNX | {("gptplus", "training"), ("ngpt", "training")}))
def test_onnx_through_angpt_onnx(row, route_checkpoints, record, tmp_path):
    """The folded form exports and passes its self-check; a training form or a Qwen3 is refused in one line,
    before anything is traced."""
    path, _ = route_checkpoints(row)
    if row[1] != "folded":
        with pytest.raises(Exception, match="angpt export|folded|architecture") as refusal:
            export_onnx(path, tmp_path / "model.onnx")
        figure = refusal_figure(refusal.value).replace(str(path), "DIR")
        record("ONNX Runtime", "angpt onnx", "logits", row, figure[:100] + ("…" if len(figure) > 100 else ""))
        assert not (tmp_path / "model.onnx").exists()
        return
    report = export_onnx(path, tmp_path / "model.onnx")
    record("ONNX Runtime", "angpt onnx", "logits", row, f"Δ {report['max_abs_logit_error']:.2g}")
    assert report["max_abs_logit_error"] <= report["allowed_error"]


@pytest.mark.parametrize("row", onnx_rows(FAST_ONNX))
def test_onnx_through_torch_onnx_export(row, route_checkpoints, record, tmp_path):
    path, _ = route_checkpoints(row)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    to_onnx_program(model).save(str(tmp_path / "model.onnx"))
    error, scale = compare_with_onnxruntime(model, tmp_path / "model.onnx", check_batches(model.config.vocab_size))
    record("ONNX Runtime", "torch.onnx.export", "logits", row, f"Δ {error:.2g}")
    assert error <= TOLERANCE * scale, (error, scale)


PROMPTS = [[84, 104, 101, 32], [119, 104], [97, 116, 32, 110, 111, 111, 110, 44, 32, 97, 110, 100, 32]]
GREEDY = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
SMALL_BATCHES = dict(page_size=16, num_blocks=16, max_batch_tokens=8)  # CPU: the defaults size a cache from RAM


def through_manager(model) -> list[list[int]]:
    """transformers' continuous-batching manager: each request added, each result read back by its id."""
    manager = model.init_continuous_batching(generation_config=GREEDY,
                                             continuous_batching_config=ContinuousBatchingConfig(**SMALL_BATCHES))
    manager.start()
    try:
        ids = [manager.add_request(prompt, max_new_tokens=6) for prompt in PROMPTS]
        results = {}
        while len(results) < len(ids):
            result = manager.get_result(timeout=60)
            assert result is not None, "the manager gave no result within 60 s"
            if result.is_finished():
                results[result.request_id] = result.generated_tokens
    finally:
        manager.stop(block=True)
    return [results[request] for request in ids]


def through_generate_batch(model) -> list[list[int]]:
    outputs = model.generate_batch(PROMPTS, generation_config=GREEDY,
                                   continuous_batching_config=ContinuousBatchingConfig(**SMALL_BATCHES))
    ordered = sorted(outputs.values(), key=lambda output: int(output.request_id.split("_")[-1]))
    assert [output.error for output in ordered] == [None] * len(PROMPTS)
    return [output.generated_tokens for output in ordered]


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
@pytest.mark.parametrize("route", ["generate_batch", "init_continuous_batching"])
def test_continuous_batching(route, row, route_checkpoints, record):
    path, _ = route_checkpoints(row)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = [model.generate(torch.tensor([prompt]), generation_config=GREEDY)[0, len(prompt):].tolist()
                for prompt in PROMPTS]
    generated = (through_generate_batch if route == "generate_batch" else through_manager)(model)
    same = sum(a == b for got, want in zip(generated, expected) for a, b in zip(got, want))
    total = sum(map(len, expected))
    record("continuous batching", route, "greedy tokens = generate", row, f"{same}/{total}")
    assert generated == expected
