"""`angpt export SRC DST [--dtype ...]`: write the folded inference form of a checkpoint (SPEC.md §2).

The export checks its own result: it writes into a hidden sibling directory, reloads that through the Auto
classes, compares the logits with the source model on a probe batch and only then renames it to DST. On any
failure the partial directory is removed, so DST is either a verified checkpoint or absent.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# |Δlogit| ≤ tolerance · max(1, max|logit|): SPEC §2's 1e-5 in float32 (the demo's folded anGPT: 9e-7). Half
# types: each weight is rounded once to 8 (bf16) or 11 (fp16) significant bits.
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float64: 1e-10}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja")


class ExportError(RuntimeError):
    """The export refused or its self-check failed; nothing was written at DST."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="checkpoint directory (training form) written by save_pretrained")
    parser.add_argument("dst", help="output directory for the folded checkpoint (must not exist or be empty)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="dtype of the exported weights (default: the source checkpoint's)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="relative logit tolerance of the self-check (default depends on --dtype)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty DST")


def probe_batch(vocab_size: int, batch: int = 2, length: int = 24, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=generator)


@torch.no_grad()
def compare_logits(reference: torch.nn.Module, candidate: torch.nn.Module, input_ids: torch.Tensor) -> tuple[float, float]:
    """(max|Δlogit|, max(1, max|logit|)) between two models on one batch, in float64."""
    expected = reference(input_ids).logits.double()
    actual = candidate(input_ids).logits.double()
    return float((expected - actual).abs().max()), max(1.0, float(expected.abs().max()))


def export_checkpoint(src, dst, dtype: torch.dtype | None = None, tolerance: float | None = None,
                      overwrite: bool = False, fold=None) -> dict:
    """Fold `src` into `dst`; returns a report dict. `fold` (model -> folded model) is injectable for tests."""
    import modeling_angpt  # noqa: F401  (registers the Auto classes)

    from .card_angpt import read_card_info, write_model_card
    from .checkpoint_check import check_checkpoint

    src, dst = os.path.abspath(src), os.path.abspath(dst)
    if os.path.exists(dst) and os.listdir(dst) and not overwrite:
        raise ExportError(f"{dst} exists and is not empty (pass --overwrite to replace it)")
    config, model_class = check_checkpoint(src)
    if getattr(config, "folded", False):
        raise ExportError(f"{src} is already folded (config.folded=True)")
    source = model_class.from_pretrained(src, dtype=torch.float32).eval()
    dtype = dtype or getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    tolerance = TOLERANCES.get(dtype, 1e-4) if tolerance is None else tolerance
    try:
        folded = (fold or (lambda m: m.fold(dtype)))(source)
    except ValueError as error:  # e.g. a fold that would divide by zero, naming the layer
        raise ExportError(f"cannot export {src}: {error}") from error

    partial = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        card_info = read_card_info(src)
        folded.save_pretrained(partial, card_info=card_info)
        for name in TOKENIZER_FILES + ("training_metadata.json",):  # `angpt eval` finds the held-out split
            if os.path.isfile(os.path.join(src, name)):
                shutil.copy2(os.path.join(src, name), os.path.join(partial, name))
        # again, now that it sees the tokenizer; the usage snippet names DST, where the checkpoint will be
        write_model_card(folded, partial, {**card_info, "repo_id": dst})
        reloaded = model_class.from_pretrained(partial, dtype=dtype).eval()
        if not reloaded.config.folded:
            raise ExportError("the written checkpoint did not reload as folded")
        error, scale = compare_logits(source, reloaded, probe_batch(config.vocab_size))
        if not error <= tolerance * scale:
            raise ExportError(f"self-check failed: the reloaded folded checkpoint's logits differ from {src} by "
                              f"{error:.3g} > {tolerance:g} × {scale:.3g}; nothing written at {dst}")
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.replace(partial, dst)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return {"src": src, "dst": dst, "dtype": str(dtype).replace("torch.", ""), "max_abs_logit_error": error,
            "logit_scale": scale, "tolerance": tolerance, "architecture": config.architecture}


def run(args: argparse.Namespace) -> int:
    from .checkpoint_check import CheckpointError

    try:
        report = export_checkpoint(args.src, args.dst, DTYPES.get(args.dtype), args.tolerance, args.overwrite)
    except (ExportError, CheckpointError) as error:
        print(f"angpt export: {error}", file=sys.stderr)
        return 1
    print(f"exported folded {report['architecture']} checkpoint to {report['dst']} ({report['dtype']}); "
          f"self-check max|Δlogit| = {report['max_abs_logit_error']:.3g} "
          f"(tolerance {report['tolerance']:g} × {report['logit_scale']:.3g})")
    return 0
