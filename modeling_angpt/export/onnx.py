"""ONNX: the folded inference form (docs/inference-fold.md) as one ONNX graph for onnxruntime, callable from Python
as `export_onnx(checkpoint_dir, path)`; `angpt onnx CHECKPOINT PATH` (modeling_angpt/commands/onnx.py) is a thin
layer over it.

The graph takes `input_ids` and `attention_mask` (batch × sequence, both dimensions dynamic) and returns `logits`
(batch × sequence × vocab), in float32; with `with_cache=True` it also takes and returns the KV cache, one graph for
the prompt and each decoding step (docs/inference-fold.md, "ONNX"). It is made by torch's own exporter
(`torch.onnx.export(..., dynamo=True)`: torch.export, then onnxscript's translation), which traces the model's
forward as it runs in PyTorch: nothing about these architectures is written by hand here.

Like `angpt export`, the export checks its own result: onnxruntime runs the written file on probe batches of
other shapes than the traced one (one left-padded) and its logits are compared with PyTorch's before the file is
moved to PATH. On any failure nothing is written at PATH.
"""
from __future__ import annotations

import json
import os
import shutil

from .fold import unwritable_parent

# |Δlogit| ≤ tolerance · max(1, max|logit|), onnxruntime against PyTorch in float32 (the measured differences,
# far smaller: docs/tools.md, row "ONNX Runtime").
DEFAULT_TOLERANCE = 1e-4
INPUT_NAMES = ("input_ids", "attention_mask")
# (torch, transformers and onnx are imported inside the functions: the path checks run before anything heavy)


class OnnxExportError(RuntimeError):
    """The ONNX export refused or its self-check failed; nothing was written at PATH."""


def check_onnx_paths(checkpoint_dir, path, overwrite: bool = False, tolerance: float | None = None):
    """Refuse, before anything is loaded, what the ONNX export cannot do; returns absolute paths.
    Only the folded form is exported: a training-form checkpoint is refused with the command that folds it."""
    checkpoint_dir, path = os.path.abspath(checkpoint_dir), os.path.abspath(path)
    config_path = os.path.join(checkpoint_dir, "config.json")
    if not os.path.isdir(checkpoint_dir):
        raise OnnxExportError(f"CHECKPOINT {checkpoint_dir}: no such checkpoint directory")
    if not os.path.isfile(config_path):
        raise OnnxExportError(f"CHECKPOINT {checkpoint_dir}: not a checkpoint directory (no config.json)")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise OnnxExportError(f"CHECKPOINT {config_path}: cannot be read as JSON ({error})") from None
    if not config.get("folded", False):
        raise OnnxExportError(f"CHECKPOINT {checkpoint_dir} is in training form (config.folded is not true): fold "
                              f"it first with `angpt export {checkpoint_dir} FOLDED_DIR`, then export FOLDED_DIR")
    if "AnGPTForSequenceClassification" in (config.get("architectures") or []):
        raise OnnxExportError(f"CHECKPOINT {checkpoint_dir}: a sequence classifier; the ONNX export covers "
                              "AnGPTForCausalLM checkpoints")
    if tolerance is not None and not tolerance > 0:
        raise OnnxExportError(f"--tolerance {tolerance:g}: expected a number > 0")
    if os.path.isdir(path):
        raise OnnxExportError(f"PATH {path} is a directory; expected the path of the .onnx file to write")
    if os.path.exists(path) and not overwrite:
        raise OnnxExportError(f"PATH {path} exists (pass --overwrite to replace it)")
    parent = unwritable_parent(path)
    if parent is not None:
        raise OnnxExportError(f"PATH {path}: cannot write under {parent} (permission denied)")
    return checkpoint_dir, path


def _module_of_tensors(model, with_cache: bool):
    """The model as a module of tensors only: (input_ids, attention_mask) -> logits, or with the KV cache
    (input_ids, attention_mask over past and new tokens, ((key, value) per layer)) -> (logits, ((key, value) per
    layer)). The cache is transformers' own DynamicCache, filled from the inputs: the graph then holds exactly the
    concatenation that decoding in PyTorch does."""
    import torch
    from transformers import DynamicCache

    class TensorsOnly(torch.nn.Module):
        def __init__(self, causal_lm):
            super().__init__()
            self.causal_lm = causal_lm

        def forward(self, input_ids, attention_mask, past=None):
            if not with_cache:
                return self.causal_lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
            cache = DynamicCache(config=self.causal_lm.config)
            for index, (key, value) in enumerate(past):
                cache.update(key, value, index)
            logits = self.causal_lm(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                                    use_cache=True).logits
            return logits, tuple((layer.keys, layer.values) for layer in cache.layers)

    return TensorsOnly(model).eval()


def cache_names(num_layers: int, prefix: str) -> list[str]:
    """optimum's names: past_key_values.0.key, past_key_values.0.value, ... (inputs), present.0.key, ... (outputs)."""
    return [f"{prefix}.{index}.{kind}" for index in range(num_layers) for kind in ("key", "value")]


def empty_cache(config, batch: int):
    """The past of a first call: (key, value) per layer with 0 positions (batch × kv heads × 0 × head dim)."""
    import torch

    shape = (batch, config.num_key_value_heads, 0, config.head_dim)
    return tuple((torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_hidden_layers))


def to_onnx_program(model, with_cache: bool = False, opset_version: int | None = None):
    """torch's dynamo exporter on the folded model, batch and lengths dynamic (traced at 2 × 16, after a past of
    5 with the cache: a dimension traced at size 0 or 1 would be fixed)."""
    import torch

    from .fold import probe_batch

    config, layers = model.config, model.config.num_hidden_layers
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    input_ids = probe_batch(config.vocab_size, batch=2, length=16)
    args, names, outputs = (input_ids, torch.ones_like(input_ids)), list(INPUT_NAMES), ["logits"]
    dynamic = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    if with_cache:
        from transformers import DynamicCache

        cache = DynamicCache(config=config)
        with torch.no_grad():
            model(input_ids=probe_batch(config.vocab_size, batch=2, length=5, seed=3), cache=cache, use_cache=True)
        past = tuple((layer.keys, layer.values) for layer in cache.layers)
        past_length = torch.export.Dim("past_sequence")
        args = (input_ids, torch.ones(2, 5 + 16, dtype=torch.long), past)
        dynamic = {"input_ids": {0: batch, 1: sequence},
                   "attention_mask": {0: batch, 1: torch.export.Dim("past_sequence_plus_sequence")},
                   "past": tuple(({0: batch, 2: past_length}, {0: batch, 2: past_length}) for _ in range(layers))}
        names += cache_names(layers, "past_key_values")
        outputs += cache_names(layers, "present")
    with torch.no_grad():
        return torch.onnx.export(_module_of_tensors(model, with_cache), args, dynamo=True, input_names=names,
                                 output_names=outputs, dynamic_shapes=dynamic, opset_version=opset_version,
                                 verbose=False)


def check_batches(vocab_size: int) -> list[tuple]:
    """(input_ids, attention_mask) pairs of shapes other than the traced one; the first one left-padded."""
    import torch

    from .fold import probe_batch

    padded = probe_batch(vocab_size, batch=3, length=21, seed=1)
    mask = torch.ones_like(padded)
    mask[0, :5] = 0  # left padding, as batched generation pads (modeling_angpt/inference/padding.py)
    single = probe_batch(vocab_size, batch=1, length=7, seed=2)
    return [(padded, mask), (single, torch.ones_like(single))]


def run_onnxruntime(session, config, input_ids, attention_mask, with_cache: bool, new_tokens: int = 3):
    """The logits of every position from onnxruntime; with the cache, as a first call on all but the last
    `new_tokens` tokens (an empty past) and a second call on those given the first call's presents."""
    import numpy
    import torch

    if not with_cache:
        feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        return torch.from_numpy(session.run(["logits"], feeds)[0])
    layers, split = config.num_hidden_layers, input_ids.shape[1] - new_tokens
    past = [t.numpy() for pair in empty_cache(config, input_ids.shape[0]) for t in pair]
    logits = []
    for start, end in ((0, split), (split, input_ids.shape[1])):
        feeds = {"input_ids": input_ids[:, start:end].numpy(), "attention_mask": attention_mask[:, :end].numpy(),
                 **dict(zip(cache_names(layers, "past_key_values"), past))}
        step_logits, *past = session.run(["logits", *cache_names(layers, "present")], feeds)
        logits.append(step_logits)
    return torch.from_numpy(numpy.concatenate(logits, axis=1))


def compare_with_onnxruntime(model, onnx_path, batches, with_cache: bool = False) -> tuple[float, float]:
    """(max|Δlogit|, max(1, max|logit|)) between PyTorch (without a cache) and onnxruntime over `batches`, at real
    positions only."""
    import onnxruntime
    import torch

    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    error, scale = 0.0, 1.0
    for input_ids, attention_mask in batches:
        with torch.no_grad():
            expected = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits.double()
        actual = run_onnxruntime(session, model.config, input_ids, attention_mask, with_cache).double()
        real = attention_mask.bool()  # a padded position's logits are never read
        error = max(error, float((actual - expected)[real].abs().max()))
        scale = max(scale, float(expected[real].abs().max()))
    return error, scale


def export_onnx(checkpoint_dir, path, with_cache: bool = False, tolerance: float | None = None,
                overwrite: bool = False, opset_version: int | None = None) -> dict:
    """Write the folded checkpoint `checkpoint_dir` as an ONNX graph at `path` (float32), verified in onnxruntime;
    returns a report dict. `with_cache`: the graph also takes and returns the KV cache (`past_key_values.N.key`
    ... in, `present.N.key` ... out). Above 2 GB of weights, torch's exporter puts them in `path`.data."""
    import torch

    from ..inference.checkpoint_check import check_checkpoint

    checkpoint_dir, path = check_onnx_paths(checkpoint_dir, path, overwrite, tolerance)
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    config, model_class = check_checkpoint(checkpoint_dir)
    model = model_class.from_pretrained(checkpoint_dir, dtype=torch.float32).eval()
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        os.makedirs(partial)
        written = os.path.join(partial, os.path.basename(path))
        to_onnx_program(model, with_cache, opset_version).save(written)
        error, scale = compare_with_onnxruntime(model, written, check_batches(config.vocab_size), with_cache)
        if not error <= tolerance * scale:
            raise OnnxExportError(f"self-check failed: onnxruntime's logits differ from PyTorch's by {error:.3g}, more "
                                  f"than the tolerance {tolerance:g} × {scale:.3g}; nothing written at {path}")
        for name in sorted(os.listdir(partial)):  # the graph, and its external weights file when there is one
            os.replace(os.path.join(partial, name), os.path.join(os.path.dirname(path), name))
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return {"checkpoint": checkpoint_dir, "path": path, "architecture": config.architecture, "with_cache": with_cache,
            "max_abs_logit_error": error, "logit_scale": scale, "tolerance": tolerance,
            "allowed_error": tolerance * scale}
