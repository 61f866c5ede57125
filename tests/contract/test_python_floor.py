"""The Python floor setup.cfg declares (`python_requires`) is one the code keeps: vermin reads the code and names
every module, function or syntax newer than the floor (docs/usage.md, "Supported versions"). The floor itself is
what transformers, a dependency, requires; `make test-min-versions` runs the tests on the floor's Python."""
from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what users run: the package and its console script, the converters, the eval tasks' code, the benchmarks
CHECKED = ("modeling_angpt", "angpt_cli.py", "conversion", "eval", "bench")


def declared_floor() -> str:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    found = re.fullmatch(r">=\s*(\d+\.\d+)", setup["options"]["python_requires"].strip())
    assert found, f"setup.cfg: python_requires should be '>=X.Y', is {setup['options']['python_requires']!r}"
    return found.group(1)


def test_the_code_needs_no_python_newer_than_the_declared_floor():
    vermin = Path(sys.executable).parent / "vermin"
    assert vermin.exists(), "vermin is not installed in this environment (setup.cfg's [dev] extra)"
    floor = declared_floor()
    checked = subprocess.run([str(vermin), f"-t={floor}-", "--no-tips", "--violations", "--eval-annotations",
                              *CHECKED], cwd=REPO, capture_output=True, text=True, timeout=600)
    violations = " | ".join(line.strip() for line in checked.stdout.splitlines()
                            if line.strip() and not line.startswith(("Detecting", "Analyzing")))
    assert checked.returncode == 0, f"code newer than python_requires >={floor}: {violations} {checked.stderr}"


def test_the_check_finds_code_newer_than_a_floor(tmp_path):
    """vermin against a floor the code does not keep: Python 3.10 lacks asyncio.timeout (3.11)."""
    (tmp_path / "newer.py").write_text("import asyncio\n\nasync def f():\n    async with asyncio.timeout(1):\n"
                                       "        pass\n")
    vermin = Path(sys.executable).parent / "vermin"
    checked = subprocess.run([str(vermin), "-t=3.10-", "--no-tips", "--violations", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode != 0 and "asyncio.timeout" in checked.stdout
