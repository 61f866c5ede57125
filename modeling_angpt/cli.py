"""`angpt` console script: a thin dispatcher. Each subcommand lives in its own module that exposes
`add_arguments(parser)` and `run(args) -> int`; the module is imported only when its command runs,
so `angpt export` does not pay for importing accelerate or datasets."""
from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, one-line help)
COMMANDS = {
    "train": ("modeling_angpt.training.command", "train a model from a recipe YAML"),
    "export": ("modeling_angpt.export_command", "fold the constants into the weights (inference form)"),
    "eval": ("modeling_angpt.commands.eval", "evaluate a checkpoint (lm-eval suites, held-out loss, length, needle)"),
    "generate": ("modeling_angpt.generate_command", "generate text from a checkpoint"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="angpt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        sub_parser.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only a missing optional dependency (e.g. the [train] extra) is tolerated here; the
            # command then says what to install when it is actually run.
            sub_parser.set_defaults(_missing=str(error))
            continue
        module.add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "_missing", None):
        print(f"angpt {args.command}: {args._missing}; install the extra: pip install 'angpt[train,eval]'",
              file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
