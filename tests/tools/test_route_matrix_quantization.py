"""The route matrix, quantization (docs/tools.md, "Routes and forms tested"): torchao and bitsandbytes, each through
transformers' config route (`from_pretrained(..., quantization_config=...)`) and through the tool's own API
(torchao's `quantize_`; bitsandbytes' own layers put in place of every nn.Linear but the head, as its documentation
does), on the three architectures in both forms and a transformers Qwen3 beside them.

Each cell asserts the effect: every projection replaced by the tool's quantized form, the folded c_q (not an
nn.Linear: docs/architectures.md, "Tensor and pipeline parallelism") left a float32 parameter equal to the float
model's, next-token agreement with the float model above the mode's threshold (those of test_quantization.py), and the
logits moved (it did quantize). The figure recorded: agreement / max |Δlogit|."""
from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from route_matrix_fixtures import (PROJECTIONS, ROW_IDS, ROWS, agreement_figure, compare, record,  # noqa: F401
                                   route_checkpoints)

pytestmark = pytest.mark.tools  # make test-tools

THRESHOLDS = {"int8 weight-only": 0.95, "int8 dynamic": 0.95, "int4 weight-only": 0.90, "8-bit": 0.95, "4-bit": 0.90}


def torchao_config(mode: str):
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                      IntxWeightOnlyConfig, PerGroup)

    # torchao's Int4WeightOnlyConfig packs for CUDA kernels only; the intx int4 layout runs on a CPU (test_quantization)
    return {"int8 weight-only": Int8WeightOnlyConfig, "int8 dynamic": Int8DynamicActivationInt8WeightConfig,
            "int4 weight-only": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
            }[mode]()


def quantized_with_torchao(path, route: str, mode: str):
    if route == "TorchAoConfig":
        from transformers import TorchAoConfig

        return AutoModelForCausalLM.from_pretrained(path, quantization_config=TorchAoConfig(torchao_config(mode)),
                                                    device_map="cpu").eval()
    from torchao.quantization import quantize_

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    quantize_(model, torchao_config(mode))
    return model


def bnb_layer(linear: nn.Linear, mode: str) -> nn.Module:
    """bitsandbytes' own layer holding `linear`'s weight (quantized when moved to the device)."""
    import bitsandbytes as bnb

    weight = linear.weight.detach().clone()
    if mode == "8-bit":
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=False, has_fp16_weights=False,
                                    threshold=6.0)
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
        return layer
    layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=False, compute_dtype=torch.float32,
                              quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
    return layer


def quantized_with_bitsandbytes(path, route: str, mode: str):
    if route == "BitsAndBytesConfig":
        from transformers import BitsAndBytesConfig

        config = (BitsAndBytesConfig(load_in_8bit=True) if mode == "8-bit" else
                  BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                     bnb_4bit_compute_dtype=torch.float32))
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=config, device_map="cpu").eval()
    else:  # every nn.Linear but the head, as a walker of bitsandbytes' users does
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        for name, module in list(model.named_modules()):
            if isinstance(module, nn.Linear) and module is not model.get_output_embeddings():
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, bnb_layer(module, mode))
        model = model.to("cpu")  # bitsandbytes quantizes its parameters on the move to a device
    for module in model.modules():  # the generic 4-bit path on every CPU (test_bnb_4bit_paths.py tests the other)
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model


QUANTIZED = {"torchao": lambda layer: type(layer.weight).__name__ not in ("Parameter", "Tensor"),
             "bitsandbytes": lambda layer: type(layer).__name__ in ("Linear8bitLt", "Linear4bit")}


def check_cell(tool, route, mode, row, route_checkpoints, record, quantize):
    path, batch = route_checkpoints(row)
    reference = AutoModelForCausalLM.from_pretrained(path).eval()
    quantized = quantize(path, route, mode)
    for projection in PROJECTIONS:
        block = "self_attn" if projection in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        layer = quantized.get_submodule(f"model.layers.0.{block}.{projection}")
        assert QUANTIZED[tool](layer), (projection, type(layer).__name__, type(layer.weight).__name__)
    for name, parameter in reference.named_parameters():
        if "query_gain" in name:  # c_q: left alone, float32, the float model's
            kept = quantized.get_parameter(name)
            assert type(kept) is nn.Parameter and kept.dtype == torch.float32 and torch.equal(kept, parameter)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # on the CPU it notes each float32 -> float16 cast
    agreement, delta = compare(reference, quantized, batch)
    record(tool, route, mode, row, agreement_figure(agreement, delta))
    assert agreement >= THRESHOLDS[mode] and delta > 0, (agreement, delta)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
@pytest.mark.parametrize("mode", ["int8 weight-only", "int8 dynamic", "int4 weight-only"])
@pytest.mark.parametrize("route", ["TorchAoConfig", "quantize_"])
def test_torchao(route, mode, row, route_checkpoints, record):
    check_cell("torchao", route, mode, row, route_checkpoints, record, quantized_with_torchao)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
@pytest.mark.parametrize("mode", ["8-bit", "4-bit"])
@pytest.mark.parametrize("route", ["BitsAndBytesConfig", "bitsandbytes layers"])
def test_bitsandbytes(route, mode, row, route_checkpoints, record):
    check_cell("bitsandbytes", route, mode, row, route_checkpoints, record, quantized_with_bitsandbytes)


def test_the_figures_file_is_a_table(tmp_path, monkeypatch):
    """The matrix file prints as one markdown row per tool, route and mode, a column per row of the matrix."""
    from route_matrix_fixtures import table

    lines = ['{"tool": "t", "route": "r", "mode": "m", "row": "angpt-folded", "figure": "99.0 % / 0.1"}',
             '{"tool": "t", "route": "r", "mode": "m", "row": "qwen3-control", "figure": "98.0 % / 0.2"}']
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    printed = table(tmp_path / "m.jsonl").splitlines()
    assert printed[0].split(" | ")[-1] == "qwen3-control |" and len(printed) == 3
    assert [cell.strip() for cell in printed[2].strip("|").split("|")] == ["t", "r", "m", "", "", "", "", "",
                                                                          "99.0 % / 0.1", "98.0 % / 0.2"]
