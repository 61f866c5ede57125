"""`angpt export SRC DST [--dtype ...] [--overwrite]`: a thin layer over `modeling_angpt.export.fold.export_checkpoint`
(the folded inference form, docs/inference-fold.md)."""
from __future__ import annotations

import argparse
import sys

from . import CommandError, float_at_least
from ..export.fold import DTYPE_NAMES, ExportError, check_export_paths

DESCRIPTION = """Fold a training-form checkpoint into the inference form: every constant goes into the weights
(docs/inference-fold.md). The export reloads what it wrote, compares its logits with the source on a probe batch,
and only then moves it to DST: DST is either a verified checkpoint or untouched."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("src", help="checkpoint directory in training form (e.g. runs/demo/final)")
    parser.add_argument("dst", help="output directory for the folded checkpoint (absent or empty, or an earlier "
                                    "export with --overwrite)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=None,
                        help="dtype of the exported weights (default: the source checkpoint's)")
    parser.add_argument("--tolerance", type=float_at_least(0.0, strict=True), default=None,
                        help="relative logit tolerance of the self-check: |Δlogit| <= tolerance x max(1, max|logit|) "
                             "(default 1e-5 for float32, 5e-2 bfloat16, 1e-2 float16)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export at DST (a directory holding a config.json); the new export "
                             "is verified before the old one is removed")


def validate(args: argparse.Namespace) -> None:
    """Before anything heavy is imported: the paths and what --overwrite may replace."""
    try:
        check_export_paths(args.src, args.dst, args.overwrite, args.tolerance)
    except ExportError as error:
        raise CommandError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    from ..inference.checkpoint_check import CheckpointError
    from ..export.fold import export_checkpoint

    try:
        report = export_checkpoint(args.src, args.dst, args.dtype, args.tolerance, args.overwrite)
    except (ExportError, CheckpointError, OSError) as error:
        print(f"angpt export: error: {error}", file=sys.stderr)
        return 1
    print(f"exported folded {report['architecture']} checkpoint to {report['dst']} ({report['dtype']}); "
          f"self-check passed: the reloaded logits differ from the source's by at most "
          f"{report['max_abs_logit_error']:.3g} (allowed: {report['allowed_error']:.3g} = {report['tolerance']:g} x "
          f"{report['logit_scale']:.3g}, the largest |logit| or 1)")
    return 0
