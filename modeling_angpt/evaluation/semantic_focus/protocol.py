"""The semantic-focus paper's training protocol on any attention configuration (docs/evaluation.md, "Semantic-focus
tasks"; the reproduction: experiments/semantic_focus/README.md).

Model: a bidirectional `AnGPTForSequenceClassification` (`is_causal=False`, mean pooling over real tokens),
5 blocks (ListOps 10), d = 64, MLP 64, 1 head. Optimiser: plain SGD (no momentum, no weight decay), batch 25,
gradient-norm clipping at 0.5, lr 0.1 with StepLR γ = 0.9995 per epoch (ListOps: lr 1.0, γ 0.99), the paper's
epoch budget per task (`tasks.py`). After every epoch the whole training set and the held-out set are evaluated
in eval mode (no dropout), as the paper's plots do; "epochs to 95 %" is the first epoch whose training accuracy
is ≥ 95 % (the paper's convergence criterion).

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
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ...training.run_lock import holding_output_dir
from .baselines import split_baselines
from .tasks import build_splits, get_task
from .tokenizer import build_tokenizer

METRICS = "metrics.jsonl"
CONVERGED = 0.95


class OutputExistsError(FileExistsError):
    pass


# Written after every epoch so that a stopped run, or a finished one given a larger budget, continues exactly where
# it stood: weights, optimiser, schedule, data order and dropout RNG, and the history so far.
RESUME = "resume.pt"
# Settings a resumed run may change: the budget, the early stop and where it runs. Everything else (task, data,
# model, optimiser) must match the run it continues, or it would be another run.
RESUMABLE = ("epochs", "stop_at_train_acc", "device")


def _save_state(out: Path, history: list[dict], model, optimizer, scheduler, shuffle: torch.Generator) -> None:
    state = {"history": history, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "shuffle": shuffle.get_state(), "rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    torch.save(state, out / f"{RESUME}.tmp")
    os.replace(out / f"{RESUME}.tmp", out / RESUME)  # a run killed mid-save keeps its previous state


def _saved_state(out: Path, settings: dict) -> dict:
    """The state a run in `out` saved, after checking that it was trained with `settings` (RESUMABLE aside). On
    the CPU: the random states must be CPU tensors, and load_state_dict moves weights to the model's device."""
    if not (out / RESUME).is_file() or not (out / "run.json").is_file():
        raise OutputExistsError(f"{out} holds results but no {RESUME} to resume from; choose another output "
                                "directory")
    _check_settings(out, settings)
    return torch.load(out / RESUME, map_location="cpu", weights_only=True)


def _check_settings(out: Path, settings: dict) -> None:
    saved = json.loads((out / "run.json").read_text())
    wanted = json.loads(json.dumps(settings, default=str))
    differ = [f"{key} {saved.get(key)!r} there, {value!r} here" for key, value in wanted.items()
              if key not in RESUMABLE and saved.get(key) != value]
    if differ:
        raise OutputExistsError(f"{out} holds a run with other settings ({'; '.join(differ)}); resume it with its "
                                "own settings or choose another output directory")


def _killed_before_first_save(out: Path) -> bool:
    """A run stopped between logging its first epoch and saving the state after it: at most that one line in
    metrics.jsonl, no resume.pt, no summary.json. Resuming it is starting it again (the line is rewritten). More
    lines without a resume.pt are another matter (the state was removed), and _saved_state refuses them."""
    if (out / RESUME).exists() or (out / "summary.json").exists() or not (out / METRICS).is_file():
        return False
    return len((out / METRICS).read_text().splitlines()) <= 1


def model_config(task: str, *, architecture: str = "gptplus", qk_norm: bool = False, hidden_size: int = 64,
                 intermediate_size: int | None = None, num_layers: int | None = None, num_heads: int = 1,
                 dropout: float = 0.01, attention_sparsity: str = "none", attention_topk: int = 5,
                 attention_window: int = 5, attention_block_size: int = 5, attention_global_tokens: int = 0,
                 rope_type: str = "default", partial_rotary_factor: float | None = None,
                 attn_implementation: str = "eager", max_position_embeddings: int | None = None):
    """The paper's model (module docstring) as an AnGPTConfig for `task`'s vocabulary and classes."""
    from ... import AnGPTConfig

    spec = get_task(task)
    tokenizer = build_tokenizer(task)
    if intermediate_size is None:  # the paper's MLP 64; anGPT/nGPT's ν constants assume 4d
        intermediate_size = hidden_size if architecture == "gptplus" else 4 * hidden_size
    rope = {"rope_type": rope_type}
    if partial_rotary_factor is not None:
        rope["partial_rotary_factor"] = partial_rotary_factor
    config = AnGPTConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers or spec.num_layers, num_attention_heads=num_heads,
        max_position_embeddings=max_position_embeddings or spec.length, architecture=architecture, qk_norm=qk_norm,
        rope_parameters=rope, attention_sparsity=attention_sparsity, attention_topk=attention_topk,
        attention_window=attention_window, attention_block_size=attention_block_size,
        attention_global_tokens=attention_global_tokens, attention_dropout=dropout, is_causal=False,
        classifier_pooling="mean", num_labels=spec.num_classes, pad_token_id=tokenizer.pad_token_id,
        id2label=dict(enumerate(spec.labels())), label2id={n: i for i, n in enumerate(spec.labels())})
    config._attn_implementation = attn_implementation
    return config


BACKBONES = ("library", "paper")
LIBRARY_ONLY = ("architecture", "qk_norm", "rope_type", "partial_rotary_factor", "attn_implementation")


def paper_config(task: str, *, max_position_embeddings: int | None = None, num_layers: int | None = None,
                 **fields):
    """The paper's encoder (paper_encoder.py) for `task`'s vocabulary and classes; `fields` as PaperEncoderConfig."""
    from .paper_encoder import PaperEncoderConfig

    spec = get_task(task)
    return PaperEncoderConfig(vocab_size=len(build_tokenizer(task)), num_labels=spec.num_classes,
                              max_position_embeddings=max_position_embeddings or spec.length,
                              num_layers=num_layers or spec.num_layers, **fields)


def paper_width(longest: int, model_kwargs: dict) -> int:
    """The paper pads every sequence to the longest one, rounded up to a multiple of the mask size for sparse
    variants (full attention: no rounding)."""
    sparsity = model_kwargs.get("attention_sparsity", "none")
    size = {"topk": model_kwargs.get("attention_topk", 5), "window": model_kwargs.get("attention_window", 5),
            "block": model_kwargs.get("attention_block_size", 5)}.get(sparsity, 1)
    return -(-longest // size) * size


def as_tensors(split, pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [n, width or longest] right-padded, lengths [n], labels [n]) of a split, built once per run."""
    rows = list(split["input_ids"])
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    width = width if width is not None else int(lengths.max()) if rows else 0
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, :len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, lengths, torch.tensor(list(split["label"]), dtype=torch.long)


def _batches(data, batch_size: int, device, order: torch.Tensor | None = None, full_width: bool = False):
    """(input_ids, attention_mask, labels) batches, cut to the longest sequence of the batch (`full_width`: kept
    at the tensor's width, for the paper's encoder, which pools PAD)."""
    ids, lengths, labels = data
    order = torch.arange(len(labels)) if order is None else order
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        width = ids.shape[1] if full_width else int(lengths[index].max())
        mask = torch.arange(width)[None] < lengths[index, None]
        yield ids[index, :width].to(device), mask.to(device), labels[index].to(device)


@torch.no_grad()
def evaluate(model, data, batch_size: int, device, full_width: bool = False) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over a whole split (`as_tensors`), in eval mode."""
    model.eval()
    total_loss, correct = 0.0, 0
    for ids, mask, labels in _batches(data, batch_size, device, full_width=full_width):
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
    model.train()
    count = max(len(data[2]), 1)
    return total_loss / count, correct / count


def epochs_to(history: list[dict], threshold: float = CONVERGED, key: str = "train_acc") -> int | None:
    """First epoch whose `key` is ≥ threshold (None if never)."""
    return next((row["epoch"] for row in history if row[key] >= threshold), None)


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


@holding_output_dir
def run_protocol(task: str, output_dir: str | os.PathLike | None, *, seed: int = 0, epochs: int | None = None,
                 n_train: int = 5000, n_heldout: int = 2000, batch_size: int = 25, lr: float | None = None,
                 gamma: float | None = None, grad_clip: float | None = 0.5, eval_batch_size: int = 250,
                 device: str = "cpu", stop_at_train_acc: float | None = None, task_kwargs: dict | None = None,
                 tensorboard: bool = True, save_model: bool = True, plot_every: int = 10, log=print,
                 backbone: str = "library", resume: bool = False, deadline: float | None = None,
                 **model_kwargs) -> dict:
    """Train the paper's model on one task with one attention configuration; return the summary.

    Writes to `output_dir` (refuses one that already holds results, unless `resume`): `run.json` (every setting,
    versions), `metrics.jsonl` (one line per epoch: lr, running training loss, train and held-out loss and
    accuracy, seconds), `resume.pt` (the state after the last epoch), `tensorboard/`, `curves.png`,
    `summary.json`, and `model/` (weights, config and the task's tokenizer). `resume=True` continues the run in
    `output_dir` from its `resume.pt`, a stopped one or a finished one given more `epochs`, and gives the
    history an uninterrupted run would have; it refuses a run trained with other settings (`RESUMABLE` aside)
    and starts afresh when the directory holds no results, or only a first epoch logged before its state was
    saved. `output_dir=None` keeps everything in memory. `model_kwargs` go to `model_config` (attention settings,
    architecture, ...). `stop_at_train_acc` ends the run early once training accuracy reaches it. `deadline` (a
    `time.time()` value) ends it early, after the last epoch that its predecessor's duration says would finish
    before then, and marks the summary `stopped_at_deadline`; its saved state lets a later call with `resume`
    continue it (to fit a run into a lease of machine time).
    `backbone="paper"`: the paper's encoder (paper_encoder.py; `model_kwargs` as PaperEncoderConfig's fields),
    saved as `model/config.json` + `model/model.pt` (not a transformers model). An `output_dir` that another live
    process is writing is refused (training/run_lock.py)."""
    from ... import AnGPTForSequenceClassification
    from .paper_encoder import PaperEncoderForSequenceClassification

    if backbone not in BACKBONES:
        raise ValueError(f"backbone={backbone!r}: one of {BACKBONES}")
    paper = backbone == "paper"
    if paper and (unused := sorted(set(model_kwargs) & set(LIBRARY_ONLY))):
        raise ValueError(f"backbone='paper' has no {', '.join(unused)} (library-backbone settings)")
    spec = get_task(task)
    epochs = spec.epochs if epochs is None else epochs
    lr = spec.lr if lr is None else lr
    gamma = spec.gamma if gamma is None else gamma
    out = None if output_dir is None else Path(output_dir)
    settings = dict(task=task, backbone=backbone, seed=seed, epochs=epochs, n_train=n_train, n_heldout=n_heldout,
                    batch_size=batch_size, lr=lr, gamma=gamma, grad_clip=grad_clip, device=device,
                    stop_at_train_acc=stop_at_train_acc, task_kwargs=task_kwargs or {}, model=model_kwargs)
    state, restarted = None, False
    if out is not None:
        if (out / METRICS).exists() or (out / "summary.json").exists():
            if not resume:
                raise OutputExistsError(f"{out} already holds results ({METRICS}); resume it or choose another "
                                        "output directory")
            restarted = _killed_before_first_save(out)
            if restarted and (out / "run.json").is_file():
                _check_settings(out, settings)  # the same run started again, not another one in its place
            state = None if restarted else _saved_state(out, settings)
            if state is not None and len(state["history"]) > epochs:
                raise OutputExistsError(f"{out} holds a run of {len(state['history'])} epochs, more than epochs="
                                        f"{epochs}; resume it with at least that budget")
        out.mkdir(parents=True, exist_ok=True)

    splits = build_splits(task, seed=seed, n_train=n_train, n_heldout=n_heldout, **(task_kwargs or {}))
    tokenizer = build_tokenizer(task)
    baselines = split_baselines(splits)
    log(f"[{task}] held-out baselines: majority class {baselines['majority_class']['heldout_acc']:.3f}, one position "
        f"({baselines['one_position']['position']}) {baselines['one_position']['heldout_acc']:.3f}")
    longest = max([len(row) for name in ("train", "heldout") for row in splits[name]["input_ids"]], default=1)
    tokenizer.model_max_length = max(tokenizer.model_max_length, longest)  # length generalisation: up to 500
    width = paper_width(longest, model_kwargs) if paper else None
    train_data, heldout_data = (as_tensors(splits[name], tokenizer.pad_token_id, width)
                                for name in ("train", "heldout"))
    torch.manual_seed(seed)
    if paper:
        config = paper_config(task, **{"max_position_embeddings": width, **model_kwargs})
        model = PaperEncoderForSequenceClassification(config).to(device).train()
    else:
        config = model_config(task, **{"max_position_embeddings": max(longest, 1), **model_kwargs})
        model = AnGPTForSequenceClassification(config).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=gamma)
    shuffle = torch.Generator().manual_seed(seed)
    history: list[dict] = []
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        shuffle.set_state(state["shuffle"])
        torch.set_rng_state(state["rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        history = state["history"]
    if state is not None or restarted:
        # epochs logged after the last saved state (a run killed between the two writes) are trained again
        (out / METRICS).write_text("".join(json.dumps(row) + "\n" for row in history))
    title = (f"{task}: {config.architecture}, sparsity={config.attention_sparsity}"
             + {"topk": f" k={config.attention_topk}", "window": f" w={config.attention_window}",
                "block": f" m={config.attention_block_size}"}.get(config.attention_sparsity, "") + f", seed {seed}")

    writer = None
    if out is not None:
        (out / "run.json").write_text(json.dumps({**settings, "environment": _environment(), "model_config":
                                                  config.to_dict() if paper else config.to_diff_dict()},
                                                 indent=1, default=str))
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = len(history) + 1 if history or restarted else None  # drop the epochs trained again
            writer = SummaryWriter(str(out / "tensorboard"), purge_step=purge)
    stopped = bool(history) and stop_at_train_acc is not None and history[-1]["train_acc"] >= stop_at_train_acc
    stopped_at_deadline = False
    for epoch in range(len(history) + 1, 0 if stopped else epochs + 1):
        started = time.perf_counter()
        order = torch.randperm(n_train, generator=shuffle)
        running, steps = 0.0, 0
        current_lr = optimizer.param_groups[0]["lr"]
        for ids, mask, labels in _batches(train_data, batch_size, device, order, full_width=paper):
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            loss = F.cross_entropy(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            # nGPT/anGPT projections (docs/architectures.md); nothing for GPT+ or the paper's encoder
            model.apply_weight_constraints()
            running, steps = running + loss.item(), steps + 1
        scheduler.step()
        if not math.isfinite(running):
            raise FloatingPointError(f"{task}: training loss is not finite at epoch {epoch} (lr {current_lr:g})")
        train_loss, train_acc = evaluate(model, train_data, eval_batch_size, device, paper)
        heldout_loss, heldout_acc = (evaluate(model, heldout_data, eval_batch_size, device, paper)
                                     if n_heldout else (float("nan"), float("nan")))
        row = dict(epoch=epoch, lr=current_lr, train_loss_running=running / max(steps, 1), train_loss=train_loss,
                   train_acc=train_acc, heldout_loss=heldout_loss, heldout_acc=heldout_acc,
                   seconds=round(time.perf_counter() - started, 3))
        history.append(row)
        log(f"[{task} {config.attention_sparsity} seed {seed}] epoch {epoch}/{epochs}: train acc {train_acc:.3f} "
            f"(loss {train_loss:.4f}), held-out acc {heldout_acc:.3f}, {row['seconds']:.1f}s")
        if out is not None:
            with open(out / METRICS, "a") as handle:
                handle.write(json.dumps(row) + "\n")
            if writer is not None:
                for key in ("lr", "train_loss_running", "train_loss", "train_acc", "heldout_loss", "heldout_acc"):
                    writer.add_scalar(key.replace("_", "/", 1) if key != "lr" else "lr", row[key], epoch)
            if plot_every and epoch % plot_every == 0:
                plot_curves(history, out / "curves.png", title)
            _save_state(out, history, model, optimizer, scheduler, shuffle)
        if stop_at_train_acc is not None and train_acc >= stop_at_train_acc:
            break
        if deadline is not None and epoch < epochs and time.time() + row["seconds"] > deadline:
            stopped_at_deadline = True  # the next epoch would likely end past the deadline
            break

    summary = dict(task=task, backbone=backbone, seed=seed, attention_sparsity=config.attention_sparsity,
                   architecture=config.architecture, epochs_run=len(history), epochs_budget=epochs,
                   epochs_to_95=epochs_to(history), final=history[-1] if history else None,
                   best_heldout_acc=max((r["heldout_acc"] for r in history), default=None), baselines=baselines,
                   stopped_at_deadline=stopped_at_deadline, history=history)
    if out is not None:
        if writer is not None:
            writer.close()
        plot_curves(history, out / "curves.png", title)
        (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=1))
        if save_model:
            model.save_pretrained(out / "model")
            tokenizer.save_pretrained(out / "model")
    return summary


__all__ = ["run_protocol", "model_config", "paper_config", "BACKBONES", "evaluate", "epochs_to", "plot_curves",
           "OutputExistsError"]
