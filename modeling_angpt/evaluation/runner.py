"""Evaluate a checkpoint: lm-eval tasks on the in-memory model, the project's own suites, one report.

    from modeling_angpt.evaluation import EvalOptions, evaluate
    report = evaluate("runs/demo/folded", EvalOptions(suite=["offline"], limit=50))
    report = evaluate("runs/demo/folded", suite="offline", limit=50)   # the same

`prepare` checks everything that can be checked without the model (the options, checkpoint files, task names,
data reachability, the output directory) and raises `EvalInputError` with a one-line message; `run` loads the
model once, runs `lm_eval.simple_evaluate` with an `HFLM` built on it and then the own suites, and returns the
report (a JSON-ready dict); `write_report` writes results.json and results.md without overwriting anything.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .inputs import EvalInputError, check_checkpoint_dir, default_output_dir, weights_digest
from .options import EvalOptions
from .report import write_report
from .selection import OWN_SUITE_MODULES, Selection, SelectionError, check_hub_datasets, select

LM_EVAL_DEFAULT_SEEDS = (0, 1234, 1234, 1234)   # lm-eval's random, numpy, torch, few-shot seeds
RESULT_FILES = ("results.json", "results.md")


@dataclass
class Plan:
    checkpoint: Path
    options: EvalOptions          # normalized (EvalOptions.normalized)
    selection: Selection
    output_dir: Path
    config: dict
    weights: dict
    hub_offline: str | None = None
    offline_data: dict | None = None
    own_suites: dict = field(default_factory=dict)   # suite -> run_suite callable


def _own_suite(suite: str):
    module_name = OWN_SUITE_MODULES[suite]
    module = sys.modules.get(module_name)
    if module is None:
        if importlib.util.find_spec(module_name) is None:
            raise EvalInputError(f"suite {suite}: {module_name} is not part of this installation")
        module = importlib.import_module(module_name)
    if not callable(getattr(module, "run_suite", None)):
        raise EvalInputError(f"suite {suite}: {module_name} has no run_suite function")
    return module


def prepare(checkpoint, options: EvalOptions) -> Plan:
    """Every check that needs no model; EvalInputError (one line) on bad input. Builds the offline task data
    (cached) when an offline task is selected, so an unreadable corpus is reported here."""
    if not isinstance(options, EvalOptions):
        raise TypeError(f"prepare: options must be an EvalOptions, not {type(options).__name__}")
    try:
        options = options.normalized()
        checkpoint = Path(checkpoint)
        if options.output_path:
            output_dir = Path(options.output_path)
            if output_dir.exists() and not output_dir.is_dir():
                raise EvalInputError(f"--output-path {output_dir}: exists and is not a directory")
            existing = [n for n in RESULT_FILES if (output_dir / n).exists()]
            if existing:
                raise EvalInputError(f"--output-path {output_dir}: {existing[0]} exists; results are never "
                                     "overwritten (choose another directory)")
        else:
            output_dir = default_output_dir(checkpoint)
        config = check_checkpoint_dir(checkpoint)
        selection = select(options.suite, options.tasks, options.include_path)
        hub_offline = check_hub_datasets(selection)
        own = {}
        for suite in selection.own_suites:
            module = _own_suite(suite)
            if callable(getattr(module, "preflight", None)):
                module.preflight(checkpoint, options)
            own[suite] = module.run_suite
        offline_data = None
        if selection.needs_offline_data:
            from .offline_data import task_files

            offline_data = task_files(options.corpus, options.data_seed)
        weights = weights_digest(checkpoint)
    except (SelectionError, FileNotFoundError, ValueError, NotADirectoryError, PermissionError) as error:
        raise EvalInputError(str(error).splitlines()[0] if str(error) else type(error).__name__) from None
    return Plan(checkpoint, options, selection, output_dir, config, weights, hub_offline, offline_data, own)


# ------------------------------------------------------------------------------------------- running

def load_model(checkpoint: Path, dtype: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from .. import register_auto_classes

    register_auto_classes()

    transformers_logging.disable_progress_bar()   # stderr stays for messages (a "Loading weights" bar per run)
    config_dtype = None
    if dtype == "auto":
        raw = json.loads((checkpoint / "config.json").read_text())
        config_dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    torch_dtype = getattr(torch, config_dtype or dtype)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return model, tokenizer


def _seeds(options) -> tuple[int, int, int, int]:
    return LM_EVAL_DEFAULT_SEEDS if options.seed is None else (options.seed,) * 4


def run_lm_eval(model, tokenizer, plan: Plan) -> dict:
    """lm_eval.simple_evaluate on the in-memory model (HFLM); lm-eval's result dict."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    options = plan.options
    metadata = {k: v for k, v in (("corpus", options.corpus), ("data_seed", options.data_seed)) if v is not None}
    metadata["pretrained"] = str(plan.checkpoint)   # what `lm_eval --model_args pretrained=DIR` passes on (angpt_needle)
    manager = TaskManager(include_path=plan.selection.include_paths, include_defaults=plan.selection.needs_defaults,
                          metadata=metadata)
    # Like `lm_eval --model hf`: max_length from config.max_position_embeddings, right-padded loglikelihood
    # batches, left-padded generation, the tokenizer's pad token (or EOS).
    lm = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=options.batch_size,
              max_batch_size=64, max_length=_context_for(plan, model.config))
    random_seed, numpy_seed, torch_seed, fewshot_seed = _seeds(options)
    return simple_evaluate(model=lm, tasks=plan.selection.lm_eval_tasks, num_fewshot=options.num_fewshot,
                           limit=options.limit, bootstrap_iters=options.bootstrap_iters,
                           log_samples=options.log_samples, task_manager=manager, random_seed=random_seed,
                           numpy_random_seed=numpy_seed, torch_random_seed=torch_seed,
                           fewshot_random_seed=fewshot_seed)


def _context_for(plan: Plan, config) -> int:
    """HFLM's max_length: config.max_position_embeddings, as `lm_eval --model hf` uses, except that angpt_needle
    tasks need 16x the training length plus the answer (rotary positions have no table to run out of, and
    lm-eval would cut the needles off the left of a longer prompt)."""
    context = config.max_position_embeddings
    if any(task.startswith("angpt_needle") for task in plan.selection.lm_eval_tasks):
        from ..tasks.needle import MAX_NEW_TOKENS
        from .long_context import training_length

        try:
            context = max(context, 16 * training_length(plan.checkpoint, None) + MAX_NEW_TOKENS)
        except ValueError:  # no training_metadata.json: the task itself says what it needs
            pass
    return context


def _metrics_of(task_results: dict) -> dict[str, float]:
    """lm-eval's {"acc,none": v, "acc_stderr,none": s, "alias": ...} -> {"acc": v, "acc_stderr": s}."""
    metrics = {}
    for key, value in task_results.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key == "sample_len":
            continue
        metric, _, filter_name = key.partition(",")
        metrics[metric if filter_name in ("", "none") else f"{metric} [{filter_name}]"] = value
    return metrics


def _versions() -> dict:
    versions = {}
    for package in ("angpt", "torch", "transformers", "lm_eval", "datasets", "tokenizers", "safetensors"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    versions["python"] = platform.python_version()
    return versions


def run(plan: Plan, staging_dir: Path) -> dict:
    """Load the model, run lm-eval and the own suites (artifacts into staging_dir); the report."""
    options = plan.options
    started = time.time()
    model, tokenizer = load_model(plan.checkpoint, options.dtype, options.device)
    report: dict = {
        "format": "angpt-eval/1",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": {"path": str(plan.checkpoint.resolve()), "weights_sha256": plan.weights["sha256"],
                       "weight_files": plan.weights["files"]},
        "model_config": plan.config,
        "versions": _versions(),
        "device": options.device,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "options": dataclasses.asdict(options),
        "seeds": dict(zip(("random", "numpy", "torch", "fewshot"), _seeds(options)),
                      offline_data=(plan.offline_data or {}).get("seed")),
        "results": {},
    }
    training_metadata = plan.checkpoint / "training_metadata.json"
    if training_metadata.is_file():
        meta = json.loads(training_metadata.read_text())
        report["training"] = {k: meta.get(k) for k in ("dataset", "steps", "tokens_seen", "final_val_loss",
                                                       "architecture")}
    if plan.hub_offline:
        report["hub"] = f"offline ({plan.hub_offline}): Hub datasets read from the local cache"
    if plan.offline_data:
        report["offline_data"] = plan.offline_data
    if plan.selection.lm_eval_tasks:
        results = run_lm_eval(model, tokenizer, plan)
        samples = results.pop("samples", None)
        for task, values in results.get("results", {}).items():
            metrics = _metrics_of(values)
            if metrics:
                report["results"][task] = metrics
        report["lm_eval"] = {k: v for k, v in results.items() if k != "results"}
        report["lm_eval"]["results"] = results.get("results", {})
        if samples is not None:
            report["samples"] = samples
    for suite, run_suite in plan.own_suites.items():
        suite_results = run_suite(model, tokenizer, plan.checkpoint, options, staging_dir)
        if not isinstance(suite_results, dict):
            raise TypeError(f"suite {suite}: run_suite returned {type(suite_results).__name__}, not a dict")
        for task, metrics in suite_results.items():
            report["results"][task] = {k: v if isinstance(v, int) else float(v) for k, v in metrics.items()}
        report.setdefault("suites", {})[suite] = sorted(suite_results)
    report["seconds"] = round(time.time() - started, 1)
    return report


def staging_dir_for(output_dir: Path) -> Path:
    parent = output_dir.parent if output_dir.parent != Path("") else Path(".")
    return parent / f".{output_dir.name}.partial-{os.getpid()}"


def execute(plan: Plan, write: bool = True) -> dict:
    """Run a prepared evaluation; with write=True, results.json/results.md (and the suites' artifacts) end up
    in plan.output_dir and report["files"] names results.json. A failed run leaves nothing behind."""
    staging = staging_dir_for(plan.output_dir)
    staging.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir()
    try:
        report = run(plan, staging)
        report["argv"] = list(sys.argv)
        if write:
            report["files"] = str(write_report(report, staging, plan.output_dir))
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
        _remove_empty_parents(staging.parent)
    return report


def evaluate(checkpoint, options: EvalOptions | None = None, *, write: bool = False, **keywords) -> dict:
    """Python entry point: prepare and run (writing the result files with write=True); returns the report. The
    options are an EvalOptions or its fields as keywords (`evaluate(path, suite="length", lengths=[1, 4])`), or
    an EvalOptions with some fields replaced by keywords."""
    options = dataclasses.replace(options, **keywords) if options is not None else EvalOptions(**keywords)
    return execute(prepare(checkpoint, options), write)


def _remove_empty_parents(directory: Path, stop: Path = Path("eval_results")) -> None:
    """Remove eval_results/<name>/ left empty by a failed run (only directories this code creates)."""
    directory = directory.resolve()
    stop = stop.resolve()
    while directory != stop.parent and (directory == stop or stop in directory.parents):
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def quiet_lm_eval_logging() -> None:
    """lm-eval logs every step at INFO; keep its warnings (e.g. truncated contexts) and errors."""
    logging.getLogger("lm_eval").setLevel(logging.WARNING)

    class _DropModelInstanceWarning(logging.Filter):
        def filter(self, record):
            return "model kwarg is not of type `str`" not in record.getMessage()

    logging.getLogger("lm_eval.models.huggingface").addFilter(_DropModelInstanceWarning())
