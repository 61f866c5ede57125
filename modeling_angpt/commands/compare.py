"""`angpt compare RUN_DIR [RUN_DIR...] [--target-loss X] [--output FILE.png] [--log-tokens]`: parse, call
`modeling_angpt.training.compare_plot.compare_runs`, print the table (docs/training.md, "Comparing runs")."""
from __future__ import annotations

import argparse
from pathlib import Path

from . import CommandError, float_at_least

DESCRIPTION = """Compare training runs by their validation loss against tokens seen: a figure (training and validation
loss, and the norms anGPT's and nGPT's constants assume) and a table, printed and written as Markdown beside the
figure: each run's final validation loss, the tokens it took to reach the target loss (linear between evaluations)
and its token ratio to the first run (the first run's tokens / this run's: 1.4 = 1.4x fewer tokens). Runs of
different tokenizers or validation sets are refused: their losses do not compare. Reads only each run directory's
recipe.json, model_config.json and metrics.jsonl, so unfinished runs compare too; one run alone gets its figure
and table too (its curves and norms)."""

USES_MODELS = False  # reads JSON files and plots: no model, no torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="training run directories (output_dir of angpt train); the first is the reference")
    parser.add_argument("--target-loss", type=float_at_least(0.0, strict=True), default=None,
                        help="validation loss the token counts are read at (default: the highest final validation "
                             "loss among the runs, which every run reaches)")
    parser.add_argument("--output", type=Path, default=Path("compare.png"),
                        help="the figure (PNG); the table goes beside it as .md (default: compare.png)")
    parser.add_argument("--log-tokens", action="store_true", help="log-scaled tokens axis")


def validate(args: argparse.Namespace) -> None:
    if args.output.suffix.lower() != ".png":
        raise CommandError(f"--output {args.output}: expected a .png file name")
    for run_dir in args.run_dirs:
        if not Path(run_dir).is_dir():
            raise CommandError(f"run directory not found: {run_dir}")


def run(args: argparse.Namespace) -> int:
    from ..training.compare import CompareError
    from ..training.compare_plot import compare_runs

    try:
        comparison = compare_runs(args.run_dirs, args.target_loss, args.output, args.log_tokens)
    except (CompareError, OSError) as error:
        raise CommandError(str(error)) from None
    print(comparison.markdown(), end="")
    print(f"figure: {args.output}; table: {args.output.with_suffix('.md')}")
    return 0
