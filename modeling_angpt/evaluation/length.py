"""Length generalisation (the scale-invariant paper's Table 1 protocol; docs/evaluation.md): the validation loss of one
checkpoint at several multiples of its training length, overall and per position bucket, and a PNG of loss
against position.

Every multiple is evaluated on the same held-out tokens: the first k·M·L tokens (M the largest multiple, L the
training length, k windows) are cut into windows of m·L tokens for each multiple m, so the figures differ only in
how much context each token sees. Bucket b of a window holds the predictions of target positions [b·L, (b+1)·L):
bucket 0 is what training saw, the later ones are extrapolation. With 1× among the multiples, each token's loss is
also compared with its own loss in its 1× window (`position_excess`): the text's difficulty cancels, and what is
left at a position is what the longer context did to that token. In its 1× window a token saw only the tokens
since that window began (0 to L − 1 of them), so even a model that looks back exactly L tokens comes out below
zero; above zero, the context past L costs more than it gives. Averaged over all positions (bucket 0 counting as
zero) it comes to nearly the overall growth from 1× to m×: only the tokens that open a 1× window, predicted in the
long window alone, are missing. The forward runs on the chunked eager attention
(long_context.memory_bounded_attention) and the logits are computed a slice of positions at a time, so neither a
T×T score tensor per head nor a T×V logit tensor exists at 16× (or 64k).
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .long_context import (batch_size_of, held_out_blocks, limit_count, memory_bounded_attention, query_chunk_for,
                           suite_lengths)
from .options import EvalOptions

DEFAULT_MULTIPLES = (1, 2, 4, 8, 16)
LOGIT_BUDGET = 2 ** 24  # elements of one slice of logits [b, positions, V]


@torch.no_grad()
def per_token_losses(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy at every position: [b, T] ids -> [b, T-1] float32 losses (entry j predicts token
    j+1). Logits are formed LOGIT_BUDGET elements at a time from the final hidden states."""
    hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state  # [b, T, d]
    batch, length = input_ids.shape
    step = max(1, LOGIT_BUDGET // (batch * model.config.vocab_size))
    losses = []
    for start in range(0, length - 1, step):
        stop = min(start + step, length - 1)
        logits = model.output_logits(hidden[:, start:stop]).float()  # [b, s, V]
        losses.append(F.cross_entropy(logits.transpose(1, 2), input_ids[:, start + 1:stop + 1], reduction="none"))
    return torch.cat(losses, dim=1)


@dataclass
class LengthReport:
    train_length: int
    windows: dict = field(default_factory=dict)        # multiple -> number of windows evaluated
    position_loss: dict = field(default_factory=dict)  # multiple -> [m·L − 1] mean loss per target position
    # multiple > 1 -> [m·L − 1] mean of (loss here − the same token's loss in its 1× window); NaN at target
    # positions that start a 1× window (no prediction there) and at bucket 0, whose context is the 1× window's
    position_excess: dict = field(default_factory=dict)
    source: str = ""

    def loss(self, multiple: int) -> float:
        """Mean over every predicted token (each window weighs the same; windows have equal length)."""
        return float(self.position_loss[multiple].mean())

    def bucket_losses(self, multiple: int) -> list[float]:
        """Mean loss per bucket of L target positions (position p predicts token p+1; bucket 0 starts at p=0)."""
        losses = self.position_loss[multiple]
        return [float(losses[b * self.train_length - (b > 0): (b + 1) * self.train_length - 1].mean())
                for b in range(multiple)]

    def metrics(self) -> dict[str, dict[str, float]]:
        table = {}
        for multiple in sorted(self.position_loss):
            loss = self.loss(multiple)
            row = {"loss": loss, "perplexity": math.exp(min(loss, 700.0)),
                   "tokens": float(multiple * self.train_length), "windows": float(self.windows[multiple])}
            row.update({f"loss_{b}x-{b + 1}x": v for b, v in enumerate(self.bucket_losses(multiple))})
            table[f"length_x{multiple}"] = row
        return table


def length_generalisation(model, ids, train_length: int, multiples=DEFAULT_MULTIPLES, *, windows: int | None = None,
                          batch_size: int = 1, query_chunk_size: int | None = None, tokenizer=None,
                          source: str = "") -> LengthReport:
    """Validation loss of `model` at each multiple of `train_length` on the token stream `ids` (1-D ids, an
    [n, L] array of blocks, or text with `tokenizer`). `windows` caps the number of longest windows."""
    if isinstance(ids, str):
        if tokenizer is None:
            raise ValueError("length_generalisation: text needs a tokenizer")
        ids = tokenizer(ids, add_special_tokens=False)["input_ids"]
    stream = torch.as_tensor(np.asarray(ids), dtype=torch.long).reshape(-1)
    multiples = sorted(set(int(m) for m in multiples))
    longest = multiples[-1] * train_length
    available = stream.numel() // longest
    if available == 0:
        raise ValueError(f"held-out text{f' ({source})' if source else ''} has {stream.numel()} tokens, fewer than "
                         f"the {longest} of one window at {multiples[-1]} × {train_length}")
    count = available if windows is None else max(1, min(int(windows), available))
    stream = stream[: count * longest].to(model.device)
    report = LengthReport(train_length, source=source)
    model.eval()
    for multiple in multiples:
        length = multiple * train_length
        sequences = stream.view(-1, length)
        chunk = query_chunk_for(model.config, batch_size, length, query_chunk_size)
        with memory_bounded_attention(model, chunk):
            losses = torch.cat([per_token_losses(model, sequences[start:start + batch_size]).double().cpu()
                                for start in range(0, len(sequences), batch_size)])  # [windows, m·L − 1]
        report.windows[multiple] = len(sequences)
        report.position_loss[multiple] = losses.mean(0).numpy()
        if multiple == 1:
            single = losses
        elif 1 in multiples:
            report.position_excess[multiple] = excess_over_single(losses, single, train_length, multiple)
    return report


def excess_over_single(losses: torch.Tensor, single: torch.Tensor, train_length: int, multiple: int) -> np.ndarray:
    """Mean over windows of each token's loss in its m·L window minus its loss in its 1× window. Window w of m·L
    tokens is 1× windows w·m … w·m + m − 1, so laying those side by side, each preceded by a NaN for its first
    token (predicted in neither), lines the two up; bucket 0 sees the same context both ways and is NaN too."""
    padded = torch.cat([torch.full((len(single), 1), float("nan"), dtype=single.dtype), single], dim=1)
    reference = padded.reshape(-1, multiple * train_length)[:, 1:]  # one row per m·L window, as `losses`
    excess = (losses - reference).mean(0)
    excess[:train_length - 1] = float("nan")
    return excess.numpy()


def binned_curve(losses, train_length: int, bins_per_octave: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres, mean loss per bin) of a per-position curve (entry j: target position j + 1) in bins at least
    L/8 wide and growing geometrically (`bins_per_octave` per doubling), so few windows still draw a readable curve
    on a log axis; centres are the geometric middle of each bin's first and last position. NaN entries are left
    out of their bin's mean (a bin of NaN only is NaN: a gap in the plotted line)."""
    losses = np.asarray(losses, dtype=np.float64)
    edges = [1]
    while edges[-1] < len(losses) + 1:
        grown = max(edges[-1] + max(1, train_length // 8), round(edges[-1] * 2 ** (1 / bins_per_octave)))
        edges.append(min(len(losses) + 1, grown))
    edges = np.array(edges)
    return np.sqrt(edges[:-1] * (edges[1:] - 1)), bin_means(losses, edges)


def bin_means(losses, edges) -> np.ndarray:
    """Mean of a per-position curve (entry j: target position j + 1) over the target positions [a, b) of each pair
    of consecutive `edges` (the first ≥ 1), NaN entries left out (a bin of NaN only is NaN)."""
    losses = np.asarray(losses, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of a bin of NaN only
        return np.array([np.nanmean(losses[a - 1:b - 1]) for a, b in zip(edges[:-1], edges[1:])])


def plot_loss_vs_position(report: LengthReport, path: Path, title: str = "", bins_per_octave: int = 4) -> Path:
    """Loss against target position (log x), one curve per multiple, in the bins of `binned_curve`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for multiple in sorted(report.position_loss):
        centres, means = binned_curve(report.position_loss[multiple], report.train_length, bins_per_octave)
        ax.plot(centres, means, marker=".", label=f"{multiple}× ({multiple * report.train_length} tokens)")
    ax.axvline(report.train_length, color="grey", linestyle="--", linewidth=1, label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the window (tokens)")
    ax.set_ylabel("validation loss (binned)")
    ax.set_title(title or f"loss against position, trained at {report.train_length} tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_table(report: LengthReport) -> str:
    multiples = sorted(report.position_loss)
    buckets = multiples[-1]
    header = "| length | tokens | windows | loss | perplexity | " + " | ".join(f"{b}-{b + 1}×" for b in range(buckets))
    lines = [header + " |", "|" + "---|" * (5 + buckets)]
    for multiple in multiples:
        values = report.bucket_losses(multiple) + [None] * (buckets - multiple)
        cells = " | ".join("" if v is None else f"{v:.4f}" for v in values)
        loss = report.loss(multiple)
        lines.append(f"| {multiple}× | {multiple * report.train_length} | {report.windows[multiple]} | {loss:.4f} | "
                     f"{math.exp(min(loss, 700.0)):.2f} | {cells} |")
    return "\n".join(lines) + "\n"


def write_artifacts(report: LengthReport, output_dir: Path, title: str = "") -> dict[str, Path]:
    """length.json (overall, per bucket, per position), length.md (the table) and length.png."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    data = {"train_length": report.train_length, "source": report.source, "metrics": report.metrics(),
            "buckets": {f"x{m}": report.bucket_losses(m) for m in sorted(report.position_loss)},
            "position_loss": {f"x{m}": [round(float(v), 5) for v in report.position_loss[m]]
                              for m in sorted(report.position_loss)},
            "position_excess": {f"x{m}": [None if math.isnan(v) else round(float(v), 5) for v in excess]
                                for m, excess in sorted(report.position_excess.items())}}
    paths = {"json": output_dir / "length.json", "markdown": output_dir / "length.md", "png": output_dir / "length.png"}
    paths["json"].write_text(json.dumps(data, indent=1))
    caption = (f"Validation loss per {report.train_length}-token bucket of the window (training length "
               f"{report.train_length}); held-out text: {report.source or 'given tokens'}.\n\n")
    paths["markdown"].write_text(caption + markdown_table(report))
    plot_loss_vs_position(report, paths["png"], title)
    return paths


def preflight(checkpoint: Path, options: EvalOptions) -> None:
    """Checks that need no weights (the front door calls it before loading the model): ValueError, one line."""
    suite_lengths(Path(checkpoint), options, DEFAULT_MULTIPLES)


def contiguous_blocks(path: Path, tokenizer, train_length: int) -> tuple[np.ndarray, str]:
    """`--corpus FILE`: the file's text tokenised whole and cut into consecutive blocks, so a window of m blocks is
    m·L tokens of one running text (the validation split's blocks are a random sample of the corpus: a window
    made of them continues with unrelated text after each L tokens). The file should be text the model never
    trained on."""
    if not path.is_file():
        raise FileNotFoundError(f"--corpus {path}: no such file (expected a held-out text file)")
    ids = np.asarray(tokenizer(path.read_text(encoding="utf-8", errors="replace"))["input_ids"], dtype=np.int64)
    count = len(ids) // train_length
    if count == 0:
        raise ValueError(f"--corpus {path}: {len(ids)} tokens, fewer than one window of {train_length}")
    return ids[:count * train_length].reshape(count, train_length), f"{path} ({count} consecutive blocks of {train_length})"


def run_suite(model, tokenizer, checkpoint: Path, options: EvalOptions,
              output_dir: Path) -> dict[str, dict[str, float]]:
    """`angpt eval CHECKPOINT --suite length`: options.lengths (multiples; default 1,2,4,8,16), batch_size, limit
    (number of longest windows, or a fraction of them), optional train_length; artifacts into output_dir."""
    checkpoint = Path(checkpoint)
    train_length, multiples = suite_lengths(checkpoint, options, DEFAULT_MULTIPLES, model.config)
    corpus = options.corpus
    if corpus and Path(corpus).suffix not in (".yaml", ".yml"):
        blocks, source = contiguous_blocks(Path(corpus), tokenizer, train_length)
    else:
        blocks, source = held_out_blocks(checkpoint, train_length)
    available = blocks.size // (multiples[-1] * train_length)
    report = length_generalisation(model, blocks, train_length, multiples,
                                   windows=limit_count(options.limit, max(available, 1)),
                                   batch_size=batch_size_of(options), query_chunk_size=options.query_chunk_size,
                                   source=source)
    write_artifacts(report, output_dir, title=f"{checkpoint.name}: loss against position")
    return report.metrics()
