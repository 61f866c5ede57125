#!/usr/bin/env python
"""Length generalisation (scale-invariant paper, Table 1): identical small models trained at length L
with six position/logit variants, evaluated with the length evaluator (`angpt eval --suite length`) at L, 4L, 16L.

Paper (162M, L = 4k, val loss at 4k/16k/64k): RoPE 3.261/3.936/5.260, ALiBi 3.281/3.272/3.270,
LogN+p-RoPE 3.256/3.262/3.317, scale-invariant p-RoPE 3.244/3.235/3.247: scale-invariant best and nearly flat,
RoPE degrading sharply.

Every variant shares the architecture (--arch, GPT+ by default: the paper's modded-nanogpt base is a pre-norm
GPT with QK-norm), shape, data, seed and recipe; only the attention config differs (VARIANTS). Each trained
checkpoint is kept under OUTPUT_DIR/<variant>-s<seed>/final (bench/needle.py fine-tunes the same ones), and a
finished training or evaluation is reused when the script runs again. `--seeds N` trains N models per variant,
seeds 0 … N-1; `--first-seed K` starts them at K, so a later session can add seed K alone (the same model, in the
same directory, as in a run of more seeds).

    python bench/length_generalisation.py --jobs 2 --threads 1   # d=128, 4 layers, L=256, 1500 steps (~35 min, 2 cores)
    python bench/length_generalisation.py --size quick    # minutes
    python bench/length_generalisation.py --device        # d=768, 12 layers, L=1024 on a GPU

`--split-digits` trains the BPE with every digit its own token (the recipe key tokenizer_split_digits), for models
that copy numbers (bench/needle.py); those models need their own --output-dir and get their own sections.

Held-out text (--eval-corpus): by default the last HELDOUT_CHARS characters of one corpus file (linux_docs.txt
of bench/corpus: the kernel's KVM API document) are split off, cut at a paragraph break, and the models train
on the rest (DATASET/.length_split/: the other files linked, that file's head copied), so every window
of the length evaluation is mL tokens of one running text none of the models trained on. `--eval-corpus FILE`
evaluates on FILE and trains on --dataset unchanged; `--eval-corpus blocks` is the earlier behaviour (training
on --dataset, windows made of m validation blocks in random order, so context past L is unrelated text).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import types

import results_file as rf

HELDOUT_CHARS = 1_000_000  # ~280k tokens of the 8k BPE: 68 windows of 16 × 256, 4 × the default 16
HELDOUT_SOURCE = "linux_docs.txt"  # long running prose (one document spans many windows), unlike gcide's entries
SPLIT_DIR = ".length_split"  # hidden: `dataset: bench/corpus` skips it, so the full corpus stays what it was

P_ROPE = {"rope_type": "scale_invariant_p", "partial_rotary_factor": 0.5, "effective_base": 1024.0}
VARIANTS = {
    "RoPE": {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0, "rope_theta": 10000.0}},
    "p-RoPE": {"rope_parameters": P_ROPE},
    "NoPE": {"rope_parameters": {"rope_type": "none"}},
    "ALiBi": {"rope_parameters": {"rope_type": "none"}, "attention_logit_transform": "alibi"},
    "LogN + p-RoPE": {"rope_parameters": P_ROPE, "attention_logit_transform": "logn"},
    "scale-invariant p-RoPE": {"rope_parameters": P_ROPE, "attention_logit_transform": "scale_invariant",
                               "scale_invariant_tau": 10.0},
}
# Settings outside SIZES whose non-default values a section names.
DEFAULTS = {"arch": "gptplus", "seeds": 1, "p_rope_base": P_ROPE["effective_base"], "split_digits": False}
SIZES = {
    "default": dict(hidden=128, layers=4, heads=4, vocab=8192, length=256, batch=8, steps=1500, lr=2e-3,
                    windows=16, multiples=[1, 4, 16]),
    "quick": dict(hidden=64, layers=2, heads=2, vocab=8192, length=128, batch=8, steps=150, lr=4e-3,
                  windows=4, multiples=[1, 4, 16]),
    "device": dict(hidden=768, layers=12, heads=12, vocab=16384, length=1024, batch=32, steps=5000, lr=1e-3,
                   windows=64, multiples=[1, 4, 16]),
}


def slug(variant: str) -> str:
    return variant.lower().replace(" + ", "+").replace(" ", "_")


def checkpoint_dir(cfg: dict, variant: str, seed: int) -> pathlib.Path:
    return pathlib.Path(cfg["output_dir"]) / f"{slug(variant)}-s{seed}"


def seed_ids(cfg: dict) -> list[int]:
    """The seeds of this run: --seeds of them from --first-seed on (a later seed alone lands in the directory, and
    trains the model, that it would as part of a longer run)."""
    return list(range(cfg["first_seed"], cfg["first_seed"] + cfg["seeds"]))


def held_out_split(dataset: str, source_name: str = HELDOUT_SOURCE,
                   chars: int = HELDOUT_CHARS) -> tuple[pathlib.Path, pathlib.Path]:
    """(training directory, held-out file) made from `dataset` (a directory of .txt files or one file): the
    tail of `source_name` (or of the largest file when the corpus has none of that name), at most `chars`
    characters and at most a tenth of that file, starting at a blank line, goes to the held-out file; the
    training directory has that file's head and links to the other files. Built once, beside the data."""
    root = pathlib.Path(dataset).resolve()
    files = sorted(root.glob("*.txt")) if root.is_dir() else [root]
    if not files:
        raise FileNotFoundError(f"--dataset {dataset}: no .txt files to split a held-out part from")
    named = [f for f in files if f.name == source_name]
    source = named[0] if named else max(files, key=lambda f: f.stat().st_size)
    split = (root if root.is_dir() else root.parent) / SPLIT_DIR / (source.stem if root.is_dir() else root.stem)
    train_dir, held_out = split / "train", split / f"{source.stem}_heldout.txt"
    if held_out.is_file():
        return train_dir, held_out
    text = source.read_text(encoding="utf-8", errors="replace")
    cut = text.find("\n\n", len(text) - min(chars, len(text) // 10))
    if cut < 0:
        raise ValueError(f"{source}: no blank line in its last {min(chars, len(text) // 10)} characters to cut at")
    staging = split.with_name(split.name + f".tmp{os.getpid()}")  # the rename makes it appear whole
    (staging / "train").mkdir(parents=True, exist_ok=True)
    (staging / "train" / f"{source.stem}_head.txt").write_text(text[:cut + 2], encoding="utf-8")
    (staging / held_out.name).write_text(text[cut + 2:], encoding="utf-8")
    for other in files:
        if other != source:
            (staging / "train" / other.name).symlink_to(other)
    try:
        staging.rename(split)
    except OSError:  # another process made it first
        import shutil

        shutil.rmtree(staging)
    return train_dir, held_out


# Recipe fields that do not change the trained weights: a checkpoint differing only in these is reused.
NOT_TRAINING = ("output_dir", "logging_steps", "disable_tqdm", "report_to", "save_steps", "save_total_limit",
                "dataloader_num_workers", "eval_steps", "eval_max_batches", "per_device_eval_batch_size")


def with_p_rope_base(attention: dict, base: float) -> dict:
    """The variant's attention config with p-RoPE's slowest frequency 1/base (the p-RoPE variants only)."""
    rope = attention["rope_parameters"]
    return {**attention, "rope_parameters": {**rope, "effective_base": base}} if "effective_base" in rope else attention


def train_variant(cfg: dict, variant: str, seed: int) -> pathlib.Path:
    """Train (or reuse, see `trained`) one variant; returns its final checkpoint directory."""
    from modeling_angpt.training import load_recipe

    out = checkpoint_dir(cfg, variant, seed)
    d = cfg["hidden"]
    model_kwargs = {"hidden_size": d, "intermediate_size": 4 * d, "num_hidden_layers": cfg["layers"],
                    "num_attention_heads": cfg["heads"], "max_position_embeddings": cfg["length"],
                    **with_p_rope_base(VARIANTS[variant], cfg["p_rope_base"])}
    overrides = [f"architecture={cfg['arch']}", f"dataset={cfg['dataset']}", f"tokenizer_vocab_size={cfg['vocab']}",
                 f"block_size={cfg['length']}", f"per_device_train_batch_size={cfg['batch']}",
                 f"max_steps={cfg['steps']}", f"learning_rate={cfg['lr']}", f"seed={seed}", f"output_dir={out}",
                 f"eval_steps={max(1, cfg['steps'] // 5)}", "eval_max_batches=4", "save_steps=0",
                 "save_total_limit=1", "disable_tqdm=true", "report_to=[jsonl]", "logging_steps=50",
                 f"model_kwargs={json.dumps(model_kwargs)}", *tokenizer_overrides(cfg)]
    return trained(load_recipe(cfg["recipe"], overrides))


def tokenizer_overrides(cfg: dict) -> list[str]:
    """--split-digits: a BPE with one token per digit (its own cached tokenizer and blocks)."""
    return ["tokenizer_split_digits=true"] if cfg["split_digits"] else []


def section_name(base: str, cfg: dict) -> str:
    """RESULTS.md section and plot name: models with split digits get their own, beside the default's."""
    return base + ("_split_digits" if cfg["split_digits"] else "")


def title_suffix(cfg: dict) -> str:
    return ", digits split one per token" if cfg["split_digits"] else ""


def tokenizer_text(cfg: dict) -> str:
    return f"vocab {cfg['vocab']}" + (" (byte-level BPE, every digit its own token: `--split-digits`)"
                                      if cfg["split_digits"] else "")


def trained(recipe) -> pathlib.Path:
    """OUTPUT_DIR/final of `recipe`: trained now, or reused when a finished checkpoint there was trained by the
    same recipe. One trained otherwise (other steps, data, shape...) is refused in one line, never adopted or
    overwritten; an unfinished earlier try (no final/) is redone."""
    from modeling_angpt.training import train
    from modeling_angpt.training.recipe import Recipe

    final = pathlib.Path(recipe.output_dir) / "final"
    metadata = final / "training_metadata.json"
    if not metadata.is_file():
        return train(recipe, overwrite=True).final_dir
    before = json.loads(metadata.read_text())["recipe"]
    wanted = json.loads(json.dumps(recipe.to_dict()))  # as stored: tuples become lists
    # a key newer than the checkpoint had its default then (e.g. tokenizer_split_digits)
    before = {**json.loads(json.dumps(Recipe().to_dict())), **before}
    # a key left None is filled at training time from the architecture's defaults, so the stored value differs
    differ = [k for k in sorted(wanted)
              if k not in NOT_TRAINING and wanted[k] is not None and before.get(k) != wanted[k]]
    if differ:  # e.g. a run of --steps 250 beside one of 1500, or --eval-corpus blocks beside heldout
        what = ", ".join(f"{k} {before.get(k)!r} (this run: {wanted.get(k)!r})" for k in differ[:3])
        raise SystemExit(f"--output-dir: {final.parent} was trained with {what}; use another --output-dir")
    return final


def load(checkpoint: pathlib.Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(device).eval()
    return model, AutoTokenizer.from_pretrained(checkpoint)


def evaluate_variant(cfg: dict, variant: str, seed: int, checkpoint: pathlib.Path) -> dict:
    """{multiple: loss} from the length evaluator, cached as length.json beside the checkpoint."""
    from modeling_angpt.evaluation.length import run_suite

    out = checkpoint_dir(cfg, variant, seed) / "length_eval"
    cached = out / "summary.json"
    source = cfg["eval_file"] or "validation blocks"
    if cached.is_file():
        summary = json.loads(cached.read_text())
        if summary.get("windows") == cfg["windows"] and summary.get("eval", "validation blocks") == source:
            return {int(k): v for k, v in summary["loss"].items()}
    model, tokenizer = load(checkpoint, cfg["torch_device"])
    options = types.SimpleNamespace(lengths=",".join(map(str, cfg["multiples"])), limit=cfg["windows"],
                                    batch_size=1, train_length=cfg["length"], corpus=cfg["eval_file"])
    metrics = run_suite(model, tokenizer, checkpoint, options, out)
    losses = {m: metrics[f"length_x{m}"]["loss"] for m in cfg["multiples"]}
    cached.write_text(json.dumps({"windows": cfg["windows"], "eval": source, "loss": losses}))
    return losses


def mean_and_error(values: list[float]) -> tuple[float, float | None]:
    """Mean over seeds and its standard error (None for one seed): the table's cells and the plot's error bars."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def cell(values: list[float], signed: bool = False) -> str:
    """A table cell: the mean over seeds, with its standard error when there are several."""
    mean, error = mean_and_error(values)
    return f"{mean:{'+' if signed else ''}.3f}" + (f" ± {error:.3f}" if error is not None else "")


def summary_row(losses_by_seed: list[dict], multiples: list[int]) -> list[str]:
    return [cell([losses[m] for losses in losses_by_seed]) for m in multiples]


def section(results: dict, cfg: dict, command: str, png_link: str) -> str:
    ms = cfg["multiples"]
    lines = ["## Length generalisation: validation loss at L, 4L, 16L (scale-invariant paper, Table 1)"
             + title_suffix(cfg), "",
             f"`{command}`", "", rf.machine_line(cfg["torch_device"]), "",
             rf.corpus_line(cfg.get("dataset_given", cfg["dataset"]), cfg["eval_file"]), "",
             f"{cfg['arch']} models, d={cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads "
             f"(d_h={cfg['hidden'] // cfg['heads']}), {tokenizer_text(cfg)}, trained at L={cfg['length']} for "
             f"{cfg['steps']} steps × {cfg['batch']}×{cfg['length']} tokens (lr {cfg['lr']:g}, the architecture's "
             f"recipe) on `{shown(cfg, cfg['dataset'])}`, seeds {seed_ids(cfg)}; identical except for the attention "
             "config. Evaluated by `modeling_angpt.evaluation.length.run_suite` (= `angpt eval --suite length`) on "
             + eval_description(cfg) + f", {cfg['windows']} windows of {ms[-1]}L tokens cut into windows of each "
             "length (the same tokens at every length). Paper at 4k/16k/64k: RoPE 3.261/3.936/5.260, ALiBi 3.281/3.272/3.270, "
             "LogN+p-RoPE 3.256/3.262/3.317, scale-invariant p-RoPE 3.244/3.235/3.247.", "",
             rf.changed_settings(cfg, {**SIZES[cfg["size"]], **DEFAULTS}, cfg["size"]), "",
             "| variant | " + " | ".join(f"loss at {m}L ({m * cfg['length']})" for m in ms)
             + f" | {ms[-1]}L − L |", "|---|" + "---|" * (len(ms) + 1)]
    for variant, by_seed in results.items():
        if not by_seed:
            lines.append(f"| {variant} | " + " | ".join("not run" for _ in ms) + " | |")
            continue
        # per seed, then pooled: seeds differ in level more than in growth (a seed's own baseline cancels)
        growth = cell([losses[ms[-1]] - losses[ms[0]] for losses in by_seed], signed=True)
        lines.append(f"| {variant} | " + " | ".join(summary_row(by_seed, ms)) + f" | {growth} |")
    done = {v: statistics.fmean(r[ms[-1]] for r in s) for v, s in results.items() if s}
    if len(done) > 1:
        order = sorted(done, key=done.get)
        lines += ["", f"Ordering at {ms[-1]}L (best first): {' < '.join(order)}. Paper's claim: scale-invariant "
                  f"p-RoPE best and nearly flat, RoPE degrading sharply — here scale-invariant p-RoPE is "
                  f"{'best' if order[0] == 'scale-invariant p-RoPE' else 'not best'}"
                  + (f" and RoPE {'worst' if order[-1] == 'RoPE' else 'not worst'}" if "RoPE" in done else "") + "."]
    lines += ["", f"![validation loss against evaluation length]({png_link})"]
    return "\n".join(lines)


def shown(cfg: dict, path: str) -> str:
    """`path` as the command named it: under --dataset as given (the split resolves links), else relative."""
    given = cfg.get("dataset_given")
    root = pathlib.Path(given).resolve() if given else None
    if root is not None and root.is_dir() and pathlib.Path(path).is_relative_to(root):
        return os.path.join(os.path.relpath(given), os.path.relpath(path, root))
    return os.path.relpath(path)


def eval_description(cfg: dict) -> str:
    if not cfg["eval_file"]:
        return ("the validation blocks in random order (a window of mL tokens is m unrelated blocks: "
                "`--eval-corpus blocks`)")
    where = shown(cfg, cfg["eval_file"])
    if cfg["eval_corpus"] == "heldout":
        return (f"contiguous held-out text, `{where}` (the last {HELDOUT_CHARS // 1000}k characters of "
                f"{HELDOUT_SOURCE}, cut at a blank line; the models trained on the rest of the corpus, "
                f"`{shown(cfg, cfg['dataset'])}`)")
    return f"contiguous text from `{where}` (`--eval-corpus`)"


def plot(results: dict, cfg: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for variant, by_seed in results.items():
        if by_seed:
            ms = cfg["multiples"]
            means, errors = zip(*(mean_and_error([r[m] for r in by_seed]) for m in ms))
            axis.errorbar([m * cfg["length"] for m in ms], means, yerr=None if None in errors else errors,
                          fmt="o-", capsize=3, label=variant)
    axis.axvline(cfg["length"], color="grey", linestyle="--", linewidth=1)
    axis.set(xscale="log", xlabel="evaluation length (tokens)", ylabel="validation loss",
             title=f"trained at L={cfg['length']}" + (", bars: ± standard error over seeds"
                                                     if any(len(s) > 1 for s in results.values()) else ""))
    axis.set_xscale("log", base=2)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    rf.save_figure(figure, path)


def common_arguments(parser: argparse.ArgumentParser) -> None:
    """What bench/needle.py shares with this script: the models and where they live."""
    parser.add_argument("--size", choices=SIZES, default="default")
    parser.add_argument("--device", action="store_true", help="GPU settings (same as --size device), run on CUDA")
    for name in ("hidden", "layers", "heads", "vocab", "length", "batch", "steps", "windows"):
        parser.add_argument(f"--{name}", type=int, help="override the size's value")
    parser.add_argument("--lr", type=float, help="override the size's peak learning rate")
    parser.add_argument("--p-rope-base", type=float, default=P_ROPE["effective_base"],
                        help="p-RoPE's pairs turn at 1 … 1/BASE radians per token (default 1024, the paper's "
                             "at L=4k)")
    parser.add_argument("--arch", default="gptplus", choices=("gptplus", "angpt", "ngpt"))
    parser.add_argument("--split-digits", action="store_true",
                        help="train the BPE with every digit its own token (as Llama's and Qwen's), so a number is "
                             "the same tokens wherever it stands; own models (--output-dir) and results section")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=1, help="models per variant")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="their seeds are FIRST … FIRST+SEEDS-1 (default 0): --seeds 1 --first-seed 2 adds seed 2 "
                             "alone, the same model a run of --seeds 3 trains")
    parser.add_argument("--jobs", type=int, default=1,
                        help="models trained in parallel (processes; on a 2-core CPU, --jobs 2 --threads 1)")
    parser.add_argument("--threads", type=int, help="torch threads per job on the CPU (default: cores / jobs)")
    parser.add_argument("--recipe", default=str(rf.HERE.parent / "configuration/recipes/bench_debian_cpu.yaml"))
    parser.add_argument("--dataset", default=str(rf.HERE / "corpus"), help="built by bench/build_corpus.sh")
    parser.add_argument("--eval-corpus", default="heldout",
                        help="text of the length evaluation: 'heldout' (default: a held-out tail of --dataset, the "
                             "models train on the rest), a text FILE, or 'blocks' (the validation blocks, "
                             "unrelated text after each L tokens)")
    parser.add_argument("--output-dir", default="runs/length_generalisation")
    rf.add_output_arguments(parser)


def resolve(args) -> dict:
    import torch

    cfg = dict(SIZES["device" if args.device else args.size], size="device" if args.device else args.size)
    cfg.update({k: v for k, v in vars(args).items() if v is not None and k not in ("size", "device")})
    cfg["torch_device"] = "cuda" if args.device else "cpu"
    cfg["eval_file"] = None
    if cfg["eval_corpus"] == "heldout":
        cfg["dataset_given"] = cfg["dataset"]
        train_dir, held_out = held_out_split(cfg["dataset"])
        cfg["dataset"], cfg["eval_file"] = str(train_dir), str(held_out)
    elif cfg["eval_corpus"] != "blocks":
        if not pathlib.Path(cfg["eval_corpus"]).is_file():
            raise SystemExit(f"--eval-corpus {cfg['eval_corpus']}: expected 'heldout', 'blocks' or a text file")
        cfg["eval_file"] = cfg["eval_corpus"]
    for name, value in (("jobs", args.jobs), ("threads", args.threads), ("seeds", args.seeds)):
        if value is not None and value < 1:
            raise SystemExit(f"--{name} {value}: expected a positive integer")
    if args.first_seed < 0:
        raise SystemExit(f"--first-seed {args.first_seed}: expected 0 or a positive integer")
    if args.jobs > 1 and args.device:
        raise SystemExit("--jobs: one job at a time on a GPU (--device); drop --jobs")
    cfg["threads"] = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    torch.set_num_threads(cfg["threads"])  # the machine line names what each job used
    return cfg


def for_each_model(cfg: dict, work) -> dict:
    """{variant: [work(cfg, variant, seed) for each seed]}, --jobs at a time in spawned processes. `work` is a
    module-level function (it is pickled by name). With several jobs the tokenizer and packed blocks are built
    first, once, so the jobs do not race to build them."""
    tasks = [(variant, seed) for variant in cfg["variants"] for seed in seed_ids(cfg)]
    if cfg["jobs"] > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        prepare_data(cfg)
        with ProcessPoolExecutor(min(cfg["jobs"], len(tasks)), mp_context=get_context("spawn")) as pool:
            done = list(pool.map(_in_worker, [(work, cfg, variant, seed) for variant, seed in tasks]))
    else:
        done = [work(cfg, variant, seed) for variant, seed in tasks]
    results = {variant: [] for variant in cfg["variants"]}
    for (variant, _), result in zip(tasks, done):
        results[variant].append(result)
    return results


def _in_worker(job):
    import torch

    work, cfg, variant, seed = job
    torch.set_num_threads(cfg["threads"])
    return work(cfg, variant, seed)


def prepare_data(cfg: dict) -> None:
    """The tokenizer and packed blocks every model trains on."""
    from modeling_angpt.training import load_recipe

    rf.build_data(load_recipe(cfg["recipe"], [f"dataset={cfg['dataset']}", f"tokenizer_vocab_size={cfg['vocab']}",
                                              f"block_size={cfg['length']}", *tokenizer_overrides(cfg)]))


def train_and_evaluate(cfg: dict, variant: str, seed: int) -> dict:
    return evaluate_variant(cfg, variant, seed, train_variant(cfg, variant, seed))


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    common_arguments(parser)
    cfg = resolve(parser.parse_args(argv))
    results = for_each_model(cfg, train_and_evaluate)
    png = pathlib.Path(cfg["plots_dir"]) / f"{section_name('length_generalisation', cfg)}.png"
    text = section(results, cfg, rf.command_line("length_generalisation.py", argv), rf.plot_link(cfg["results"], png))
    print(text)
    if not cfg["no_write"]:
        plot(results, cfg, png)
        rf.update_section(section_name("length_generalisation", cfg), text, cfg["results"])


if __name__ == "__main__":
    main()
