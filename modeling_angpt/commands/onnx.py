"""`angpt onnx CHECKPOINT PATH [--with-cache] [--tolerance ...] [--overwrite]`: a thin layer over
`modeling_angpt.export.onnx.export_onnx` (the folded form as an ONNX graph, docs/inference-fold.md, "ONNX")."""
from __future__ import annotations

import argparse
import sys

from . import CommandError, float_at_least
from ..export.onnx import DEFAULT_TOLERANCE, OnnxExportError, check_onnx_paths

DESCRIPTION = """Export a folded checkpoint (written by `angpt export`) as an ONNX graph for onnxruntime: inputs
input_ids and attention_mask, output logits, batch and sequence length dynamic, float32 (with --with-cache, the KV
cache in and out too). The export runs the written graph in onnxruntime, compares its logits with PyTorch's, and
only then moves it to PATH."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("checkpoint", help="folded checkpoint directory (e.g. runs/demo/folded, from `angpt export`)")
    parser.add_argument("path", help="the .onnx file to write (absent, or an earlier export with --overwrite)")
    parser.add_argument("--with-cache", action="store_true",
                        help="the graph also takes the KV cache (inputs past_key_values.N.key/value, empty on the "
                             "first call) and returns it (outputs present.N.key/value), for decoding token by token")
    parser.add_argument("--tolerance", type=float_at_least(0.0, strict=True), default=None,
                        help="relative logit tolerance of the self-check: |Δlogit| <= tolerance x max(1, max|logit|) "
                             f"(default {DEFAULT_TOLERANCE:g})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file at PATH")


def validate(args: argparse.Namespace) -> None:
    """Before anything heavy is imported: the paths, and that the checkpoint is folded."""
    try:
        check_onnx_paths(args.checkpoint, args.path, args.overwrite, args.tolerance)
    except OnnxExportError as error:
        raise CommandError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    from ..inference.checkpoint_check import CheckpointError
    from ..export.onnx import export_onnx

    try:
        report = export_onnx(args.checkpoint, args.path, args.with_cache, args.tolerance, args.overwrite)
    except (OnnxExportError, CheckpointError, OSError) as error:
        print(f"angpt onnx: error: {error}", file=sys.stderr)
        return 1
    cache = " with the KV cache" if report["with_cache"] else ""
    print(f"exported folded {report['architecture']} checkpoint{cache} to {report['path']}; self-check passed: "
          f"onnxruntime's logits differ from PyTorch's by at most {report['max_abs_logit_error']:.3g} (allowed: "
          f"{report['allowed_error']:.3g} = {report['tolerance']:g} x {report['logit_scale']:.3g}, the largest "
          "|logit| or 1)")
    return 0
