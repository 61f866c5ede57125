"""Training recipes: one dataclass of keys, loaded from YAML, overridden by `--override key=value`.

Keys use transformers' `TrainingArguments` names wherever one exists (output_dir, learning_rate, ...), so
a recipe reads the same to a Trainer user. Each key's default and meaning are written once, in its field
definition below (`angpt train --help` lists them from there, commands/train.py). Optimiser keys left unset (None) are
filled from the architecture's values (`ARCHITECTURE_DEFAULTS`, docs/architectures.md): GPT+ gets AdamW with
weight decay and 20 % warm-up, nGPT/anGPT get Adam without either. Every error names the key.

Imports only the standard library and PyYAML, so `angpt train --help` and the recipe checks of `angpt train` run
before torch is imported.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .trackers import ACCELERATE_TRACKERS, unknown_entries

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# The optimiser keys each architecture fills when a recipe leaves them unset (Recipe.with_architecture_defaults;
# docs/architectures.md): GPT+ as the papers train it, nGPT and anGPT with plain Adam, no decay and no warm-up.
_GPTPLUS = dict(optimizer="adamw", weight_decay=0.1, warmup_ratio=0.2, adam_beta1=0.9, adam_beta2=0.95,
                adam_epsilon=1e-9, max_grad_norm=1.0, lr_scheduler_type="cosine", min_lr_ratio=0.01)
_NGPT = dict(optimizer="adam", weight_decay=0.0, warmup_ratio=0.0, adam_beta1=0.9, adam_beta2=0.95,
             adam_epsilon=1e-9, max_grad_norm=1.0, lr_scheduler_type="cosine", min_lr_ratio=0.01)
ARCHITECTURE_DEFAULTS = {
    "gptplus": _GPTPLUS,
    "ngpt": _NGPT,
    # The width rule: without exact norms, a matrix's first Adam steps (sign-like, low rank) grow its spectral
    # norm by ~lr·width while its rows stay in the unit ball, and ‖h‖ follows; μP's 1/width rate on matrices keeps
    # that step constant, so the rate tuned at d=128 holds at every width (training/optim.py; the evidence:
    # experiments/width_depth_stability/README.md).
    "angpt": {**_NGPT, "lr_width_rule": "inverse_width", "lr_base_width": 128},
}
# Models of other libraries (a plain Llama, ...) have no architecture of ours: they train with GPT+'s values.
FALLBACK_DEFAULTS = dict(_GPTPLUS)


def architecture_defaults_for(config) -> dict:
    """The optimiser keys for a model config: its architecture's (`ARCHITECTURE_DEFAULTS`), or FALLBACK_DEFAULTS
    for a config that is not this library's."""
    if getattr(config, "model_type", None) == "angpt":
        return dict(ARCHITECTURE_DEFAULTS[config.architecture])
    return dict(FALLBACK_DEFAULTS)


def _key(default=dataclasses.MISSING, help: str = "", *, factory=dataclasses.MISSING, section: str | None = None):
    """A recipe key: its default (or default `factory`) and its one-line meaning; `section` starts a group of keys
    in `angpt train --help`."""
    metadata = {"help": help} if section is None else {"help": help, "section": section}
    return field(default=default, default_factory=factory, metadata=metadata)


@dataclass
class Recipe:
    """The keys of a training run, each with its default and its meaning (`help`, listed by `angpt train --help`)."""

    model: str = _key("angpt-tiny", "preset name (configuration/presets/NAME.json) or a config JSON path",
                      section="model")
    architecture: str | None = _key(None, "overrides the preset's architecture: angpt | ngpt | gptplus")
    model_kwargs: dict = _key(help="any other AnGPTConfig field (attention variants, ...)", factory=dict)
    init_from: str | None = _key(None, "a training-form checkpoint to start from (folded ones are refused)")

    dataset: str = _key("shakespeare", '"shakespeare", local file(s)/dir, or a Hub dataset name', section="data")
    dataset_config: str | None = _key(None, "Hub configuration name")
    dataset_split: str = _key("train", "Hub split to read")
    text_column: str = _key("text", "column holding the text (JSON/CSV/parquet/Hub)")
    streaming: bool = _key(False, "stream a corpus read once: each process reads its part and tokenises it on the "
                                  "fly (for repeated runs, prepare it once: angpt prepare)")
    max_corpus_chars: int | None = _key(None, "use only the first N characters (quick runs, tests)")
    block_size: int = _key(256, "tokens per training sequence (<= the model's max_position_embeddings)")
    validation_fraction: float = _key(0.05, "share held out for validation: of the blocks of a corpus tokenised at "
                                            "start, of the documents of a stream or a prepared corpus")
    validation_blocks: int = _key(64, "streaming only: validation is the first N blocks of the held-out documents")
    stream_parts: int = _key(0, "streaming only: the parts the stream is split into, fixed at the run's first start "
                                "(0: its number of processes); it resumes on any number of processes dividing it")
    data_seed: int = _key(1234, "fixes the train/validation split independently of `seed`")
    tokenizer: str | None = _key(None, "HF tokenizer name/path; None trains a byte-level BPE")
    tokenizer_vocab_size: int = _key(8192, "vocabulary of the trained BPE (tokenizer: None)")
    tokenizer_split_digits: bool = _key(False,
                                        "trained BPE: every digit its own token, as Llama's and Qwen's tokenizers")
    data_cache_dir: str | None = _key(None, "where tokenizer + packed blocks are cached")
    dataset_kind: str = _key("blocks", "blocks: next-token loss on packed text; needle: needle-in-a-haystack "
                                       "examples over the corpus, loss on the answer tokens only")
    needle_examples: int = _key(10000, "needle: training examples (validation: validation_fraction of it)")

    output_dir: str = _key("runs/default", "the run's directory: checkpoints/, final/, metrics (one run each)",
                           section="transformers.TrainingArguments names")
    seed: int = _key(42, "initial weights and batch order")
    max_steps: int = _key(1000, "optimiser steps; may change on --resume")
    per_device_train_batch_size: int = _key(16, "sequences per process per micro-batch")
    per_device_eval_batch_size: int = _key(16, "sequences per process per validation batch")
    gradient_accumulation_steps: int = _key(1, "micro-batches per optimiser step")
    learning_rate: float = _key(1e-3, "peak learning rate")
    weight_decay: float | None = _key(None, "decoupled, matrices only (GPT+: 0.1, nGPT/anGPT: 0)")
    warmup_ratio: float | None = _key(None, "share of max_steps with linear warm-up (GPT+: 0.2, others: 0)")
    lr_scheduler_type: str | None = _key(None, "cosine | linear | constant")
    adam_beta1: float | None = _key(None, "Adam β1 (0.9)")
    adam_beta2: float | None = _key(None, "Adam β2 (0.95)")
    adam_epsilon: float | None = _key(None, "Adam ε (1e-9)")
    max_grad_norm: float | None = _key(None, "gradient clipping (1.0)")
    optim: str | None = _key(None, "adamw (Adam when weight_decay == 0)")
    bf16: bool = _key(False, "bfloat16 autocast (CPU and GPU)")
    gradient_checkpointing: bool = _key(False, "recompute activations in backward (less memory)")
    torch_compile: bool = _key(False, "compile each decoder block (regional: warm-up does not grow with depth)")
    torch_compile_mode: str | None = _key(None, "torch.compile mode: default | reduce-overhead | max-autotune | ...")
    logging_steps: int = _key(10, "log loss, learning rate, tokens/s, MFU every N steps")
    eval_steps: int = _key(100, "validation loss every N steps and at the end; 0 = never")
    save_steps: int = _key(500, "checkpoint every N steps (and at the end); 0 = only at the end")
    save_total_limit: int | None = _key(2, "keep the newest N checkpoints; None or 0 keeps all")
    async_checkpoint: bool = _key(False, "write checkpoints in the background (torch.distributed.checkpoint): "
                                         "training goes on during the write; at most one in flight; the final and "
                                         "the preemption checkpoints are written at once")
    preemption_signal: str | None = _key(None, "besides SIGTERM, a signal that stops the run with a checkpoint of the "
                                               "step reached (SLURM's --signal, e.g. SIGUSR1)")
    report_to: list = _key(help="jsonl (metrics.jsonl), none, all, or any of Accelerate's trackers: tensorboard, wandb, "
                                "mlflow, trackio, aim, swanlab, dvclive, comet_ml, clearml",
                           factory=lambda: ["tensorboard", "jsonl"])
    disable_tqdm: bool = _key(False, "no progress bar")
    dataloader_num_workers: int = _key(0, "DataLoader worker processes")

    min_lr_ratio: float | None = _key(None, "cosine floor as a fraction of the peak (the papers: 0.01)",
                                      section="not in TrainingArguments")
    # Capped by default, as a stream's validation_blocks is: uncapped, 5 % of a 10 GB corpus would be scored at every
    # eval_steps (docs/training.md, "Validation").
    eval_max_batches: int | None = _key(8, "validation averages the first N batches per process of the split's "
                                           "seeded random order (8 x 16 = 128 blocks at the defaults); null: the "
                                           "whole split, whatever its size")
    peak_flops: float | None = _key(None, "per device, for MFU; None = measured once per device and cached")
    lr_width_rule: str | None = _key(None, "none | inverse_width: matrices' lr × min(1, lr_base_width/hidden_size)")
    lr_base_width: int | None = _key(None, "the width learning_rate is tuned at (anGPT default 128)")

    # Keys the architecture may fill (ARCHITECTURE_DEFAULTS name -> recipe key).
    ARCHITECTURE_KEYS = {"optimizer": "optim", "weight_decay": "weight_decay", "warmup_ratio": "warmup_ratio",
                         "adam_beta1": "adam_beta1", "adam_beta2": "adam_beta2",
                         "adam_epsilon": "adam_epsilon", "max_grad_norm": "max_grad_norm",
                         "lr_scheduler_type": "lr_scheduler_type", "min_lr_ratio": "min_lr_ratio",
                         "lr_width_rule": "lr_width_rule", "lr_base_width": "lr_base_width"}

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        for name in ("max_steps", "per_device_train_batch_size", "per_device_eval_batch_size",
                     "gradient_accumulation_steps", "block_size", "logging_steps", "tokenizer_vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"recipe key {name}={getattr(self, name)!r} must be > 0")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"recipe key validation_fraction={self.validation_fraction!r} must be in (0, 1)")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):  # `nan <= 0` is False
            raise ValueError(f"recipe key learning_rate={self.learning_rate!r} must be a finite number > 0")
        if self.warmup_ratio is not None and not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"recipe key warmup_ratio={self.warmup_ratio!r} must be in [0, 1)")
        if self.tokenizer_split_digits and self.tokenizer:
            raise ValueError("recipe key tokenizer_split_digits applies to the BPE trained on the corpus; "
                             f"tokenizer={self.tokenizer!r} is used as it is (drop one of the two)")
        if self.dataset_kind not in ("blocks", "needle"):
            raise ValueError(f"recipe key dataset_kind={self.dataset_kind!r} is not valid; expected blocks or needle")
        if self.stream_parts < 0 or (self.stream_parts and not self.streaming):
            raise ValueError(f"recipe key stream_parts={self.stream_parts!r} must be >= 0, and is for streaming: true")
        if self.dataset_kind == "needle" and (self.streaming or self.needle_examples <= 0):
            raise ValueError("recipe key dataset_kind='needle' needs streaming: false and needle_examples > 0")
        if self.torch_compile_mode is not None and self.torch_compile_mode not in COMPILE_MODES:
            raise ValueError(f"recipe key torch_compile_mode={self.torch_compile_mode!r} must be one of "
                             f"{list(COMPILE_MODES)}")
        if self.lr_width_rule is not None and self.lr_width_rule not in ("none", "inverse_width"):
            raise ValueError(f"recipe key lr_width_rule={self.lr_width_rule!r} must be none or inverse_width")
        if self.lr_base_width is not None and self.lr_base_width <= 0:
            raise ValueError(f"recipe key lr_base_width={self.lr_base_width!r} must be > 0")
        if self.eval_max_batches is not None and self.eval_max_batches <= 0:
            raise ValueError(f"recipe key eval_max_batches={self.eval_max_batches!r} must be > 0, or null for the "
                             "whole validation split")
        unknown = unknown_entries(self.report_to)
        if unknown:
            raise ValueError(f"recipe key report_to has unknown entries {unknown}; expected jsonl, none, all or "
                             f"a tracker Accelerate supports: {', '.join(ACCELERATE_TRACKERS)}")

    def with_architecture_defaults(self, defaults: dict) -> "Recipe":
        """Return a copy where every optimiser key left unset takes the architecture's value."""
        filled = {}
        for default_key, recipe_key in self.ARCHITECTURE_KEYS.items():
            if getattr(self, recipe_key) is None and default_key in defaults:
                filled[recipe_key] = defaults[default_key]
        return dataclasses.replace(self, **filled)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _field_types() -> dict[str, object]:
    hints = typing.get_type_hints(Recipe)
    return {f.name: hints[f.name] for f in dataclasses.fields(Recipe)}


def _unknown_key_error(key: str, where: str) -> ValueError:
    names = list(_field_types())
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"unknown recipe key {key!r} in {where}{hint}")


def _coerce(key: str, value, annotation):
    """Coerce a YAML/CLI value to the field's declared type; a wrong type is an error naming the key."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        annotation = next(a for a in args if a is not type(None))
    base = typing.get_origin(annotation) or annotation
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif base is int and not isinstance(value, bool):
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return int(value)
    elif base is float and not isinstance(value, bool):
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif base is list:
        if isinstance(value, str):
            return [v for v in value.split(",") if v]
        if isinstance(value, list):
            return value
    elif base is dict and isinstance(value, dict):
        return value
    raise ValueError(f"recipe key {key}={value!r} has the wrong type; expected {getattr(base, '__name__', base)}")


def recipe_from_dict(values: dict, where: str = "recipe") -> Recipe:
    types_ = _field_types()
    kwargs = {}
    for key, value in values.items():
        if key not in types_:
            raise _unknown_key_error(key, where)
        kwargs[key] = _coerce(key, value, types_[key])
    return Recipe(**kwargs)


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """`key=value` strings; values parse as YAML (`bf16=true`, `report_to=[jsonl]`). A dotted key
    `model_kwargs.attention_sparsity=topk` sets one entry of a dict-valued key."""
    values = dict(values)
    types_ = _field_types()
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        value = yaml.safe_load(raw) if raw != "" else None
        top, _, sub = key.partition(".")
        if top not in types_:
            raise _unknown_key_error(top, "--override")
        if sub:
            if typing.get_origin(types_[top]) is not dict and types_[top] is not dict:
                raise ValueError(f"--override {key}: recipe key {top!r} is not a mapping")
            values[top] = {**(values.get(top) or {}), sub: value}
        else:
            values[key] = value
    return values


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe YAML (or start from defaults when `path` is None) and apply overrides."""
    values: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"recipe file not found: {path}")
        loaded = yaml.safe_load(path.read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"recipe {path} must be a YAML mapping of keys to values")
        values = loaded or {}
    return recipe_from_dict(apply_overrides(values, overrides or []),
                            where=str(path) if path else "recipe")
