"""Running the `angpt` console script as a user does, in a subprocess, and checking how it fails."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The console script's entry point (setup.cfg: angpt = angpt_cli:main), run with this interpreter and this checkout
# (a checkout without the launcher, e.g. an older one, is run through the module form).
ENTRY = ("import sys, angpt_cli; sys.exit(angpt_cli.main())" if (REPO / "angpt_cli.py").is_file() else
         "import sys, runpy; sys.argv[0] = 'angpt'; runpy.run_module('modeling_angpt.cli', run_name='__main__')")


def cli_env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


def angpt(*args, cwd=None, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=cli_env(**env))


def assert_one_line_error(proc: subprocess.CompletedProcess, *expected: str) -> str:
    """Non-zero exit, exactly one line on stderr containing each `expected` text, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode != 0, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert "Traceback" not in proc.stderr, err[-3000:]
    assert len(err.splitlines()) == 1, err[-3000:]
    for text in expected:
        assert text in err, err
    return err


def snapshot(path: Path) -> dict:
    """{relative path: (size, mtime)} of everything under `path`: to show that nothing was created or deleted."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}
