"""Checks every command-line script of a folder must pass, for bench/ (tests/bench) and the experiments
(experiments/test_experiment_scripts.py) alike: its --help opens with whole sentences that stand alone, and it runs
from the command line."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path


def scripts(folder: Path) -> list[Path]:
    """The scripts of `folder` (and its subfolders) that parse a command line."""
    return [path for path in sorted(folder.rglob("*.py")) if "ArgumentParser(" in path.read_text()]


def check_help_descriptions(found: list[Path]) -> None:
    """`python SCRIPT --help` shows the docstring's first paragraph: whole (not cut at its first line) and naming
    nothing the repository does not ship."""
    from results_file import help_description

    for script in found:
        source = script.read_text()
        assert re.search(r"ArgumentParser\(description=(rf\.)?help_description\(__doc__\)", source), script
        description = help_description(ast.get_docstring(ast.parse(source)))
        assert description.endswith(".") and not re.search(r"\bSPEC\b|shared/", description), (script, description)


def check_run_from_the_command_line(found: list[Path]) -> None:
    """Every script prints its usage for --help as `python SCRIPT` runs it (the tests call main() directly, which
    would not notice a script whose `__main__` guard went missing), from the repository root."""
    root = Path(__file__).resolve().parents[1]
    runs = {script.name: subprocess.Popen([sys.executable, str(script.relative_to(root)), "--help"], cwd=root,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for script in found}
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.startswith(f"usage: {name}"), (name, out[:200], err[-500:])
