"""Pre-flight check of a checkpoint directory before anything is loaded or written.

transformers raises on a truncated safetensors header but does not say which file, and a checkpoint whose
tensors do not fit its config must never come back half-loaded (modeling_angpt.py's from_pretrained also
refuses that). This check names the file and the tensors. What it cannot see: flipped bytes inside a tensor's
data (safetensors has no checksum).
"""
from __future__ import annotations

import json
import os

import torch

MODEL_FILES = ("model.safetensors", "model.safetensors.index.json")


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded as it is."""


def safetensors_files(directory: str) -> list[str]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
        return [os.path.join(directory, f) for f in files]
    single = os.path.join(directory, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise CheckpointError(f"{directory}: no model.safetensors (or model.safetensors.index.json); this library "
                          "reads and writes safetensors checkpoints only")


def read_shapes(directory: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, file)} from the safetensors headers; a corrupted or truncated file is an error."""
    from safetensors import safe_open

    shapes = {}
    for path in safetensors_files(directory):
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: listed in the index but missing")
        try:
            with safe_open(path, framework="pt") as handle:
                for name in handle.keys():
                    shapes[name] = (tuple(handle.get_slice(name).get_shape()), path)
        except Exception as error:  # safetensors raises its own SafetensorError, not a subclass of OSError
            raise CheckpointError(f"{path}: corrupted or truncated safetensors file ({error})") from error
    return shapes


def check_checkpoint(directory: str, model_class=None):
    """Raise CheckpointError naming the file/tensors unless every tensor the config implies is present with its
    shape; returns the config. `model_class` defaults to the one named in config.json's `architectures`."""
    from transformers import AutoConfig

    from .. import register_auto_classes
    from ..modeling_angpt import AnGPTForCausalLM, AnGPTForSequenceClassification

    register_auto_classes()

    directory = str(directory)
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise CheckpointError(f"{directory}: no config.json")
    try:
        config = AutoConfig.from_pretrained(directory)
    except Exception as error:
        raise CheckpointError(f"{directory}/config.json: cannot be read as a config ({error})") from error
    if model_class is None:
        names = getattr(config, "architectures", None) or ["AnGPTForCausalLM"]
        model_class = AnGPTForSequenceClassification if "AnGPTForSequenceClassification" in names else AnGPTForCausalLM
    saved = read_shapes(directory)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in model_class(config).state_dict().items()}
    tied = set((model_class._tied_weights_keys or {}).keys()) if getattr(config, "tie_word_embeddings", False) else set()
    problems = [f"{k}: missing" for k in sorted(expected) if k not in saved and k not in tied]
    problems += [f"{k} in {os.path.basename(saved[k][1])}: shape {saved[k][0]}, config implies {shape}"
                 for k, shape in sorted(expected.items()) if k in saved and saved[k][0] != shape]
    problems += [f"{k} in {os.path.basename(saved[k][1])}: not a parameter of {model_class.__name__}"
                 for k in sorted(saved) if k not in expected]
    if problems:
        raise CheckpointError(f"{directory}: the weights do not match config.json ({len(problems)} tensors): "
                              + "; ".join(problems[:10]))
    return config, model_class
