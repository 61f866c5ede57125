"""The semantic-focus paper's training protocol on any attention configuration (docs/evaluation.md, "Semantic-focus
tasks"; the reproduction: experiments/semantic_focus/README.md).

Model: a bidirectional `AnGPTForSequenceClassification` (`is_causal=False`, mean pooling over real tokens), 5 blocks
(ListOps 10), d = 64, MLP 64, 1 head. Optimiser: plain SGD (no momentum, no weight decay), batch 25, gradient-norm
clipping at 0.5, lr 0.1 with StepLR γ = 0.9995 per epoch (ListOps: lr 1.0, γ 0.99), the paper's epoch budget per
task (`task_definitions.py`). After every epoch the whole training set and the held-out set are evaluated in eval
mode (no dropout), as the paper's plots do; "epochs to 95 %" is the first epoch whose training accuracy is ≥ 95 %
(the paper's convergence criterion).

Where this model differs from the paper's (a plain pre-LayerNorm encoder with biases, ReLU MLP, sinusoidal
absolute positions, dropout 0.01 on embeddings, attention probabilities, MLP and residual branches):
- architecture: `gptplus` by default with QK-norm **off** (pre-RMSNorm, SwiGLU MLP, no biases): the closest of
  the three to the paper's model; `angpt`/`ngpt` are options (their ν constants need an MLP of 4d, so MLP 64
  applies to `gptplus` only).
- positions: RoPE (`rope_type`, default `default` with the config's partial rotary factor) instead of additive
  sinusoids; `rope_type="none"` makes the model permutation invariant (Even Pairs becomes unlearnable).
- dropout: the model has dropout on the attention probabilities only (`attention_dropout`, 0.01 here), none on
  embeddings, MLP or residual branches.
- padding (ListOps): padded keys are masked and padding is not pooled (the paper attends to and pools PAD).

`backbone="paper"` trains the paper's own encoder instead (paper_encoder.py: sinusoidal positions, non-affine
LayerNorm, ReLU MLP with biases, PyTorch default init, dropout 0.01 everywhere, PAD attended and pooled) with the
library's sparse attention; every batch is padded to one width, the longest sequence rounded up to a multiple of
the mask size for sparse variants, as the paper pads.

A run reads as four steps: prepare the run directory (refuse, resume or start it), build (splits, tokenizer,
classifier, optimiser), one epoch at a time (train, evaluate, log, save the state), finish (summary, curves, model).
The directory is held with training's lock and logged with training's metrics logger (training/run_dir.py `hold`,
training/metrics.py `MetricsLogger`), so both refuse a directory a live process writes and keep one metrics.jsonl
format.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ...training.metrics import MetricsLogger
from ...training.run_dir import differences, hold
from .baselines import split_baselines
from .classifier import BACKBONES, LIBRARY_ONLY, as_tensors, batches, build_classifier, evaluate, paper_width
from .task_definitions import build_splits, get_task
from .tokenizer import build_tokenizer

METRICS = "metrics.jsonl"
RUN_FILE = "run.json"          # every setting and the versions: what a resumed run is checked against
SUMMARY = "summary.json"
CONVERGED = 0.95
# TensorBoard tags of the per-epoch values (as earlier runs wrote them, so a resumed run continues their curves)
TENSORBOARD_TAGS = {"lr": "lr", "train_loss_running": "train/loss_running", "train_loss": "train/loss",
                    "train_acc": "train/acc", "heldout_loss": "heldout/loss", "heldout_acc": "heldout/acc"}


class OutputExistsError(FileExistsError):
    pass


# Written after every epoch so that a stopped run, or a finished one given a larger budget, continues exactly where
# it stood: weights, optimiser, schedule, data order and dropout RNG, and the history so far.
RESUME = "resume.pt"
# Settings a resumed run may change: the budget, the early stop and where it runs. Everything else (task, data,
# model, optimiser) must match the run it continues, or it would be another run.
RESUMABLE = ("epochs", "stop_at_train_acc", "device")


@dataclass
class ProtocolSettings:
    """One run of the protocol: a task, an attention configuration (`model`), the paper's training settings.

    `epochs`, `lr` and `gamma` left None take the paper's values for the task (task_definitions.py). `output_dir`
    receives `run.json` (every setting, versions), `metrics.jsonl` (one line per epoch: lr, running training loss,
    train and held-out loss and accuracy, seconds), `resume.pt` (the state after the last epoch), `tensorboard/`,
    `curves.png`, `summary.json` and `model/` (weights, config and the task's tokenizer; the paper's encoder as
    `model/config.json` + `model/model.pt`); None keeps everything in memory. A directory that already holds
    results is refused unless `resume`, which continues it from its `resume.pt` (a stopped run, or a finished one
    given more `epochs`) to the history an uninterrupted run would have; it refuses a run trained with other
    settings (`RESUMABLE` aside) and starts afresh when the directory holds no results, or only a first epoch
    logged before its state was saved. `stop_at_train_acc` ends the run once training accuracy reaches it;
    `deadline` (a `time.time()` value) ends it after the last epoch that its predecessor's duration says would
    finish before then, its state saved for a later `resume` (to fit a run into a lease of machine time)."""

    task: str
    output_dir: str | os.PathLike | None = None
    model: dict = field(default_factory=dict)  # model_config's fields (library), PaperEncoderConfig's (paper)
    backbone: str = "library"                  # BACKBONES: the library's classifier or the paper's encoder
    task_kwargs: dict = field(default_factory=dict)  # build_splits' length settings
    seed: int = 0
    epochs: int | None = None
    n_train: int = 5000
    n_heldout: int = 2000
    batch_size: int = 25
    lr: float | None = None
    gamma: float | None = None                 # StepLR factor per epoch
    grad_clip: float | None = 0.5
    eval_batch_size: int = 250
    device: str = "cpu"
    stop_at_train_acc: float | None = None
    deadline: float | None = None
    resume: bool = False
    tensorboard: bool = True
    save_model: bool = True
    plot_every: int = 10                       # curves.png every N epochs (and at the end); 0: at the end only

    def resolved(self) -> "ProtocolSettings":
        """These settings checked, with the task's own epochs, lr and gamma where they are None."""
        if self.backbone not in BACKBONES:
            raise ValueError(f"backbone={self.backbone!r}: one of {BACKBONES}")
        if self.backbone == "paper" and (unused := sorted(set(self.model) & set(LIBRARY_ONLY))):
            raise ValueError(f"backbone='paper' has no {', '.join(unused)} (library-backbone settings)")
        spec = get_task(self.task)
        return dataclasses.replace(self, epochs=spec.epochs if self.epochs is None else self.epochs,
                                   lr=spec.lr if self.lr is None else self.lr,
                                   gamma=spec.gamma if self.gamma is None else self.gamma)

    def recorded(self) -> dict:
        """The settings run.json records and a resumed run is checked against (the same keys since the first runs)."""
        return dict(task=self.task, backbone=self.backbone, seed=self.seed, epochs=self.epochs, n_train=self.n_train,
                    n_heldout=self.n_heldout, batch_size=self.batch_size, lr=self.lr, gamma=self.gamma,
                    grad_clip=self.grad_clip, device=self.device, stop_at_train_acc=self.stop_at_train_acc,
                    task_kwargs=self.task_kwargs, model=self.model)


@dataclass
class ProtocolRun:
    """What a run holds once built."""
    model: torch.nn.Module
    config: object
    tokenizer: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    shuffle: torch.Generator   # the training order's generator (its state is saved with the run's)
    train_data: tuple
    heldout_data: tuple
    baselines: dict
    paper: bool                # the paper's encoder: batches keep the padded width (it pools PAD)


def run_protocol(settings: ProtocolSettings, log=print) -> dict:
    """Train the paper's model on one task with one attention configuration (`settings`); return the summary.
    `log` receives one line per epoch. An `output_dir` that another live process is writing is refused
    (training/run_dir.py, `hold`)."""
    settings = settings.resolved()
    out = None if settings.output_dir is None else Path(settings.output_dir)
    with contextlib.nullcontext() if out is None else hold(out):
        state, restarted = prepare_run_dir(out, settings)
        run = build(settings, log)
        history = restore(run, state)
        logger = open_log(out, settings, run, resumed=state is not None or restarted, history=history)
        try:
            stopped_at_deadline = train_epochs(run, settings, history, logger, out, log)
        finally:
            logger.close()
        return finish(run, settings, history, stopped_at_deadline, out)


def prepare_run_dir(out: Path | None, settings: ProtocolSettings) -> tuple[dict | None, bool]:
    """(the saved state to continue, or None; whether a run killed before its first save starts again), after
    refusing a directory that holds results this run may not continue."""
    if out is None or not ((out / METRICS).exists() or (out / SUMMARY).exists()):
        return None, False
    if not settings.resume:
        raise OutputExistsError(f"{out} already holds results ({METRICS}); resume it or choose another output "
                                "directory")
    if _killed_before_first_save(out):
        if (out / RUN_FILE).is_file():
            _check_settings(out, settings)  # the same run started again, not another one in its place
        return None, True
    if not (out / RESUME).is_file() or not (out / RUN_FILE).is_file():
        raise OutputExistsError(f"{out} holds results but no {RESUME} to resume from; choose another output "
                                "directory")
    _check_settings(out, settings)
    # On the CPU: the random states must be CPU tensors, and load_state_dict moves weights to the model's device.
    state = torch.load(out / RESUME, map_location="cpu", weights_only=True)
    if len(state["history"]) > settings.epochs:
        raise OutputExistsError(f"{out} holds a run of {len(state['history'])} epochs, more than epochs="
                                f"{settings.epochs}; resume it with at least that budget")
    return state, False


def _check_settings(out: Path, settings: ProtocolSettings) -> None:
    saved, wanted = json.loads((out / RUN_FILE).read_text()), settings.recorded()
    differ = differences({key: saved.get(key) for key in wanted}, wanted, lambda key: key in RESUMABLE)
    if differ:
        raise OutputExistsError(f"{out} holds a run with other settings ({'; '.join(differ)}); resume it with its "
                                "own settings or choose another output directory")


def _killed_before_first_save(out: Path) -> bool:
    """A run stopped between logging its first epoch and saving the state after it: at most that one line in
    metrics.jsonl, no resume.pt, no summary.json. Resuming it is starting it again (the line is rewritten). More
    lines without a resume.pt are another matter (the state was removed), and prepare_run_dir refuses them."""
    if (out / RESUME).exists() or (out / SUMMARY).exists() or not (out / METRICS).is_file():
        return False
    return len((out / METRICS).read_text().splitlines()) <= 1


def build(settings: ProtocolSettings, log) -> ProtocolRun:
    """The task's splits and tokenizer, the classifier (seeded), SGD and its StepLR schedule, the shuffle."""
    splits = build_splits(settings.task, seed=settings.seed, n_train=settings.n_train, n_heldout=settings.n_heldout,
                          **settings.task_kwargs)
    tokenizer = build_tokenizer(get_task(settings.task))
    baselines = split_baselines(splits)
    log(f"[{settings.task}] held-out baselines: majority class {baselines['majority_class']['heldout_acc']:.3f}, one "
        f"position ({baselines['one_position']['position']}) {baselines['one_position']['heldout_acc']:.3f}")
    longest = max([len(row) for name in ("train", "heldout") for row in splits[name]["input_ids"]], default=1)
    tokenizer.model_max_length = max(tokenizer.model_max_length, longest)  # length generalisation: up to 500
    paper = settings.backbone == "paper"
    width = paper_width(longest, settings.model) if paper else None
    train_data, heldout_data = (as_tensors(splits[name], tokenizer.pad_token_id, width)
                                for name in ("train", "heldout"))
    torch.manual_seed(settings.seed)
    model, config = build_classifier(settings.task, settings.backbone, settings.model, longest, width,
                                     settings.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=settings.gamma)
    return ProtocolRun(model, config, tokenizer, optimizer, scheduler, torch.Generator().manual_seed(settings.seed),
                       train_data, heldout_data, baselines, paper)


def restore(run: ProtocolRun, state: dict | None) -> list[dict]:
    """The history so far, after restoring the saved state into `run` (a fresh run: nothing, and no history)."""
    if state is None:
        return []
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.shuffle.set_state(state["shuffle"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["history"]


def _save_state(out: Path, history: list[dict], run: ProtocolRun) -> None:
    state = {"history": history, "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
             "scheduler": run.scheduler.state_dict(), "shuffle": run.shuffle.get_state(), "rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    torch.save(state, out / f"{RESUME}.tmp")
    os.replace(out / f"{RESUME}.tmp", out / RESUME)  # a run killed mid-save keeps its previous state


def open_log(out: Path | None, settings: ProtocolSettings, run: ProtocolRun, resumed: bool,
             history: list[dict]) -> MetricsLogger:
    """run.json written, and the metrics logger: a resumed run keeps the epochs of its saved state and drops those
    logged after it (they are trained again)."""
    if out is None:
        return MetricsLogger(Path(), [], enabled=False)
    model_config = run.config.to_dict() if run.paper else run.config.to_diff_dict()
    (out / RUN_FILE).write_text(json.dumps({**settings.recorded(), "environment": _environment(),
                                            "model_config": model_config}, indent=1, default=str))
    return MetricsLogger(out, ["jsonl", "tensorboard"] if settings.tensorboard else ["jsonl"], enabled=True,
                         resume_step=len(history) if resumed else None, step_key="epoch",
                         tracker_tags=TENSORBOARD_TAGS)


def train_epochs(run: ProtocolRun, settings: ProtocolSettings, history: list[dict], logger: MetricsLogger,
                 out: Path | None, log) -> bool:
    """Epochs from the first one not in `history` to the budget, each logged and its state saved; stops early at
    `stop_at_train_acc` or before the `deadline`. True when it stopped for the deadline."""
    stop = settings.stop_at_train_acc
    if history and stop is not None and history[-1]["train_acc"] >= stop:
        return False
    for epoch in range(len(history) + 1, settings.epochs + 1):
        row = one_epoch(run, settings, epoch)
        history.append(row)
        log(f"[{settings.task} {run.config.attention_sparsity} seed {settings.seed}] epoch {epoch}/{settings.epochs}: "
            f"train acc {row['train_acc']:.3f} (loss {row['train_loss']:.4f}), held-out acc "
            f"{row['heldout_acc']:.3f}, {row['seconds']:.1f}s")
        logger.log(epoch, **{key: value for key, value in row.items() if key != "epoch"})
        if out is not None:
            if settings.plot_every and epoch % settings.plot_every == 0:
                plot_curves(history, out / "curves.png", _title(run, settings))
            _save_state(out, history, run)
        if stop is not None and row["train_acc"] >= stop:
            return False
        deadline = settings.deadline
        if deadline is not None and epoch < settings.epochs and time.time() + row["seconds"] > deadline:
            return True  # the next epoch would likely end past the deadline
    return False


def one_epoch(run: ProtocolRun, settings: ProtocolSettings, epoch: int) -> dict:
    """One pass over the training set in a fresh order (plain SGD, clipped, the weight constraint after each step),
    then both splits evaluated in eval mode: the epoch's row of metrics.jsonl."""
    started = time.perf_counter()
    order = torch.randperm(settings.n_train, generator=run.shuffle)
    running, steps = 0.0, 0
    current_lr = run.optimizer.param_groups[0]["lr"]
    for ids, mask, labels in batches(run.train_data, settings.batch_size, settings.device, order, run.paper):
        logits = run.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        loss = F.cross_entropy(logits.float(), labels)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if settings.grad_clip:
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), settings.grad_clip)
        run.optimizer.step()
        # nGPT/anGPT projections (docs/architectures.md); nothing for GPT+ or the paper's encoder
        run.model.apply_weight_constraints()
        running, steps = running + loss.item(), steps + 1
    run.scheduler.step()
    if not math.isfinite(running):
        raise FloatingPointError(f"{settings.task}: training loss is not finite at epoch {epoch} (lr {current_lr:g})")
    train_loss, train_acc = evaluate(run.model, run.train_data, settings.eval_batch_size, settings.device, run.paper)
    heldout_loss, heldout_acc = (evaluate(run.model, run.heldout_data, settings.eval_batch_size, settings.device,
                                          run.paper) if settings.n_heldout else (float("nan"), float("nan")))
    return dict(epoch=epoch, lr=current_lr, train_loss_running=running / max(steps, 1), train_loss=train_loss,
                train_acc=train_acc, heldout_loss=heldout_loss, heldout_acc=heldout_acc,
                seconds=round(time.perf_counter() - started, 3))


def finish(run: ProtocolRun, settings: ProtocolSettings, history: list[dict], stopped_at_deadline: bool,
           out: Path | None) -> dict:
    """The summary; in `out`: the curves, summary.json and (`save_model`) the model with the task's tokenizer."""
    config = run.config
    summary = dict(task=settings.task, backbone=settings.backbone, seed=settings.seed,
                   attention_sparsity=config.attention_sparsity, architecture=config.architecture,
                   epochs_run=len(history), epochs_budget=settings.epochs, epochs_to_95=epochs_to(history),
                   final=history[-1] if history else None,
                   best_heldout_acc=max((r["heldout_acc"] for r in history), default=None),
                   baselines=run.baselines, stopped_at_deadline=stopped_at_deadline, history=history)
    if out is not None:
        plot_curves(history, out / "curves.png", _title(run, settings))
        (out / SUMMARY).write_text(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=1))
        if settings.save_model:
            run.model.save_pretrained(out / "model")
            run.tokenizer.save_pretrained(out / "model")
    return summary


def epochs_to(history: list[dict], threshold: float = CONVERGED, key: str = "train_acc") -> int | None:
    """First epoch whose `key` is ≥ threshold (None if never)."""
    return next((row["epoch"] for row in history if row[key] >= threshold), None)


def _title(run: ProtocolRun, settings: ProtocolSettings) -> str:
    config = run.config
    size = {"topk": f" k={config.attention_topk}", "window": f" w={config.attention_window}",
            "block": f" m={config.attention_block_size}"}.get(config.attention_sparsity, "")
    return (f"{settings.task}: {config.architecture}, sparsity={config.attention_sparsity}{size}, "
            f"seed {settings.seed}")


def plot_curves(history: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [row["epoch"] for row in history]
    figure, (acc_axis, loss_axis) = plt.subplots(1, 2, figsize=(9, 3.6))
    for split in ("train", "heldout"):
        acc_axis.plot(epochs, [row[f"{split}_acc"] for row in history], marker=".", label=split)
        loss_axis.plot(epochs, [row[f"{split}_loss"] for row in history], marker=".", label=split)
    acc_axis.axhline(CONVERGED, color="grey", lw=0.6, ls="--")
    acc_axis.set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1.02))
    loss_axis.set(xlabel="epoch", ylabel="cross-entropy")
    acc_axis.legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _environment() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "threads": torch.get_num_threads()}


__all__ = ["ProtocolSettings", "run_protocol", "OutputExistsError", "epochs_to", "plot_curves"]
