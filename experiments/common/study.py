"""What the experiments share beyond bench/results_file.py: their corpus (built by experiments/common/build_corpus.sh)
and recipes, the size presets and the flags on top of them, the output folder a setting claims, and the data built
once before parallel runs."""
from __future__ import annotations

import json
import os
import pathlib
import re

EXPERIMENTS = pathlib.Path(__file__).resolve().parent.parent
REPO = EXPERIMENTS.parent
CORPUS = EXPERIMENTS / "corpus"  # experiments/common/build_corpus.sh's default output (ignored by git)
RECIPES = REPO / "configuration" / "recipes"


def build_data(recipe) -> None:
    """The tokenizer and packed blocks of `recipe`, built (or found cached) in this process: parallel runs started
    afterwards find them cached instead of racing to build them."""
    import contextlib

    from modeling_angpt.data.sources import resolve_corpus
    from modeling_angpt.data.build import build_datasets

    build_datasets(recipe, resolve_corpus(recipe), contextlib.nullcontext)


def add_size_arguments(parser, sizes, device_help: str = "GPU settings (same as --size device)") -> None:
    """--size, one of an experiment's `sizes`, and --device, the shorthand for its GPU size."""
    parser.add_argument("--size", choices=sizes, default="default", help="the experiment's shape, data and length")
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


def changed_settings(cfg: dict, defaults: dict, size: str) -> str:
    """One sentence naming every setting that differs from the size preset (empty when none does)."""
    changed = [f"{k} {cfg[k]} (default {v})" for k, v in defaults.items() if k in cfg and cfg[k] != v]
    return f"Settings that differ from `--size {size}`: {', '.join(changed)}." if changed else ""


def corpus_line(dataset: str | pathlib.Path, *texts: str | pathlib.Path) -> str:
    """The packages (and versions) the corpus at `dataset` was built from, as experiments/common/build_corpus.sh
    recorded them in SOURCES beside the text (in `dataset` or up to three folders above it, where the held-out splits
    live), and the sha256 of each of `texts` (a held-out file): Debian replaces package versions in place, so the same
    build command can give other text later."""
    import hashlib

    here = pathlib.Path(dataset).resolve()
    sources = next((d / "SOURCES" for d in (here, *here.parents[:3]) if (d / "SOURCES").is_file()), None)
    if sources is None:
        line = (f"Corpus `{dataset}`: no SOURCES in or above it (not built by experiments/common/build_corpus.sh, or "
                "built before it recorded its packages).")
    else:
        rows = [row.split() for row in sources.read_text().splitlines()]
        # "PACKAGE VERSION" rows; the "SHA256  FILE" rows name the text, which the packages already pin
        packages = [" ".join(r) for r in rows if len(r) == 2 and not re.fullmatch(r"[0-9a-f]{64}", r[0])]
        line = f"Corpus built from {', '.join(packages)} (`{os.path.relpath(sources)}`)."
    hashes = [f"`{os.path.relpath(f)}` sha256 {hashlib.sha256(pathlib.Path(f).read_bytes()).hexdigest()[:16]}"
              for f in texts if f and pathlib.Path(f).is_file()]
    return line + (f" Evaluation text: {', '.join(hashes)}." if hashes else "")
