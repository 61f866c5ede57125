"""The `angpt` console script's entry point (setup.cfg): modeling_angpt/cli.py, with the package imported cheaply.

`import modeling_angpt` registers the models with transformers' Auto classes, which imports torch and
transformers: seconds. The command line needs none of that to print help or to reject a bad argument, so the
launcher imports the package with ANGPT_DEFER_REGISTRATION=1 (modeling_angpt/__init__.py: nothing heavy is loaded
until used) and modeling_angpt/cli.py registers the Auto classes only when a command is about to run. The variable
is set for the import only, so processes the command starts import the package as usual.
`python -m modeling_angpt.cli` runs the same commands without the deferral.
"""
from __future__ import annotations

import os
import sys

DEFER_REGISTRATION = "ANGPT_DEFER_REGISTRATION"  # modeling_angpt.DEFER_REGISTRATION


def main(argv: list[str] | None = None) -> int:
    previous = os.environ.get(DEFER_REGISTRATION)
    os.environ[DEFER_REGISTRATION] = "1"
    try:
        from modeling_angpt.cli import main as cli_main
    finally:
        if previous is None:
            del os.environ[DEFER_REGISTRATION]
        else:
            os.environ[DEFER_REGISTRATION] = previous
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
