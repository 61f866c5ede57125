#!/usr/bin/env python
"""Convert a transformers Llama or Qwen3 checkpoint directory into a GPT+ checkpoint (conversion/README.md).

    python conversion/llama_qwen3_to_gptplus.py SRC_DIR DST_DIR [--dtype float32]

The parameter names are shared (key for key); the script checks that the converted model reproduces the
source's logits on a probe batch before it writes anything, and copies the tokenizer if there is one.
"""
from __future__ import annotations

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from modeling_angpt.conversion.llama_qwen3 import gptplus_from_transformers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="directory of a LlamaForCausalLM or Qwen3ForCausalLM checkpoint")
    parser.add_argument("dst", help="output directory for the GPT+ checkpoint")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max |Δlogit| allowed on the probe batch")
    args = parser.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    source = AutoModelForCausalLM.from_pretrained(args.src, dtype=torch.float32).eval()
    try:
        model = gptplus_from_transformers(source)
    except ValueError as error:  # what GPT+ cannot represent exactly: one line, no traceback
        print(f"error: {error}", file=sys.stderr)
        return 2
    probe = torch.randint(0, source.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        delta = (model(probe).logits - source(probe).logits).abs().max().item()
    if delta > args.tolerance:
        print(f"error: converted logits differ from the source by {delta:.3g} > {args.tolerance}", file=sys.stderr)
        return 1
    model.to(dtype).save_pretrained(args.dst)
    try:
        AutoTokenizer.from_pretrained(args.src).save_pretrained(args.dst)
    except (OSError, ValueError):
        pass  # a checkpoint without a tokenizer converts all the same
    print(f"wrote GPT+ checkpoint to {args.dst} (max |Δlogit| on the probe batch: {delta:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
