#!/usr/bin/env python
"""Convert an NVIDIA nGPT reference checkpoint (github.com/NVIDIA/ngpt) into an angpt nGPT checkpoint.

    python conversion/ngpt_to_angpt.py ckpt.pt DST_DIR
    python conversion/ngpt_to_angpt.py model.safetensors DST_DIR --model-args args.json

`ckpt.pt` is what the reference's train.py saves (a dict with `model` and `model_args`); a bare state dict
(.pt or .safetensors) needs `--model-args`, a JSON with the reference GPTConfig fields (n_layer, n_head,
n_embd, vocab_size, block_size, base_scale). The key mapping and the RoPE caveat are documented in
modeling_angpt/conversion/ngpt.py and conversion/README.md.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from modeling_angpt.conversion.ngpt import ngpt_from_reference


def load(path: str, model_args_path: str | None):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        state, args = load_file(path), {}
    else:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        state, args = (checkpoint["model"], dict(checkpoint.get("model_args", {}))) if "model" in checkpoint \
            else (checkpoint, {})
    if model_args_path:
        with open(model_args_path, encoding="utf-8") as handle:
            args.update(json.load(handle))
    missing = [k for k in ("n_layer", "n_head", "n_embd", "vocab_size") if k not in args]
    if missing:
        raise SystemExit(f"error: model args {missing} unknown; pass --model-args JSON")
    return state, args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="reference checkpoint: ckpt.pt from train.py, or a state dict (.pt/.safetensors)")
    parser.add_argument("dst", help="output directory (save_pretrained, safetensors)")
    parser.add_argument("--model-args", help="JSON file with the reference GPTConfig fields")
    parser.add_argument("--rope-layout", default="interleaved", choices=["interleaved", "half"],
                        help="channel pairing of the source's RoPE (the reference: interleaved)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    state, model_args = load(args.src, args.model_args)
    model = ngpt_from_reference(state, model_args, rope_layout=args.rope_layout).to(getattr(torch, args.dtype))
    model.save_pretrained(args.dst)
    print(f"wrote nGPT checkpoint ({model.config.num_hidden_layers} layers, d={model.config.hidden_size}) to {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
