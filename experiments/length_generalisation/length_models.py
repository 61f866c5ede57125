"""The models of the scale-invariant paper's Table 1 and 2 experiments, shared by length_generalisation.py
(validation loss at L, 4L, 16L), its analyses and experiments/needle/needle.py (needle retrieval after fine-tuning):
the six attention variants,
the sizes, the held-out split of the corpus, training (or reusing) one checkpoint per variant and seed, and the
command-line arguments both scripts take. Only the attention config differs between variants (VARIANTS)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib

import results_file as rf
import study

HELDOUT_CHARS = 1_000_000  # ~280k tokens of the 8k BPE: 68 windows of 16 × 256, 4 × the default 16
HELDOUT_SOURCE = "linux_docs.txt"  # long running prose (one document spans many windows), unlike gcide's entries

SPLIT_DIR = ".length_split"  # hidden: `dataset: experiments/corpus` skips it, so the full corpus stays what it was
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
    """Section and plot name: models with split digits get their own, beside the default's."""
    return base + ("_split_digits" if cfg["split_digits"] else "")


def title_suffix(cfg: dict) -> str:
    return ", digits split one per token" if cfg["split_digits"] else ""


# Settings a section of its own (--section) names in its title when they differ from the size's, in these words.
TITLED_SETTINGS = {"steps": lambda v: rf.counted(v, "step"), "p_rope_base": lambda v: f"p-RoPE base {v:g}",
                   "length": lambda v: f"L={v}", "hidden": lambda v: f"d={v}",
                   "layers": lambda v: rf.counted(v, "layer"), "lr": lambda v: f"lr {v:g}", "arch": str}


def own_section_suffix(cfg: dict) -> str:
    """', seed 0, 3000 steps': a section of its own (--section) names its seeds and the settings that set it apart
    in its title, so two such sections never share a title (nor a link anchor)."""
    if not cfg.get("section"):
        return ""
    seeds = seed_ids(cfg)
    words = [f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}–{seeds[-1]}"]
    defaults = {**SIZES[cfg["size"]], **DEFAULTS}
    words += [name(cfg[key]) for key, name in TITLED_SETTINGS.items() if cfg[key] != defaults[key]]
    return ", " + ", ".join(words)


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


def load(checkpoint: pathlib.Path, device: str, **overrides):
    """(float32 model in eval mode on `device`, tokenizer); `overrides` go to from_pretrained (config fields,
    attn_implementation)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, **overrides).to(device).eval()
    return model, AutoTokenizer.from_pretrained(checkpoint)


def shown(cfg: dict, path: str) -> str:
    """`path` as the command named it: under --dataset as given (the split resolves links), else relative."""
    given = cfg.get("dataset_given")
    root = pathlib.Path(given).resolve() if given else None
    if root is not None and root.is_dir() and pathlib.Path(path).is_relative_to(root):
        return os.path.join(os.path.relpath(given), os.path.relpath(path, root))
    return os.path.relpath(path)


def common_arguments(parser: argparse.ArgumentParser, study_dir: pathlib.Path) -> None:
    """The arguments length_generalisation.py, its analyses and experiments/needle/needle.py share: the models and
    where they live; the section goes into `study_dir`'s README.md, its plots into `study_dir`/plots."""
    study.add_size_arguments(parser, SIZES, "GPU settings (same as --size device), run on CUDA")
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
    parser.add_argument("--recipe", default=str(study.RECIPES / "bench_debian_cpu.yaml"))
    parser.add_argument("--dataset", default=str(study.CORPUS), help="built by experiments/common/build_corpus.sh")
    parser.add_argument("--eval-corpus", default="heldout",
                        help="text of the length evaluation: 'heldout' (default: a held-out tail of --dataset, the "
                             "models train on the rest), a text FILE, or 'blocks' (the validation blocks, "
                             "unrelated text after each L tokens)")
    parser.add_argument("--output-dir", default="runs/length_generalisation")
    rf.add_output_arguments(parser, results=study_dir / "README.md", plots_dir=study_dir / "plots")


def resolve(args) -> dict:
    import torch

    cfg = study.sized_config(SIZES, args)
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
        from worker_pool import worker_pool

        prepare_data(cfg)
        with worker_pool(min(cfg["jobs"], len(tasks))) as pool:
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

    study.build_data(load_recipe(cfg["recipe"], [f"dataset={cfg['dataset']}", f"tokenizer_vocab_size={cfg['vocab']}",
                                                 f"block_size={cfg['length']}", *tokenizer_overrides(cfg)]))
