"""Checks of an evaluation's inputs that need no model: the device, the checkpoint directory, the weights'
digest and a fresh output directory. A check that fails raises `EvalInputError`, one line naming what was wrong."""
from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path


class EvalInputError(ValueError):
    """Input that cannot be evaluated (bad option, not a checkpoint, unknown task, unreachable data)."""


def check_device(device: str | None) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps|xpu(:\d+)?", device):
        raise EvalInputError(f"--device {device}: expected cpu, cuda, cuda:N, mps or xpu")
    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise EvalInputError(f"--device {device}: CUDA device not available on this machine")
    return device


def check_checkpoint_dir(checkpoint: Path) -> dict:
    """config.json readable, weights present and complete, a tokenizer; returns the config dict."""
    from ..inference.checkpoint_check import CheckpointError, check_checkpoint

    if not checkpoint.exists():
        raise EvalInputError(f"checkpoint {checkpoint}: no such directory")
    if not checkpoint.is_dir():
        raise EvalInputError(f"checkpoint {checkpoint}: not a directory (expected a saved model directory)")
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        raise EvalInputError(f"checkpoint {checkpoint}: not a model directory (no config.json)")
    try:
        config = json.loads(config_path.read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as error:
        raise EvalInputError(f"{config_path}: not a valid config ({error})") from None
    if not any((checkpoint / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise EvalInputError(f"checkpoint {checkpoint}: no tokenizer (tokenizer.json / tokenizer_config.json); "
                             "save one with tokenizer.save_pretrained")
    try:
        if config.get("model_type") == "angpt":
            check_checkpoint(str(checkpoint))   # every tensor the config implies, with its shape
        else:
            from ..inference.checkpoint_check import read_shapes

            read_shapes(str(checkpoint))
    except CheckpointError as error:
        raise EvalInputError(str(error)) from None
    return config


def weights_digest(checkpoint: Path) -> dict:
    """sha256 of every weight file (sorted by name) and of them all together."""
    from ..inference.checkpoint_check import safetensors_files

    total, files = hashlib.sha256(), {}
    for path in sorted(safetensors_files(str(checkpoint))):
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        files[os.path.basename(path)] = digest.hexdigest()
        total.update(digest.hexdigest().encode())
    return {"sha256": total.hexdigest() if len(files) > 1 else next(iter(files.values())), "files": files}


def default_output_dir(checkpoint: Path) -> Path:
    """eval_results/<last two path parts of the checkpoint>/<UTC time>[-N]: never an existing directory."""
    name = "-".join(part for part in checkpoint.resolve().parts[-2:] if part not in ("/", ""))
    name = re.sub(r"[^\w.\-]+", "_", name) or "checkpoint"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path("eval_results") / name / stamp
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{stamp}-{n}")
    return candidate
