"""Metrics: JSONL + TensorBoard while training, a loss-curve PNG at the end, and the MFU estimate.

Only the main process writes. MFU uses the PaLM-paper estimate of training FLOPs per token,
6·N (forward + backward through the matrices) + 12·L·d·T (attention scores and weighted values at
sequence length T; the causal mask is not credited), against a configurable per-device peak.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

# bf16 dense peaks per device (vendor data sheets); recipe key peak_flops overrides.
PEAK_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "L4": 121e12, "A10": 125e12, "V100": 125e12}
# CPU: no data sheet applies; assume 100 GFLOP/s per core (order of an AVX-512/AMX core at bf16).
CPU_FLOPS_PER_CORE = 1e11


def training_flops_per_token(model, seq_len: int) -> float:
    config = model.config
    n_params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings()
    n_matmul = n_params - (embed.weight.numel() if embed is not None else 0)  # a lookup is no matmul
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    return 6.0 * n_matmul + attention


def device_peak_flops(device: torch.device, override: float | None = None) -> float:
    if override:
        return float(override)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in PEAK_FLOPS.items():
            if key in name:
                return flops
        return 312e12
    return CPU_FLOPS_PER_CORE * torch.get_num_threads()


class MetricsLogger:
    """Appends one JSON object per event to metrics.jsonl and mirrors scalars to TensorBoard."""

    def __init__(self, output_dir: Path, report_to: list[str], enabled: bool, resume_step: int | None = None):
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self.jsonl = enabled and "jsonl" in report_to
        self.writer = None
        if not enabled:
            return
        if self.path.exists():
            self._truncate_after(resume_step)
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(output_dir) / "tensorboard"), purge_step=resume_step)

    def _truncate_after(self, step: int | None) -> None:
        """On resume drop what the interrupted run logged after its checkpoint (it is recomputed);
        a fresh run starts a fresh file."""
        keep = [] if step is None else [line for line in self.path.read_text().splitlines()
                                        if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, **values) -> None:
        if not self.enabled:
            return
        if self.jsonl:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": step, **values}) + "\n")
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def plot_loss_curve(metrics_path: Path, png_path: Path, title: str = "") -> Path | None:
    """Training and validation loss against step, written with matplotlib's Agg backend (no display)."""
    if not Path(metrics_path).exists():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss", lw=1.5)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return Path(png_path)
