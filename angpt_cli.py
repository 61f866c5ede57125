"""The `angpt` console script's entry point (setup.cfg), kept outside the package so that it can defer the
package's own import.

`import modeling_angpt` registers the models with transformers' Auto classes, which imports torch and
transformers: seconds. The command line needs none of that to print help or to reject a bad argument, so
this launcher makes `modeling_angpt` importable without running its __init__ yet, parses with
modeling_angpt/cli.py, and runs the package's __init__ (the same module object, so nothing is imported
twice) only when a command is about to run. `python -m modeling_angpt.cli` does the same work without the
deferral.
"""
from __future__ import annotations

import importlib.util
import sys


def _package_with_deferred_init():
    """modeling_angpt in sys.modules with its submodules importable but its __init__ not yet run, or None when
    it is already imported (then there is nothing to defer)."""
    if "modeling_angpt" in sys.modules:
        return None
    spec = importlib.util.find_spec("modeling_angpt")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return None
    package = importlib.util.module_from_spec(spec)
    sys.modules["modeling_angpt"] = package
    return package


def main(argv: list[str] | None = None) -> int:
    package = _package_with_deferred_init()

    def finish_import() -> None:
        if package is not None:
            try:
                package.__spec__.loader.exec_module(package)
            except BaseException:
                sys.modules.pop("modeling_angpt", None)
                raise

    try:
        from modeling_angpt.cli import main as cli_main
    except BaseException:
        if package is not None:
            sys.modules.pop("modeling_angpt", None)
        raise
    return cli_main(argv, before_run=finish_import)


if __name__ == "__main__":
    sys.exit(main())
