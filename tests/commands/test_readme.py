"""The README and the guides work as written: their Python examples run, their command lines parse against today's
command line and scripts, their links and the repository paths they name stay inside the repository, and the
README's shell blocks run in order, verbatim (the tour in CI; `make demo`, twice, in the slow suite)."""
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import REPO, cli_env

README = REPO / "README.md"
GUIDES = sorted(path for path in REPO.glob("docs/*.md"))  # the guides; docs/results/ holds tables, not examples
PAGES = [README, *sorted(REPO.glob("docs/**/*.md")), *sorted(REPO.glob("conversion/*.md")),
         *sorted(REPO.glob("bench/*.md")),
         *sorted(REPO.glob("experiments/**/*.md"))]
# A repository path in backticks: `docs/attention.md`, `tests/contract/`, `experiments/needle/needle.py`.
NAMED_PATH = r"`((?:docs|configuration|conversion|bench|experiments|eval|tests|modeling_angpt)/[\w./-]*)`"


def shell_blocks(page: Path = README) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def test_readme_usage_example_runs(tmp_path, monkeypatch):
    blocks = python_blocks(README)
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}  # blocks run in order, as a reader would paste them
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "my-angpt" / "model.safetensors").is_file()
    assert namespace["variant"].attention_sparsity == "topk"


@pytest.mark.parametrize("page", [p.name for p in GUIDES if python_blocks(p)])
def test_guide_python_examples_run(page, tmp_path, monkeypatch):
    """Each guide's Python blocks, in order, in one fresh namespace per page, from a directory that looks like the
    repository root (the examples name `configuration/` files and write their outputs beside them)."""
    work = _workdir(tmp_path)
    monkeypatch.chdir(work)
    namespace = {"__name__": "guide"}
    for block in python_blocks(REPO / "docs" / page):
        exec(compile(block, page, "exec"), namespace)


@functools.cache  # one read per page, however many links point into it
def heading_anchors(page: Path) -> set[str]:
    """The anchors a Markdown renderer gives `page`'s headings: lower case, ASCII letters, digits, '-' and '_'
    kept, spaces to '-', everything else dropped (so "(§5: 1.40×)" leaves "5-140")."""
    headings = [line.lstrip("#").strip().lower() for line in page.read_text().splitlines() if line.startswith("#")]
    return {"".join(c for c in h if (c.isascii() and c.isalnum()) or c in " -_").replace(" ", "-") for h in headings}


def test_readme_and_docs_stand_alone():
    """Every link (anchors and images included) of the README, the docs, the converters' page, the benchmarks' and
    the experiments' pages points to a file of the repository; nothing points outside it, not even by name (the
    project's specification is not shipped, so no page cites it); every repository path the README and the docs
    name in backticks exists."""
    assert len(PAGES) > 8
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"\bSPEC\b|DESIGN\.md|research/|\.\./shared|shared/", text), page
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
            assert not target.startswith(("http", "/")), (page, target)
            path = page.parent / target
            assert path.exists() and path.resolve().is_relative_to(REPO), (page, target)
            if anchor:
                assert anchor in heading_anchors(path if target else page), (page, target, anchor)
    for page in [README, *REPO.glob("docs/**/*.md")]:
        named = set(re.findall(NAMED_PATH, page.read_text()))
        assert all((REPO / path).exists() for path in named), (page, [p for p in named if not (REPO / p).exists()])
    readme = README.read_text()
    for doc in ("architectures", "inference-fold", "attention", "evaluation", "training", "usage",
                "transformers-compat", "results/README"):
        assert f"docs/{doc}.md" in readme
    for page in GUIDES:  # every guide is reachable from the README
        assert f"docs/{page.name}" in readme, page


@pytest.mark.docs_commands
def test_results_pages_name_scripts_and_options_that_exist():
    """The commands the README and the docs give for the experiments and benchmarks (`python experiments/...`,
    `python bench/...`) name scripts that exist, and every option they pass is one the script's --help lists."""
    commands = [c for page in [README, *REPO.glob("docs/**/*.md")]
                for c in re.findall(r"`python ((?:experiments|bench)/[^`]+)`", page.read_text())]
    assert len(commands) >= 10
    options: dict[str, set[str]] = {}
    for command in commands:
        script = command.split()[0]
        assert (REPO / script).is_file(), command
        options.setdefault(script, set()).update(re.findall(r"(?<!\S)(--[a-z][\w-]*)", command))
    helps = {script: subprocess.Popen([sys.executable, script, "--help"], cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=cli_env())
             for script in options}
    for script, proc in helps.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (script, err[-2000:])
        missing = sorted(option for option in options[script] if option not in out)
        assert not missing, (script, missing)


def _workdir(tmp_path: Path) -> Path:
    """A place that looks like the repository root to the README's commands, writing only under tmp_path."""
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("configuration", ".venv"):
        (work / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "docs", work / "docs")  # the tour trains on docs/ and caches beside it
    return work


@pytest.mark.docs_commands
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
    assert "| token ratio |" in out and (work / "runs/compare.png").is_file() and (work / "runs/compare.md").is_file()


def _command_lines(block: str) -> list[list[str]]:
    import shlex

    text = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.split("#")[0].strip()]


def test_readme_reference_commands_parse():
    """The shell blocks of the README and the guides beside the tour need `make demo`'s model or the Hub to run;
    each of their `angpt` lines must still parse against today's command line (no renamed command or option, no
    invalid value)."""
    from modeling_angpt import cli

    checked = {}
    for page in [README, *GUIDES]:
        for block in shell_blocks(page):
            if "tour_cpu.yaml" in block or block.lstrip().startswith("make"):
                continue
            for words in _command_lines(block):
                if not words[0].endswith("angpt"):
                    continue
                parser = cli.build_parser(words[1])
                args = parser.parse_args(words[1:])
                assert args.command == words[1]
                checked[page.name] = checked.get(page.name, 0) + 1
    assert checked.get("README.md", 0) >= 4 and sum(checked.values()) >= 10, checked


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
