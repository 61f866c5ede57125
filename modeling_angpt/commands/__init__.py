"""The `angpt` subcommands, one module each, all in this folder: `train`, `export`, `eval`, `generate`, ...

Each module is a thin layer over a library function that is callable from Python without the CLI
(`modeling_angpt.training.train`, `modeling_angpt.export.fold.export_checkpoint`, `modeling_angpt.inference.generation.
generate_text`, ...). A module exposes `add_arguments(parser)`, which validates what it can while parsing,
and `run(args) -> int`, which validates the rest before loading anything, calls the library and reports.
A user error is one line on stderr (`angpt COMMAND: error: ...`) and a non-zero exit status, never a
traceback. Nothing heavy (torch, transformers, accelerate) is imported at module level, so `angpt --help`,
`angpt COMMAND --help` and argument errors answer at once (modeling_angpt/cli.py imports a command's module
only when that command is named).
"""
from __future__ import annotations

import argparse


class CommandError(Exception):
    """A user error found by a command: printed by modeling_angpt/cli.py as one line, exit status 2."""


def int_at_least(minimum: int):
    """An argparse type: an integer >= minimum, else a one-line error naming what was expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def float_at_least(minimum: float, strict: bool = False):
    """An argparse type: a finite number >= minimum (> minimum when strict)."""
    import math

    relation = ">" if strict else ">="

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {relation} {minimum:g}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"expected a number {relation} {minimum:g}, got {text}")
        return value
    parse.__name__ = f"number {relation} {minimum:g}"
    return parse
