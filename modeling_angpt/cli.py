"""`angpt` console script: a thin dispatcher over the subcommands in modeling_angpt/commands/.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int` (modeling_angpt/commands/
__init__.py). Only the named command's module is imported, and only when it is named, so `angpt --help`
imports none of them. Usage errors are one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

DESCRIPTION = ("Train, export, evaluate and sample from anGPT, nGPT and GPT+ language models "
               "(Hugging Face transformers models).")
EPILOG = ("Run `angpt COMMAND --help` for a command's options. The README and docs/ of the repository explain "
          "the architectures, the commands and their output.")

# command -> (module, one-line help)
COMMANDS = {
    "prepare": ("modeling_angpt.commands.prepare", "tokenise a recipe's corpus into token shards for training"),
    "train": ("modeling_angpt.commands.train", "train a model from a recipe YAML"),
    "export": ("modeling_angpt.commands.export", "fold the constants into the weights (inference form)"),
    "onnx": ("modeling_angpt.commands.onnx", "export a folded checkpoint as an ONNX graph for onnxruntime"),
    "eval": ("modeling_angpt.commands.eval", "evaluate a checkpoint (lm-eval suites, held-out loss, length, needle)"),
    "generate": ("modeling_angpt.commands.generate", "generate text from a checkpoint"),
    "serve": ("modeling_angpt.commands.serve", "serve a checkpoint as an OpenAI-compatible server (transformers')"),
    "compare": ("modeling_angpt.commands.compare", "compare training runs: loss against tokens, tokens to a target loss"),
    "semantic-focus": ("modeling_angpt.commands.semantic_focus",
                       "semantic-focus paper's protocol on one task and attention configuration"),
}
# What an ImportError of an optional dependency means for the user.
EXTRAS = {"accelerate": "train", "datasets": "train", "tensorboard": "train", "tqdm": "train", "yaml": "train",
          "matplotlib": "train", "lm_eval": "eval",
          "onnx": "tools", "onnxscript": "tools", "onnxruntime": "tools", "fastapi": "tools", "uvicorn": "tools"}


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, with each usage error on one line (`angpt train: error: ...`) instead of usage + error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("angpt")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"angpt {package_version()}")
        parser.exit(0)


def _missing_extra(error: ImportError) -> str | None:
    """A one-line hint when `error` is a missing optional dependency, else None."""
    name = (getattr(error, "name", None) or "").split(".")[0]
    if name in EXTRAS:
        return f"the Python package {name!r} is missing; install the extra: pip install 'angpt[{EXTRAS[name]}]'"
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; the subcommand `command` (if any) gets its module's arguments, the others only a name."""
    parser = OneLineArgumentParser(prog="angpt", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action=_VersionAction, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_name)
        if name != command:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            # A missing optional dependency (e.g. the [eval] extra): the command says what to install when run.
            hint = _missing_extra(error)
            if hint is None:
                raise
            sub_parser.set_defaults(_missing=hint)
            continue
        module.add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, check (each command's cheap `validate`), register the models with the Auto classes, run the command.
    Nothing before the registration imports torch or transformers, so help and usage errors answer at once when
    the package was imported with its registration deferred (the console script, angpt_cli.py)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    prog = f"angpt {args.command}"
    if getattr(args, "_missing", None):
        print(f"{prog}: error: {args._missing}", file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    from .commands import CommandError

    try:
        module = importlib.import_module(args._module)
        if hasattr(module, "validate"):  # cheap checks, before the package's heavy imports
            module.validate(args)
        if getattr(module, "USES_MODELS", True):  # `angpt prepare` touches no model: it starts in a fraction
            from . import register_auto_classes

            register_auto_classes()  # what `import modeling_angpt` does, unless the console script deferred it
        return int(module.run(args) or 0)
    except CommandError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        hint = _missing_extra(error)
        if hint is None:
            raise
        print(f"{prog}: error: {hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
