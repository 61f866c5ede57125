"""What the benchmark scripts share: bench/RESULTS.md (each script owns one section between its own markers),
bench/plots/, the line that names the machine, the versions and the exact command, and the data built once before
parallel runs."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import shlex
import sys

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "RESULTS.md"
PLOTS = HERE / "plots"


def counted(n: int, noun: str) -> str:
    """'1 seed', '3 seeds': the count with its noun in the right number, in tables, headings and legends."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def update_section(name: str, body: str, path: pathlib.Path | str = RESULTS) -> None:
    """Replace the section `name` (or append it) and leave the other sections alone."""
    path = pathlib.Path(path)
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = re.sub(r"\n{3,}", "\n\n", body.strip())  # an empty optional line leaves one blank line, not three
    section = f"{start}\n{body}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if start in text and end in text:
        text = text[: text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def build_data(recipe) -> None:
    """The tokenizer and packed blocks of `recipe`, built (or found cached) in this process: parallel runs started
    afterwards find them cached instead of racing to build them."""
    import contextlib

    from modeling_angpt.training.data import build_datasets, resolve_source

    build_datasets(recipe, resolve_source(recipe.dataset), contextlib.nullcontext)


def add_output_arguments(parser, plots: bool = True) -> None:
    """--results / --plots-dir (smoke tests point them at a temp dir; no --plots-dir for a script that draws no
    plot) and --no-write."""
    parser.add_argument("--results", default=str(RESULTS), help="the RESULTS.md to write this script's section into")
    if plots:
        parser.add_argument("--plots-dir", default=str(PLOTS), help="where the PNG plots go")
    leaves = "write neither RESULTS.md nor plots" if plots else "leave RESULTS.md alone"
    parser.add_argument("--no-write", action="store_true", help=f"print only, {leaves}")


def add_size_arguments(parser, sizes, device_help: str = "GPU settings (same as --size device)") -> None:
    """--size, one of a benchmark's `sizes`, and --device, the shorthand for its GPU size."""
    parser.add_argument("--size", choices=sizes, default="default", help="the benchmark's shape, data and length")
    parser.add_argument("--device", action="store_true", help=device_help)


def chosen_size(args) -> str:
    return "device" if args.device else args.size


def sized_config(sizes: dict, args) -> dict:
    """The chosen size's settings and its name (`size`), with every argument given on the command line on top."""
    size = chosen_size(args)
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("size", "device")}
    return {**sizes[size], "size": size, **given}


def claim_output_dir(script: str, output_dir: str | pathlib.Path, settings: dict) -> None:
    """Record `settings` (what a finished run's result depends on beyond its name) in OUTPUT_DIR/settings.json, or
    stop with one line if the folder holds runs made with other settings: resuming from them would report another
    experiment's runs as this one's."""
    output_dir = pathlib.Path(output_dir)
    saved = output_dir / "settings.json"
    if saved.is_file():
        theirs = json.loads(saved.read_text())
        differ = [f"{k} {theirs.get(k)!r}, not {v!r}" for k, v in settings.items() if theirs.get(k) != v]
        if differ:
            raise SystemExit(f"{script}: --output-dir {output_dir} holds runs made with other settings "
                             f"({'; '.join(differ)}); pick another --output-dir")
    output_dir.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(settings))


def save_figure(figure, path: str | pathlib.Path) -> None:
    """Lay out, write (creating the folder) and close a matplotlib figure: every bench plot is saved alike."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_link(results: str | pathlib.Path, png: str | pathlib.Path) -> str:
    """The PNG's path relative to the RESULTS.md that links it."""
    return os.path.relpath(pathlib.Path(png).resolve(), pathlib.Path(results).resolve().parent)


def command_line(script: str, argv: list[str] | None) -> str:
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"bench/{script}", *map(shlex.quote, argv)])


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
    """Machine, versions and load: one sentence for a RESULTS.md section."""
    import torch
    import transformers

    what = gpu_name(device) or (f"{cpu_name()}, {counted(os.cpu_count() or 1, 'core')}, "
                                f"{counted(torch.get_num_threads(), 'torch thread')}")
    return (f"Machine: {what}; Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}; load average (1/5/15 min) {load_average()} when written.")


def corpus_line(dataset: str | pathlib.Path, *texts: str | pathlib.Path) -> str:
    """The packages (and versions) the corpus at `dataset` was built from, as bench/build_corpus.sh recorded them in
    SOURCES beside the text (in `dataset` or up to three folders above it, where the held-out splits live), and
    the sha256 of each of `texts` (a held-out file): Debian replaces package versions in place, so the same build
    command can give other text later."""
    import hashlib

    here = pathlib.Path(dataset).resolve()
    sources = next((d / "SOURCES" for d in (here, *here.parents[:3]) if (d / "SOURCES").is_file()), None)
    if sources is None:
        line = (f"Corpus `{dataset}`: no SOURCES in or above it (not built by bench/build_corpus.sh, or built "
                "before it recorded its packages).")
    else:
        rows = [row.split() for row in sources.read_text().splitlines()]
        # "PACKAGE VERSION" rows; the "SHA256  FILE" rows name the text, which the packages already pin
        packages = [" ".join(r) for r in rows if len(r) == 2 and not re.fullmatch(r"[0-9a-f]{64}", r[0])]
        line = f"Corpus built from {', '.join(packages)} (`{os.path.relpath(sources)}`)."
    hashes = [f"`{os.path.relpath(f)}` sha256 {hashlib.sha256(pathlib.Path(f).read_bytes()).hexdigest()[:16]}"
              for f in texts if f and pathlib.Path(f).is_file()]
    return line + (f" Evaluation text: {', '.join(hashes)}." if hashes else "")


def changed_settings(cfg: dict, defaults: dict, size: str) -> str:
    """One sentence naming every setting that differs from the size preset (empty when none does)."""
    changed = [f"{k} {cfg[k]} (default {v})" for k, v in defaults.items() if k in cfg and cfg[k] != v]
    return f"Settings that differ from `--size {size}`: {', '.join(changed)}." if changed else ""
