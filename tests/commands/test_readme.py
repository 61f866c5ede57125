"""The README works as written: its Python examples run, its links stay inside the repository, and its shell
blocks run in order, verbatim (the tour in CI; `make demo`, twice, in the slow suite)."""
import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import REPO, cli_env

README = REPO / "README.md"


def shell_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_usage_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}  # blocks run in order, as a reader would paste them
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "my-angpt" / "model.safetensors").is_file()


@functools.cache  # one read per page, however many links point into it
def heading_anchors(page: Path) -> set[str]:
    """The anchors a Markdown renderer gives `page`'s headings: lower case, ASCII letters, digits, '-' and '_'
    kept, spaces to '-', everything else dropped (so "(§5: 1.40×)" leaves "5-140")."""
    headings = [line.lstrip("#").strip().lower() for line in page.read_text().splitlines() if line.startswith("#")]
    return {"".join(c for c in h if (c.isascii() and c.isalnum()) or c in " -_").replace(" ", "-") for h in headings}


def test_readme_and_docs_stand_alone():
    """Every link (anchors included) and every file the README names exists in the repository; nothing points
    outside it, not even by name (the project's specification is not shipped, so no page cites it)."""
    for page in [README, REPO / "bench" / "RESULTS.md", *sorted(REPO.glob("docs/*.md")), *REPO.glob("conversion/*.md")]:
        text = page.read_text()
        assert not re.search(r"\bSPEC\b|DESIGN\.md|research/|\.\./shared|shared/", text), page
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
            assert not target.startswith(("http", "/")), (page, target)
            path = page.parent / target
            assert path.exists() and path.resolve().is_relative_to(REPO), (page, target)
            if anchor:
                assert anchor in heading_anchors(path if target else page), (page, target, anchor)
    named = set(re.findall(r"`((?:docs|configuration|conversion|bench|tests|modeling_angpt)/[\w./-]+)`",
                           README.read_text()))
    assert named and all((REPO / path).exists() for path in named), [p for p in named if not (REPO / p).exists()]
    for doc in ("architectures", "inference-fold", "attention", "evaluation", "training"):
        assert f"docs/{doc}.md" in README.read_text()


def _workdir(tmp_path: Path) -> Path:
    """A place that looks like the repository root to the README's commands, writing only under tmp_path."""
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("configuration", ".venv"):
        (work / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "docs", work / "docs")  # the tour trains on docs/ and caches beside it
    return work


def test_readme_tour_runs_verbatim_in_order(tmp_path):
    tours = [b for b in shell_blocks() if "tour_cpu.yaml" in b]
    assert len(tours) == 1, "the README's tour is one shell block"
    work = _workdir(tmp_path)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", tours[0]], cwd=work, capture_output=True, text=True,
                          timeout=900, env=cli_env(ANGPT_CACHE=str(tmp_path / "cache")))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    assert "trained 30 steps" in out and "trained 40 steps" in out and "self-check passed" in out
    assert "\nROMEO:" in "\n" + out
    for path in ("runs/tour/final/model.safetensors", "runs/tour/folded/model.safetensors",
                 "runs/tour-docs/final/model.safetensors"):
        assert (work / path).is_file(), path
    assert "dataset': 'docs'" in (work / "runs/tour-docs/final/training_metadata.json").read_text().replace('"', "'")


def _command_lines(block: str) -> list[list[str]]:
    import shlex

    text = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.split("#")[0].strip()]


def test_readme_reference_commands_parse():
    """The shell blocks beside the tour need `make demo`'s model or the Hub to run; each of their `angpt` lines
    must still parse against today's command line (no renamed command or option, no invalid value)."""
    from modeling_angpt import cli

    checked = 0
    for block in shell_blocks():
        if "tour_cpu.yaml" in block or block.lstrip().startswith("make"):
            continue
        for words in _command_lines(block):
            if not words[0].endswith("angpt"):
                continue
            parser = cli.build_parser(words[1])
            args = parser.parse_args(words[1:])
            assert args.command == words[1]
            checked += 1
    assert checked >= 5


@pytest.mark.slow
def test_make_demo_twice_in_a_row(tmp_path):
    """The README's set-up block, `make demo`, twice: the second run neither trains nor exports, evaluates and
    generates again, and succeeds. (`make test` is what CI runs.) Many minutes on a 2-core CPU."""
    setup = [b for b in shell_blocks() if b.lstrip().startswith("make")]
    assert setup and "make demo" in setup[0]
    demo_dir = tmp_path / "demo"
    runs = []
    for _ in range(2):
        runs.append(subprocess.run(["make", "demo", f"DEMO_DIR={demo_dir}"], cwd=REPO, capture_output=True,
                                   text=True, timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO)}))
        assert runs[-1].returncode == 0, runs[-1].stderr[-4000:]
    assert "trained 400 steps" in runs[0].stdout and "self-check passed" in runs[0].stdout
    assert "angpt train" not in runs[1].stdout and "angpt export" not in runs[1].stdout
    assert "angpt generate" in runs[1].stdout and "ROMEO:" in runs[1].stdout
