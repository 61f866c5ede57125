"""`angpt generate DIR --prompt TEXT --max-new-tokens N`: load a checkpoint and its tokenizer, print the text."""
from __future__ import annotations

import argparse
import sys

import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint directory (training or folded form) with its tokenizer")
    parser.add_argument("--prompt", default="", help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=50)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import modeling_angpt  # noqa: F401  (registers the Auto classes)

    from .checkpoint_check import CheckpointError, check_checkpoint

    try:
        check_checkpoint(args.checkpoint)
        tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    except (CheckpointError, OSError, ValueError) as error:
        print(f"angpt generate: {error}", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=dtype).eval()
    torch.manual_seed(args.seed)
    encoded = tokenizer(args.prompt or (tokenizer.bos_token or ""), return_tensors="pt")
    if encoded["input_ids"].shape[1] == 0:
        print("angpt generate: the prompt is empty and the tokenizer has no BOS token", file=sys.stderr)
        return 1
    sampling = args.temperature > 0
    with torch.no_grad():
        output = model.generate(**encoded, max_new_tokens=args.max_new_tokens, do_sample=sampling,
                                temperature=args.temperature if sampling else None, top_k=args.top_k,
                                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    print(tokenizer.decode(output[0], skip_special_tokens=True))
    return 0
