"""What the benchmark scripts share, and the experiments (experiments/) use too: the results page each script writes
one section of (between its own markers; the speed benchmarks' page is docs/results/benchmarks.md, with its plots in
docs/results/plots/), the line that names the machine and the versions, and the exact command."""
from __future__ import annotations

import os
import pathlib
import platform
import re
import shlex
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results" / "benchmarks.md"
PLOTS = REPO / "docs" / "results" / "plots"


def counted(n: int, noun: str) -> str:
    """'1 seed', '3 seeds': the count with its noun in the right number, in tables, headings and legends."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def update_section(name: str, body: str, path: pathlib.Path | str = RESULTS) -> None:
    """Replace the section `name` (or append it) and leave the other sections alone."""
    path = pathlib.Path(path)
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = re.sub(r"\n{3,}", "\n\n", body.strip())  # an empty optional line leaves one blank line, not three
    section = f"{start}\n{body}\n{end}"
    text = path.read_text() if path.exists() else "# Results\n"
    if start in text and end in text:
        text = text[: text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)



def add_output_arguments(parser, plots: bool = True, results: pathlib.Path = RESULTS,
                         plots_dir: pathlib.Path = PLOTS) -> None:
    """--results / --plots-dir (smoke tests point them at a temp dir; no --plots-dir for a script that draws no
    plot) and --no-write. `results` and `plots_dir` are the script's own defaults (an experiment's: its study's
    README.md and plots/)."""
    parser.add_argument("--results", default=str(results), help="the Markdown page to write this script's section into "
                        f"(default {os.path.relpath(results, REPO)})")
    if plots:
        parser.add_argument("--plots-dir", default=str(plots_dir), help="where the PNG plots go "
                            f"(default {os.path.relpath(plots_dir, REPO)})")
    leaves = "write neither the results page nor plots" if plots else "leave the results page alone"
    parser.add_argument("--no-write", action="store_true", help=f"print only, {leaves}")






def save_figure(figure, path: str | pathlib.Path) -> None:
    """Lay out, write (creating the folder) and close a matplotlib figure: every plot is saved alike."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_link(results: str | pathlib.Path, png: str | pathlib.Path) -> str:
    """The PNG's path relative to the results page that links it."""
    return os.path.relpath(pathlib.Path(png).resolve(), pathlib.Path(results).resolve().parent)


def command_line(script: str | pathlib.Path, argv: list[str] | None) -> str:
    """`python SCRIPT ARGS...` as run from the repository root: `script` is the script's file (its `__file__`)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(["python", os.path.relpath(pathlib.Path(script).resolve(), REPO), *map(shlex.quote, argv)])


def help_description(doc: str) -> str:
    """A script's --help description: its docstring's first paragraph, in one line (argparse wraps it)."""
    return " ".join(doc.split("\n\n", 1)[0].split())


def cpu_name() -> str:
    """The CPU's model name and the vector extension torch's kernels use on it: CPUs sold under one name differ
    (AVX2 only: no native bfloat16, ~100x slower in bf16; AVX512 with AMX: bf16 2-3x faster than float32)."""
    import torch

    from modeling_angpt.training.metrics import cpu_model

    return f"{cpu_model()} ({torch.backends.cpu.get_cpu_capability()})"


def load_average() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def gpu_name(device: str) -> str | None:
    """"NAME (CUDA x.y)" of the GPU a `device` string runs on; None for a CPU run."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return None


def machine_line(device: str = "cpu") -> str:
    """Machine, versions and load: one sentence for a results section."""
    import torch
    import transformers

    what = gpu_name(device) or (f"{cpu_name()}, {counted(os.cpu_count() or 1, 'core')}, "
                                f"{counted(torch.get_num_threads(), 'torch thread')}")
    return (f"Machine: {what}; Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}; load average (1/5/15 min) {load_average()} when written.")

