"""Export: write the folded inference form of a checkpoint (docs/inference-fold.md), callable from Python as
`export_checkpoint(src, dst)`; `angpt export SRC DST` (modeling_angpt/commands/export.py) is a thin layer over it.

The export checks its own result: it writes into a hidden sibling directory, reloads that through the Auto
classes, compares the logits with the source model on a probe batch and only then renames it to DST. On any
failure the partial directory is removed, so DST is either a verified checkpoint or absent.
"""
from __future__ import annotations

import os
import shutil

DTYPE_NAMES = ("float32", "bfloat16", "float16")
# |Δlogit| ≤ tolerance · max(1, max|logit|): 1e-5 in float32 (docs/inference-fold.md; the demo's folded anGPT:
# 9e-7). Half types: each weight is rounded once to 8 (bf16) or 11 (fp16) significant bits.
TOLERANCES = {"float32": 1e-5, "bfloat16": 5e-2, "float16": 1e-2, "float64": 1e-10}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja")
# (torch is imported inside the functions: the path checks run before anything heavy is loaded)


class ExportError(RuntimeError):
    """The export refused or its self-check failed; nothing was written at DST."""


def probe_batch(vocab_size: int, batch: int = 2, length: int = 24, seed: int = 0):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=generator)


def compare_logits(reference, candidate, input_ids) -> tuple[float, float]:
    """(max|Δlogit|, max(1, max|logit|)) between two models on one batch, in float64."""
    import torch

    with torch.no_grad():
        expected = reference(input_ids).logits.double()
        actual = candidate(input_ids).logits.double()
    return float((expected - actual).abs().max()), max(1.0, float(expected.abs().max()))


def check_export_paths(src, dst, overwrite: bool = False, tolerance: float | None = None) -> tuple[str, str]:
    """Refuse, before anything is loaded, what export cannot do or must not destroy; returns absolute paths.

    `overwrite` replaces DST only when DST is itself a checkpoint (it has a config.json): an export never
    deletes a directory of other files, nor the source or a directory that contains it."""
    src, dst = os.path.abspath(src), os.path.abspath(dst)
    if not os.path.isdir(src):
        raise ExportError(f"SRC {src}: no such checkpoint directory")
    if not os.path.isfile(os.path.join(src, "config.json")):
        raise ExportError(f"SRC {src}: not a checkpoint directory (no config.json)")
    if tolerance is not None and not tolerance > 0:
        raise ExportError(f"--tolerance {tolerance:g}: expected a number > 0")
    if dst == src or src.startswith(dst + os.sep):
        raise ExportError(f"DST {dst} is the source checkpoint or contains it; choose another directory")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise ExportError(f"DST {dst} exists and is not a directory")
    if os.path.isdir(dst) and os.listdir(dst):
        if not overwrite:
            raise ExportError(f"DST {dst} exists and is not empty (pass --overwrite to replace an earlier export)")
        if not os.path.isfile(os.path.join(dst, "config.json")):
            raise ExportError(f"DST {dst} is not empty and is not a checkpoint (no config.json); --overwrite "
                              "replaces only an earlier export: choose another directory")
    parent = unwritable_parent(dst)
    if parent is not None:
        raise ExportError(f"DST {dst}: cannot write under {parent} (permission denied)")
    return src, dst


def unwritable_parent(path: str) -> str | None:
    """The nearest existing directory above `path` when it cannot be written to (None when it can): what a writer
    checks before loading anything."""
    parent = os.path.dirname(path)
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    return None if os.access(parent, os.W_OK) else parent


def _copy_tokenizer(src: str, partial: str, folded) -> None:
    """The source's tokenizer files, then padding set up for batched generation (inference/padding.py)."""
    copied = False
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), os.path.join(partial, name))
            copied = True
    if not copied:
        return
    from transformers import AutoTokenizer

    from ..inference.padding import make_batchable, set_pad_token_id

    tokenizer = AutoTokenizer.from_pretrained(partial)
    if make_batchable(tokenizer):
        tokenizer.save_pretrained(partial)
    set_pad_token_id(folded, tokenizer)


def export_checkpoint(src, dst, dtype=None, tolerance: float | None = None,
                      overwrite: bool = False, fold=None) -> dict:
    """Fold `src` into `dst`; returns a report dict. `dtype`: a torch dtype or its name (default: the source's).
    `fold` (model -> folded model) is injectable for tests.
    `overwrite` replaces an earlier export at `dst` (see check_export_paths), atomically as seen by readers
    of `dst`: the new checkpoint is complete and verified before the old one is moved away."""
    import torch

    from .. import register_auto_classes
    from ..inference.checkpoint_check import check_checkpoint
    from .hub import read_card_info, save_pretrained, write_model_card

    register_auto_classes()  # the self-check reloads the export through the Auto classes

    src, dst = check_export_paths(src, dst, overwrite, tolerance)
    config, model_class = check_checkpoint(src)
    if getattr(config, "folded", False):
        raise ExportError(f"{src} is already folded (config.folded=True)")
    source = model_class.from_pretrained(src, dtype=torch.float32).eval()
    dtype = dtype or getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    tolerance = TOLERANCES.get(str(dtype).replace("torch.", ""), 1e-4) if tolerance is None else tolerance
    try:
        folded = (fold or (lambda m: m.fold(dtype)))(source)
    except ValueError as error:  # e.g. a fold that would divide by zero, naming the layer
        raise ExportError(f"cannot export {src}: {error}") from error

    partial = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.partial-{os.getpid()}")
    previous = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.previous-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        card_info = read_card_info(src)
        os.makedirs(partial)
        _copy_tokenizer(src, partial, folded)
        save_pretrained(folded, partial, card_info=card_info)
        if os.path.isfile(os.path.join(src, "training_metadata.json")):  # `angpt eval` finds the held-out split
            shutil.copy2(os.path.join(src, "training_metadata.json"), os.path.join(partial, "training_metadata.json"))
        # again, now that it sees the tokenizer; the usage snippet names the directory by its own name
        write_model_card(folded, partial, {**card_info, "repo_id": os.path.basename(dst)})
        reloaded = model_class.from_pretrained(partial, dtype=dtype).eval()
        if not reloaded.config.folded:
            raise ExportError("the written checkpoint did not reload as folded")
        error, scale = compare_logits(source, reloaded, probe_batch(config.vocab_size))
        if not error <= tolerance * scale:
            raise ExportError(f"self-check failed: the reloaded folded checkpoint's logits differ from {src} by "
                              f"{error:.3g}, more than the tolerance {tolerance:g} × {scale:.3g} = "
                              f"{tolerance * scale:.3g}; nothing written at {dst}")
        if os.path.exists(dst):
            os.replace(dst, previous)
        os.replace(partial, dst)
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return {"src": src, "dst": dst, "dtype": str(dtype).replace("torch.", ""), "max_abs_logit_error": error,
            "logit_scale": scale, "tolerance": tolerance, "allowed_error": tolerance * scale,
            "architecture": config.architecture}
