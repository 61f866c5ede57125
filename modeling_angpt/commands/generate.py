"""`angpt generate DIR --prompt TEXT --max-new-tokens N`: a thin layer over
`modeling_angpt.inference.generation.generate_text`."""
from __future__ import annotations

import argparse
import os
import sys

from . import CommandError, float_at_least, int_at_least

DESCRIPTION = """Continue a prompt with a checkpoint (training form or folded) and the tokenizer saved beside it;
prints the prompt and its continuation. Greedy by default; --temperature > 0 samples."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("checkpoint", help="checkpoint directory with its tokenizer (e.g. runs/demo/folded)")
    parser.add_argument("--prompt", default="", help="text to continue (default: start from the BOS token)")
    parser.add_argument("--max-new-tokens", type=int_at_least(1), default=50,
                        help="number of tokens to generate, at least 1 (default 50)")
    parser.add_argument("--temperature", type=float_at_least(0.0), default=0.0,
                        help="0 = greedy (the default); above 0, sample with this temperature")
    parser.add_argument("--top-k", type=int_at_least(1), default=None,
                        help="when sampling, draw from the k most likely tokens only")
    parser.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="dtype to run the model in (default: the checkpoint's)")


def validate(args: argparse.Namespace) -> None:
    """Before anything heavy is imported or loaded."""
    if not os.path.isdir(args.checkpoint):
        raise CommandError(f"checkpoint {args.checkpoint}: no such directory")
    if not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        raise CommandError(f"checkpoint {args.checkpoint}: not a checkpoint directory (no config.json)")
    if args.top_k is not None and args.temperature == 0:
        raise CommandError("--top-k applies to sampling only: pass --temperature > 0 too")


def run(args: argparse.Namespace) -> int:
    from ..inference.checkpoint_check import CheckpointError
    from ..inference.generation import GenerationError, generate_text

    try:
        text = generate_text(args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k,
                             args.seed, args.dtype)
    except (CheckpointError, GenerationError, OSError) as error:
        print(f"angpt generate: error: {error}", file=sys.stderr)
        return 1
    print(text)
    return 0
