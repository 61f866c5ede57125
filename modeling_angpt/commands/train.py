"""`angpt train RECIPE.yaml [--override KEY=VALUE ...] [--resume | --overwrite]`: parse, validate, call
`modeling_angpt.training.train`, report.

Errors a user can fix (missing file, bad key, unknown architecture, a used output_dir, a checkpoint of another
run, non-finite loss) are printed as one line on stderr with exit status 2, instead of a traceback."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from . import CommandError

DESCRIPTION = """Train anGPT, nGPT or GPT+ from a recipe (a YAML file of the keys listed below; every key not in
the file takes its default). The run writes into the recipe's output_dir, which must be empty for a new run:
--resume continues the newest checkpoint there, --overwrite replaces a previous run there. Several processes:
accelerate launch --config_file configuration/accelerate/cpu_2proc.yaml -m modeling_angpt.cli train ..."""

RECIPE_SOURCE = Path(__file__).resolve().parents[1] / "training" / "recipe.py"
_FIELD = re.compile(r"^    (\w+): [^=]+?= (.+?)(?:\s+# (.*))?$")


def _default_text(text: str) -> str:
    factory = re.fullmatch(r"field\(default_factory=(?:lambda: )?(.*)\)", text)
    if factory:
        return {"dict": "{}", "list": "[]"}.get(factory.group(1), factory.group(1))
    return text


def recipe_keys_help(source: Path = RECIPE_SOURCE) -> str:
    """The recipe keys, their defaults and meanings, read from the comments of training/recipe.py's Recipe
    (its source is the one place they are written; reading the text keeps `--help` free of imports)."""
    lines, inside = ["recipe keys (default; meaning):"], False
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.startswith("class Recipe"):
            inside = True
            continue
        if not inside:
            continue
        if line.startswith("    def ") or re.match(r"^    [A-Z_]+ = ", line):
            break
        header = re.match(r"^    # --- (.*?) -+$", line)
        if header:
            lines.append(f"  {header.group(1)}:")
            continue
        field = _FIELD.match(line)
        if field:
            name, default, meaning = field.groups()
            lines.append(f"    {name} ({_default_text(default)})" + (f": {meaning}" if meaning else ""))
    lines.append("Optimiser keys left unset (None) take the architecture's values: GPT+ AdamW, weight decay 0.1, "
                 "20 % warm-up; nGPT and anGPT Adam without either; all cosine to 0.01 x peak, clipping 1.0.")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = recipe_keys_help()
    parser.add_argument("recipe", help="training recipe YAML (e.g. configuration/recipes/demo_cpu.yaml)")
    parser.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key (repeatable); values parse as YAML, e.g. bf16=true, "
                             "report_to=[jsonl], model_kwargs.attention_sparsity=topk")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue from the newest checkpoint in output_dir (its recipe and model config must "
                           "match; max_steps, logging/eval/save frequencies and bf16 may change)")
    mode.add_argument("--overwrite", action="store_true",
                      help="replace the previous run in output_dir (only if it is an angpt run directory; "
                           "other files there are kept)")


def validate(args: argparse.Namespace) -> None:
    """Before torch and transformers are imported: the launch environment, the recipe (file, keys, values) and,
    for a new run, its output_dir (a resumed run is checked against its checkpoint later, still before any data
    or model work)."""
    from ..training.launch import check_launch_environment
    from ..training.recipe import load_recipe
    from ..training.run_dir import check_new_run_dir

    try:
        check_launch_environment()
        recipe = load_recipe(args.recipe, args.override)
        if not args.resume:
            check_new_run_dir(Path(recipe.output_dir), args.overwrite)
    except (OSError, ValueError) as error:
        raise CommandError(str(error).strip().replace("\n", " ")) from None


def run(args: argparse.Namespace) -> int:
    from ..training.loop import NonFiniteLossError, train
    from ..training.recipe import load_recipe

    try:
        recipe = load_recipe(args.recipe, args.override)
        result = train(recipe, resume=args.resume, overwrite=args.overwrite)
    except (OSError, ValueError, NonFiniteLossError) as error:  # OSError: missing files, Hub unreachable
        message = str(error).strip().replace("\n", " ") or type(error).__name__
        print(f"angpt train: error: {message}", file=sys.stderr)
        return 2
    if result.accelerator.is_main_process:
        if result.val_losses:
            validation = f"final validation loss {result.val_losses[-1][1]:.4f}"
        else:
            validation = "no validation loss (eval_steps=0)"
        print(f"trained {result.step} steps, {result.tokens_seen} tokens; {validation}; "
              f"model saved to {result.final_dir}")
    return 0
