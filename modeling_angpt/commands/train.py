"""`angpt train RECIPE.yaml [--override KEY=VALUE ...] [--resume [auto] | --overwrite]`: parse, validate, call
`modeling_angpt.training.train`, report.

Errors a user can fix (missing file, bad key, unknown architecture, a used output_dir, a checkpoint of another
run, non-finite loss) are printed as one line on stderr with exit status 2, instead of a traceback. A run stopped by
a scheduler's signal exits with preemption.PREEMPTED_EXIT_CODE (75) after its checkpoint, a run that lost a rank with
rank_watch.LOST_RANK_EXIT_CODE (3) (docs/training.md)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import textwrap
from pathlib import Path

from . import CommandError

DESCRIPTION = """Train anGPT, nGPT or GPT+ from a recipe (a YAML file of the keys listed below; every key not in
the file takes its default). The run writes into the recipe's output_dir, which must be empty for a new run:
--resume continues the newest checkpoint there (--resume auto: if there is one, else it starts the run: one command
line for every start of a requeued job), --overwrite replaces a previous run there. SIGTERM (or the recipe's
preemption_signal) stops the run with a checkpoint of the step reached, exit status 75. Validation is capped by
default (eval_max_batches below; a stream's validation_blocks), so its cost does not grow with the corpus.
Several processes:
accelerate launch --config_file configuration/accelerate/cpu_2proc.yaml -m modeling_angpt.cli train ..."""


def _shown(value) -> str:
    """A default as a recipe YAML would write it (strings quoted, lists and mappings in flow style)."""
    if isinstance(value, (str, list, dict)):
        return json.dumps(value)
    return repr(value)


def recipe_keys_help() -> str:
    """Every recipe key with its default and meaning, from the Recipe dataclass's field definitions, then the values
    each architecture gives to the optimiser keys a recipe leaves unset."""
    from ..training.recipe import ARCHITECTURE_DEFAULTS, Recipe  # the standard library and PyYAML only

    lines = ["recipe keys (default; meaning):"]
    for key in dataclasses.fields(Recipe):
        if "section" in key.metadata:
            lines.append(f"  {key.metadata['section']}:")
        default = key.default if key.default_factory is dataclasses.MISSING else key.default_factory()
        lines.append(f"    {key.name} ({_shown(default)}): {key.metadata['help']}")
    lines.append("Optimiser keys left unset (None) take the architecture's values:")
    for architecture, defaults in ARCHITECTURE_DEFAULTS.items():
        values = " ".join(f"{Recipe.ARCHITECTURE_KEYS[name]}={value:g}" if isinstance(value, float) else
                          f"{Recipe.ARCHITECTURE_KEYS[name]}={value}" for name, value in defaults.items())
        lines.append(textwrap.fill(values, 110, initial_indent=f"  {architecture}: ", subsequent_indent="    "))
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
    mode.add_argument("--resume", nargs="?", const=True, default=False, choices=["auto"], metavar="auto",
                      help="continue from the newest complete checkpoint in output_dir (its recipe and model config "
                           "must match; max_steps, logging/eval/save frequencies, bf16, and the per-device batch and "
                           "accumulation that keep the global batch may change); `--resume auto` starts the run when "
                           "there is no checkpoint yet")
    mode.add_argument("--overwrite", action="store_true",
                      help="replace the previous run in output_dir (only if it is an angpt run directory; "
                           "other files there are kept)")


def validate(args: argparse.Namespace) -> None:
    """Before torch and transformers are imported: the launch environment, the recipe (file, keys, values) and,
    for a new run, its output_dir (a resumed run is checked against its checkpoint later, still before any data
    or model work)."""
    from ..training.distributed import check_launch_environment
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
    from ..training.preemption import PREEMPTED_EXIT_CODE, Preempted
    from ..training.rank_watch import LOST_RANK_EXIT_CODE, is_collective_failure, resume_command
    from ..training.recipe import load_recipe

    try:
        recipe = load_recipe(args.recipe, args.override)
        result = train(recipe, resume=args.resume, overwrite=args.overwrite)
    except Preempted:  # the checkpoint is committed, the logs closed and the line printed (preemption.announce)
        # Straight out, without the interpreter's teardown of every module (seconds with transformers loaded): the
        # grace period a scheduler gives is short, and torchrun's is shared by all ranks (docs/training.md)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(PREEMPTED_EXIT_CODE)
    except (OSError, ValueError, NonFiniteLossError) as error:  # OSError: missing files, Hub unreachable
        message = str(error).strip().replace("\n", " ") or type(error).__name__
        print(f"angpt train: error: {message}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # a collective failed and no rank was found lost (training/rank_watch.py)
        if not is_collective_failure(error):
            raise
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"angpt train: error: a collective of the run failed ({first}); continue the run with "
              f"`{resume_command()}` on every machine, launched as before", file=sys.stderr)
        return LOST_RANK_EXIT_CODE
    if result.accelerator.is_main_process:
        if result.val_losses:
            validation = f"final validation loss {result.val_losses[-1][1]:.4f}"
        else:
            validation = "no validation loss (eval_steps=0)"
        print(f"trained {result.step} steps, {result.tokens_seen} tokens; {validation}; "
              f"model saved to {result.final_dir}")
    return 0
