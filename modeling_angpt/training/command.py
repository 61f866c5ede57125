"""`angpt train RECIPE.yaml [--override key=value ...] [--resume]`: parse, call the library, report.

Errors a user can fix (missing file, bad key, unknown architecture, non-finite loss) are printed as one
line on stderr with exit status 2, instead of a traceback."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="training recipe YAML (configuration/recipes/*.yaml)")
    parser.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key (repeatable); values parse as YAML, e.g. bf16=true")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in output_dir")


def run(args: argparse.Namespace) -> int:
    from .loop import NonFiniteLossError, train
    from .recipe import load_recipe

    try:
        recipe = load_recipe(args.recipe, args.override)
        result = train(recipe, resume=args.resume)
    except (OSError, ValueError, NonFiniteLossError) as error:  # OSError: missing files, Hub unreachable
        print(f"angpt train: error: {error}", file=sys.stderr)
        return 2
    if result.accelerator.is_main_process:
        val = result.val_losses[-1][1] if result.val_losses else float("nan")
        print(f"trained {result.step} steps, {result.tokens_seen} tokens; final validation loss {val:.4f}; "
              f"model saved to {result.final_dir}")
    return 0
