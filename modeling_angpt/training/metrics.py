"""Metrics: JSONL and the experiment trackers while training, a loss-curve PNG at the end, and the MFU estimate.

Only the main process writes. MFU uses the PaLM-paper estimate of training FLOPs per token,
6·N (forward + backward through the matrices) + 12·L·d·T (attention scores and weighted values at
sequence length T; the causal mask is not credited), against the peak measured on the same device (a cached matmul
benchmark in the training dtype; recipe key peak_flops overrides it).
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

PEAK_CACHE_FILE = "peak_flops.json"


def training_flops_per_token(model, seq_len: int) -> float:
    config = model.config
    n_params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings()
    n_matmul = n_params - (embed.weight.numel() if embed is not None else 0)  # a lookup is no matmul
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    return 6.0 * n_matmul + attention


def device_name(device: torch.device) -> str:
    """A key for the device's peak: the GPU's name, or the CPU model with the thread count torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} ({torch.get_num_threads()} threads)"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_matmul_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16, size: int | None = None,
                         seconds: float = 1.0) -> float:
    """Achieved FLOP/s of a square matmul on `device` in `dtype`: the best of repeated timed bursts.

    This is the peak that MFU is reported against (not a data-sheet number): what this device, this torch and this
    dtype reach on the operation training spends its time in. On a GPU, 8192² bf16 reaches most of the dense peak."""
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):  # warm-up (kernel selection, thread pool)
        a @ b
    sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best


def cpu_bf16_speed_ratio(size: int = 256, seconds: float = 0.1) -> float:
    """This CPU's bfloat16 matmul FLOP/s over its float32 FLOP/s (a fraction of a second to measure). Above 1 on
    CPUs with native bfloat16 (AMX, AVX512-BF16); on one without (AVX2 only) oneDNN falls back to reference
    kernels and bfloat16 runs two orders of magnitude slower than float32."""
    return (measure_matmul_flops(torch.device("cpu"), torch.bfloat16, size, seconds)
            / measure_matmul_flops(torch.device("cpu"), torch.float32, size, seconds))


# bfloat16 on a CPU only where its matmul is not slower than float32's by more than this factor
CPU_BF16_MIN_SPEED_RATIO = 0.5


def cpu_lacks_native_bf16() -> float | None:
    """The CPU's bfloat16/float32 matmul speed ratio when it is below CPU_BF16_MIN_SPEED_RATIO (no native
    bfloat16: bfloat16 would be a slowdown, not a speed-up), else None."""
    ratio = cpu_bf16_speed_ratio()
    return ratio if ratio < CPU_BF16_MIN_SPEED_RATIO else None


def _cache_path() -> Path:
    return Path(os.environ.get("ANGPT_CACHE", Path.home() / ".cache" / "angpt")) / PEAK_CACHE_FILE


def device_peak_flops(device: torch.device, override: float | None = None,
                      dtype: torch.dtype = torch.bfloat16) -> float:
    """Per-device peak for MFU: `override` (recipe key peak_flops) or a matmul benchmark measured once per
    (device, dtype) and cached in $ANGPT_CACHE/peak_flops.json (delete the entry to re-measure, e.g. after
    measuring on a busy machine)."""
    if override:
        return float(override)
    key = f"{device_name(device)}|{str(dtype).replace('torch.', '')}"
    path = _cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = measure_matmul_flops(device, dtype)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: measure again next time
    return float(cache[key])


def _parsed(line: str) -> dict | None:
    """A line's JSON object; None for a line cut short (the last one of a run killed while writing it)."""
    try:
        return json.loads(line)
    except ValueError:
        return None


class MetricsLogger:
    """Appends one JSON object per event to metrics.jsonl (the run's own record) and hands the same values to the
    experiment trackers: training's log, and the semantic-focus protocol's (one line per epoch). Only an `enabled`
    logger (the main process) writes.

    `log` is where the trackers get the values: training passes `accelerator.log`, whose trackers the run started
    (training/trackers.py). Without it, "tensorboard" in `report_to` opens Accelerate's own TensorBoardTracker on
    OUTPUT_DIR/tensorboard (the semantic-focus protocol, which has no Accelerator). `step_key` names the counter in
    each line ("step" for training, "epoch" for the protocol). `resume_step` (a resumed run) keeps the lines up to that
    step and drops what the interrupted run logged after it (it is recomputed); a fresh run (None) starts a fresh file.
    `tracker_tags` maps the logged keys to the trackers' names for them; None passes every number under its own key."""

    def __init__(self, output_dir: Path, report_to: list[str], enabled: bool, resume_step: int | None = None,
                 step_key: str = "step", tracker_tags: dict[str, str] | None = None, log=None):
        self.enabled, self.step_key, self.tags, self.tracker_log = enabled, step_key, tracker_tags, log
        self.path = Path(output_dir) / "metrics.jsonl"
        self.jsonl = enabled and "jsonl" in report_to
        self.own_tracker = None
        if not enabled:
            return
        if self.path.exists():
            self._truncate_after(resume_step)
        if log is None and "tensorboard" in report_to:
            from accelerate.tracking import TensorBoardTracker

            # purge_step drops the events at and after it: those logged after the state the run resumes from
            self.own_tracker = TensorBoardTracker("", Path(output_dir) / "tensorboard",
                                                  purge_step=None if resume_step is None else resume_step + 1)
            self.own_tracker.start()
            self.tracker_log = self.own_tracker.log

    def _truncate_after(self, step: int | None) -> None:
        keep = [] if step is None else [line for line in self.path.read_text().splitlines()
                                        if (row := _parsed(line)) is not None and row[self.step_key] <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, **values) -> None:
        if not self.enabled:
            return
        if self.jsonl:
            with self.path.open("a") as f:
                f.write(json.dumps({self.step_key: step, **values}) + "\n")
        if self.tracker_log is not None:
            numbers = {key if self.tags is None else self.tags.get(key): value for key, value in values.items()
                       if isinstance(value, (int, float)) and (self.tags is None or key in self.tags)}
            if numbers:
                self.tracker_log(numbers, step=step)

    def close(self) -> None:
        if self.own_tracker is not None:
            self.own_tracker.finish()


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
