"""The training loop over accelerate: one CPU, DDP or FSDP, the same code (docs/training.md).

`train(recipe)` validates everything cheap first (recipe, data files, model config), then builds data,
model, optimiser and schedule, runs, checkpoints, and saves OUTPUT_DIR/final. Gradient accumulation is
written out with `no_sync` rather than `Accelerator.accumulate`: accumulate forces a sync at every
epoch end and keeps its own micro-step counter, and both would make a resumed run drift from an
uninterrupted one. The weight constraint follows every optimiser step on every rank (docs/architectures.md;
FSDP2 shards: distributed.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..export.hub import save_pretrained
from . import checkpoints, run_dir
from ..data.sources import resolve_corpus
from ..data.build import build_datasets
from ..data.loader import batch_stream, data_epoch, loader_state, make_train_loader, scored_validation_blocks
from .distributed import check_launch_environment, group_peak_flops, make_accelerator
from .metrics import MetricsLogger, device_peak_flops, plot_loss_curve, training_flops_per_token
from .model_setup import (apply_constraints, architecture_defaults, blow_up_knobs, build_config, build_model,
                          compile_blocks)
from .norm_health import NormProbe
from .preemption import Preempted, announce, stop_on_signals
from .resume import check_stream_parts, geometry, launched_processes, load_checkpoint, stream_parts
from .optim import build_optimizer, build_scheduler
from .rank_watch import resume_command, watch_ranks
from .recipe import Recipe
from .trackers import check_installed, finish_trackers, start_trackers


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/inf; the run stopped and the last good checkpoint is untouched. `step` is the
    optimiser step whose loss or gradient norm was not finite (benchmarks report where a run diverged)."""

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


@dataclass
class TrainResult:
    output_dir: Path
    final_dir: Path | None
    start_step: int
    step: int
    losses: list = field(default_factory=list)       # one per optimiser step, from step 1
    val_losses: list = field(default_factory=list)   # [step, loss] pairs
    tokens_seen: int = 0
    model: object = None                             # the unwrapped model (for callers and tests)
    accelerator: object = None


def enable_activation_checkpointing(model) -> None:
    """Recompute each decoder layer in backward (non-reentrant: works with no_sync and DDP). transformers
    5.23 renamed gradient_checkpointing_enable to activation_checkpointing_enable; older versions lack it."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@torch.no_grad()
def evaluate(accelerator, model, val_loader, max_batches: int | None) -> float:
    """Mean per-token loss over the validation blocks, averaged over every rank's samples exactly once."""
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for i, batch in enumerate(val_loader):
        if max_batches is not None and i >= max_batches:
            break
        ids = batch["input_ids"]
        labels = batch.get("labels", ids)[:, 1:]  # -100 marks positions without loss (needle prompts, padding)
        logits = model(input_ids=ids).logits
        per_token = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels, reduction="none")
        per_sample = per_token.sum(dim=1) / (labels != -100).sum(dim=1).clamp(min=1)
        per_sample = accelerator.gather_for_metrics(per_sample)
        total += per_sample.double().sum().cpu()
        count += per_sample.numel()
    model.train()
    return float(total / max(count, 1))


def check_finite(what: str, value: float, step: int, output_dir: Path, run: "Run | None" = None) -> None:
    if not math.isfinite(value):
        last = checkpoints.latest_checkpoint(output_dir)
        knobs = blow_up_knobs(run.raw_model, run.optimizer) if run is not None else ""  # what to turn
        raise NonFiniteLossError(
            f"non-finite {what} ({value}) at step {step}{' with ' + knobs if knobs else ''}; stopped without saving. "
            "Last good checkpoint: "
            f"{last if last else 'none (no checkpoint was saved yet)'}", step)


def accumulate_gradients(accelerator, model, batches, recipe: Recipe, stop=False) -> tuple[torch.Tensor, bool]:
    """Forward/backward over the micro-batches of one optimiser step; gradients are all-reduced only on
    the last one. Returns the loss averaged over micro-batches and ranks (the same value on every rank), and
    whether any rank's `stop` flag was set: it travels in the same reduction (preemption.py)."""
    ga = recipe.gradient_accumulation_steps
    losses = []
    for i, batch in enumerate(batches):
        sync = i == ga - 1
        with contextlib.nullcontext() if sync else accelerator.no_sync(model):
            ids = batch["input_ids"]
            loss = model(input_ids=ids, labels=batch.get("labels", ids)).loss
            accelerator.backward(loss / ga)
        losses.append(loss.detach())
    mean = torch.stack(losses).float().mean()
    reduced = accelerator.reduce(torch.stack([mean, mean.new_tensor(1.0 if stop else 0.0)]), reduction="mean")
    return reduced[0], bool(reduced[1] > 0)


@dataclass
class Run:
    """Everything a run holds once built (prepared by accelerate)."""
    recipe: Recipe
    accelerator: object
    tokenizer: object
    model: object
    raw_model: object
    optimizer: object
    scheduler: object
    train_dl: object
    val_dl: object
    data_info: dict
    stream: object = None  # the batch iterator (batch_stream), set when the loop starts
    stop: object = False   # preemption.StopFlag: set by a signal, read at every step boundary
    checkpointer: object = None  # async_checkpoint.AsyncCheckpointer when the recipe asks for async_checkpoint


def preflight(recipe: Recipe, resume: bool | str, overwrite: bool = False):
    """Everything that can be checked cheaply, before any data or model work (so bad inputs fail fast);
    the output directory's rules are in run_dir.py (runs never mix)."""
    check_launch_environment()
    check_installed(recipe.report_to)
    if recipe.async_checkpoint:
        from .async_checkpoint import check_supported

        check_supported()
    corpus = resolve_corpus(recipe)  # the data path's first stage: a bad dataset fails before any change
    config = build_config(recipe)
    resume_from = run_dir.prepare_output_dir(recipe, config, resume, overwrite)
    if recipe.streaming and not resume_from:  # a resumed stream was checked against its checkpoint
        check_stream_parts(stream_parts(recipe, launched_processes(), []), geometry(recipe, launched_processes()))
    return corpus, config, resume_from


def build_run(recipe: Recipe, corpus, config, candidates: list[Path] = ()) -> Run:
    """`candidates`: the checkpoints the run resumes from (a stream keeps the split into parts they record)."""
    from accelerate.utils import set_seed

    accelerator = make_accelerator(recipe)
    set_seed(recipe.seed)  # before the model: the initial weights are a function of the seed
    tokenizer, train_ds, val_ds, data_info = build_datasets(
        recipe, corpus, accelerator.main_process_first, accelerator.process_index, accelerator.num_processes,
        stream_parts(recipe, accelerator.num_processes, candidates))
    model = build_model(recipe, config, tokenizer)
    recipe = recipe.with_architecture_defaults(architecture_defaults(model))
    if recipe.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.config.use_cache = False  # no KV cache while training
    if recipe.torch_compile:
        compile_blocks(model, recipe.torch_compile_mode)
    optimizer = build_optimizer(model, recipe)
    scheduler = build_scheduler(optimizer, recipe)
    train_dl = make_train_loader(recipe, accelerator, train_ds)  # this process's slice of each global batch
    val_dl = torch.utils.data.DataLoader(val_ds, batch_size=recipe.per_device_eval_batch_size)
    model, optimizer, val_dl, scheduler = accelerator.prepare(model, optimizer, val_dl, scheduler)
    return Run(recipe, accelerator, tokenizer, model, accelerator.unwrap_model(model), optimizer, scheduler,
                train_dl, val_dl, data_info)


def _optimizer_step(run: Run, step: int) -> tuple[float, float, float, bool]:
    """One optimiser step: gradients, finiteness check, clip, step, constraint, schedule.
    Returns (loss, grad norm, learning rate used, whether a rank was signalled to stop after it)."""
    recipe, acc = run.recipe, run.accelerator
    micro = [next(run.stream) for _ in range(recipe.gradient_accumulation_steps)]
    loss, stop = accumulate_gradients(acc, run.model, micro, recipe, bool(run.stop))
    loss = float(loss)
    check_finite("training loss", loss, step, Path(recipe.output_dir), run)  # before the step: no bad update
    grad_norm = float(acc.clip_grad_norm_(run.model.parameters(), recipe.max_grad_norm))
    check_finite("gradient norm", grad_norm, step, Path(recipe.output_dir), run)
    lr = run.scheduler.get_last_lr()[0]
    run.optimizer.step()
    apply_constraints(run.raw_model)  # after the accelerate-wrapped step, on every rank
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm, lr, stop


def train(recipe: Recipe, resume: bool | str = False, stop_after_steps: int | None = None,
          overwrite: bool = False) -> TrainResult:
    """Train as the recipe says. `resume` continues from the newest complete checkpoint in output_dir (refused if
    that run's recipe or model config differs), `resume="auto"` does so when there is one and starts the run
    otherwise; `overwrite` first deletes a previous run there; without either the output_dir must be empty
    (run_dir.py). A directory another live process is training in is refused whatever the flags (run_dir.hold).
    SIGTERM, or the recipe's `preemption_signal`, ends the run at the next step with a checkpoint of that step and
    raises `Preempted` (preemption.py). `stop_after_steps` ends the run after that step's checkpoint logic without
    the final save, exactly as a job killed there would (preemption drills and the resume test)."""
    with run_dir.hold(recipe.output_dir, enabled=run_dir.is_main_rank()), \
            stop_on_signals(recipe.preemption_signal) as stop:
        return _train(recipe, resume, stop_after_steps, overwrite, stop)


def _train(recipe: Recipe, resume: bool | str, stop_after_steps: int | None, overwrite: bool, stop) -> TrainResult:
    corpus, config, candidates = preflight(recipe, resume, overwrite)
    model_config = run_dir.comparable_config(config)
    run = build_run(recipe, corpus, config, candidates)
    run.stop = stop
    with watch_ranks(run.accelerator, recipe.output_dir):  # a lost rank stops the run in one line (rank_watch.py)
        return _train_built(run, model_config, candidates, stop_after_steps)


def _resume(run: Run, candidates: list[Path]) -> dict:
    """The state of the newest checkpoint that loads (checkpoints.load_newest), in this launch's batch geometry."""
    acc = run.accelerator
    path, state = checkpoints.load_newest(
        acc, candidates, lambda a, p: load_checkpoint(a, p, geometry(run.recipe, a.num_processes), run.model,
                                                      run.optimizer, run.scheduler))
    if run.recipe.streaming:  # every part's position, whichever process saved it (data/streaming.py)
        from ..data.streaming import saved_stream_state

        run.train_dl.load_state_dict(saved_stream_state(checkpoints.data_state_files(path)))
    acc.print(f"resumed from {path} at step {state['step']}")
    return state


def _train_built(run: Run, model_config, candidates: list[Path], stop_after_steps: int | None) -> TrainResult:
    recipe, acc, output_dir = run.recipe, run.accelerator, Path(run.recipe.output_dir)
    resume_from = _resume(run, candidates) if candidates else None
    state = resume_from or {"step": 0, "batches": 0, "tokens": 0, "losses": [], "val_losses": [],
                            **geometry(recipe, acc.num_processes)}
    if "stream_parts" in run.data_info:
        state["stream_parts"] = run.data_info["stream_parts"]
    start_step = state["step"]
    resume_step = start_step if resume_from is not None else None
    start_trackers(acc, recipe, output_dir, resume_step)  # first: a tracker that cannot start leaves no run behind
    if acc.is_main_process:
        run_dir.record_run(output_dir, recipe, model_config)
    logger = MetricsLogger(output_dir, recipe.report_to, acc.is_main_process, resume_step=resume_step, log=acc.log)
    if recipe.async_checkpoint:
        from .async_checkpoint import AsyncCheckpointer

        run.checkpointer = AsyncCheckpointer()  # its own gloo groups: every rank makes it here
    try:
        _loop(run, state, logger, fresh=resume_from is None, stop_after_steps=stop_after_steps)
    finally:
        if run.checkpointer is not None:
            run.checkpointer.close()  # the save in flight is written and committed first
        logger.close()
        finish_trackers(acc)
    result = TrainResult(output_dir, None, start_step, state["step"], state["losses"], state["val_losses"],
                         state["tokens"], run.raw_model, acc)
    if state["step"] < recipe.max_steps:  # stopped early on purpose
        return result
    result.final_dir = save_final(acc, run.model, run.tokenizer, recipe, state, run.data_info)
    if acc.is_main_process:
        config = run.raw_model.config
        plot_loss_curve(output_dir / "metrics.jsonl", output_dir / "loss_curve.png",
                        title=f"{getattr(config, 'architecture', config.model_type)} on {run.data_info['dataset']}")
    return result


def _loop(run: Run, state: dict, logger: MetricsLogger, fresh: bool, stop_after_steps: int | None) -> None:
    from tqdm.auto import tqdm

    recipe, acc, output_dir = run.recipe, run.accelerator, Path(run.recipe.output_dir)
    tokens_per_step = (recipe.per_device_train_batch_size * recipe.block_size
                       * recipe.gradient_accumulation_steps * acc.num_processes)
    flops_per_token = training_flops_per_token(run.raw_model, recipe.block_size)
    peak = group_peak_flops(acc, device_peak_flops(acc.device, recipe.peak_flops,
                                                    torch.bfloat16 if acc.mixed_precision == "bf16"
                                                    else torch.float32),
                            bool(recipe.peak_flops))

    def run_eval(step: int) -> None:
        with NormProbe(run.raw_model) as probe:  # the norms the ν constants assume (norm_health.py)
            val = evaluate(acc, run.model, run.val_dl, recipe.eval_max_batches)
        state["val_losses"].append([step, val])
        logger.log(step, val_loss=val, tokens=state["tokens"], **probe.summary(acc))

    if fresh and recipe.eval_steps > 0:
        run_eval(0)  # the untrained baseline, so every curve starts at the same point
    run.stream = batch_stream(acc, run.train_dl, state["batches"])
    bar = tqdm(total=recipe.max_steps, initial=state["step"], desc="train", unit="step", dynamic_ncols=True,
               disable=recipe.disable_tqdm or not acc.is_local_main_process)
    window_start, window_steps = time.perf_counter(), 0
    run.model.train()
    with bar:
        while state["step"] < recipe.max_steps:
            step = state["step"] + 1
            loss, grad_norm, lr, stop = _optimizer_step(run, step)
            if run.checkpointer is not None:
                run.checkpointer.poll()  # commits a background save every rank has finished
            state.update(step=step, batches=state["batches"] + recipe.gradient_accumulation_steps,
                         tokens=state["tokens"] + tokens_per_step)
            state["losses"].append(loss)
            window_steps += 1
            bar.update(1)
            if step % recipe.logging_steps == 0 or step == recipe.max_steps:
                tps = window_steps * tokens_per_step / max(time.perf_counter() - window_start, 1e-9)
                mfu = tps * flops_per_token / peak
                logger.log(step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=state["tokens"],
                           tokens_per_s=tps, mfu=mfu)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:.0f}", mfu=f"{mfu:.1%}")
                window_start, window_steps = time.perf_counter(), 0
            if recipe.eval_steps > 0 and (step % recipe.eval_steps == 0 or step == recipe.max_steps):
                run_eval(step)
            if (recipe.save_steps > 0 and step % recipe.save_steps == 0) or step == recipe.max_steps or stop:
                saved = _save(run, state, at_once=stop or step == recipe.max_steps)
            if stop:  # every rank learnt it in this step's loss reduction (preemption.py)
                name = run.stop.signal_name or "a signal to another rank"
                announce(acc, step, name, saved, resume_command())
                raise Preempted(step, name, saved)
            if stop_after_steps is not None and step >= stop_after_steps:
                return


def _save(run: Run, state: dict, at_once: bool) -> Path:
    """The checkpoint of the step reached (checkpoints.py): in the background with async_checkpoint, except
    `at_once` (the final and the preemption checkpoints, which the run's end must not outlive). The RNG states
    themselves are in save_state's random_states_<rank>.pkl."""
    recipe, output_dir = run.recipe, Path(run.recipe.output_dir)
    state["rng"] = {"seed": recipe.seed, "data_seed": recipe.data_seed,
                    "sampler_epoch": data_epoch(run.train_dl, state["batches"])}
    if run.checkpointer is not None and not at_once:
        return checkpoints.start_async_checkpoint(run.accelerator, run.checkpointer, run.model, run.optimizer,
                                                  run.scheduler, output_dir, dict(state), recipe.save_total_limit,
                                                  loader_state(run.train_dl))
    if run.checkpointer is not None:
        run.checkpointer.wait()  # the one in flight is committed before this one
    return checkpoints.save_checkpoint(run.accelerator, output_dir, state, recipe.save_total_limit,
                                       loader_state(run.train_dl))


def save_final(accelerator, model, tokenizer, recipe: Recipe, state: dict, data_info: dict) -> Path:
    """OUTPUT_DIR/final: safetensors weights + config + tokenizer + training_metadata.json, written to a
    temp dir and renamed, so AutoModelForCausalLM/AutoTokenizer.from_pretrained(final) always works."""
    final = Path(recipe.output_dir) / "final"
    tmp = final.with_name(".tmp_final")
    raw = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)  # gathers FSDP shards; every rank must call it
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        raw.config.use_cache = True
        val = state["val_losses"][-1][1] if state["val_losses"] else None
        card_info = {"datasets": [data_info["dataset"]], "train_tokens": state["tokens"], "val_loss": val,
                     "repo_id": final.name}  # the card names the directory it ends up in, not the temp dir
        save_pretrained(raw, tmp, card_info=card_info, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        metadata = {"dataset": data_info["dataset"], "tokens_seen": state["tokens"], "steps": state["step"],
                    "final_val_loss": val, "final_train_loss": state["losses"][-1] if state["losses"] else None,
                    "architecture": getattr(raw.config, "architecture", raw.config.model_type),
                    "num_parameters": sum(p.numel() for p in raw.parameters()),
                    "num_processes": accelerator.num_processes, "data": data_info, "recipe": recipe.to_dict(),
                    "val_sequences": scored_validation_blocks(  # the subset final_val_loss averages
                        recipe, data_info.get("val_blocks", recipe.validation_blocks), accelerator.num_processes)}
        (tmp / "training_metadata.json").write_text(json.dumps(metadata, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()
    return final
