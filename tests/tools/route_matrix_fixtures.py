"""Shared by the route matrix (tests/tools/test_route_matrix_*.py; docs/tools.md, "Routes and forms tested"): the
rows every tool is tried on — the three architectures in the training and the folded form, and a transformers Qwen3
as the control — as briefly trained checkpoints on disk, and the figure each cell records.

The checkpoints are bench/quantization.py's tiny byte-level models (hidden 64, 2 layers, 20 Adam steps on its
text; a random-init model's argmax is noise), trained once per test session and shared by the pytest workers (a file
lock: the first worker trains, the others read). Qwen3 is trained the same way with plain Adam.

Each cell appends one line of JSON (tool, route, mode, row, figure) to the file named by ANGPT_ROUTE_MATRIX, or to
route_matrix.jsonl in the session's temporary directory; `python tests/tools/route_matrix_fixtures.py FILE` prints
the table (one row per tool, route and mode; one column per architecture and form, Qwen3 last)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from quantization_fixtures import BENCH, HIDDEN

ARCHITECTURE_ROWS = [(architecture, form) for architecture in ("gptplus", "ngpt", "angpt")
                     for form in ("training", "folded")]
QWEN3 = ("qwen3", "control")
ROWS = [*ARCHITECTURE_ROWS, QWEN3]
ROW_IDS = [f"{architecture}-{form}" for architecture, form in ROWS]
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STEPS, LAYERS = 20, 2


def _bench():
    """bench/quantization.py as a module, left out of sys.modules afterwards (bench/ is not a package)."""
    sys.path.insert(0, str(BENCH))
    try:
        import quantization
    finally:
        sys.path.remove(str(BENCH))
        for name in ("quantization", "results_file"):
            sys.modules.pop(name, None)
    return quantization


def train_qwen3(bench):
    """A transformers Qwen3 of the architectures' shape (hidden 64, 2 layers, 4 heads, MLP 256, vocabulary 256),
    trained as bench.train_tiny trains them (Adam 3e-3, batches of 8 windows, 20 steps; no constraint)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=256, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                                         head_dim=HIDDEN // 4, max_position_embeddings=128, tie_word_embeddings=False))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = bench.tokens()
    for step in range(STEPS):
        batch = bench.windows(ids, 8, seed=step + 1)
        model(batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def _write_rows(bench, root: Path) -> None:
    for architecture in ("gptplus", "ngpt", "angpt"):
        model = bench.train_tiny(architecture, steps=STEPS, hidden=HIDDEN, layers=LAYERS)
        bench.write_forms(model, str(root / architecture))
    train_qwen3(bench).save_pretrained(root / "qwen3" / "control")
    (root / "done").write_text("ok")


def session_directory(tmp_path_factory) -> Path:
    """This test session's temporary directory, the same for every pytest-xdist worker of it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def route_checkpoints(tmp_path_factory):
    """row (architecture, form) -> (checkpoint directory, evaluation batch of 4 windows of 64 bytes)."""
    from filelock import FileLock

    bench = _bench()
    root = session_directory(tmp_path_factory) / "route_matrix_checkpoints"
    root.mkdir(exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if not (root / "done").exists():
            _write_rows(bench, root)
    batch = bench.windows(bench.tokens(), 4, seed=12345)
    return lambda row: (root / row[0] / row[1], batch)


@pytest.fixture(scope="session")
def record(tmp_path_factory):
    """record(tool, route, mode, row, figure): one cell's figure, appended to the matrix file."""
    default = session_directory(tmp_path_factory) / "route_matrix.jsonl"
    path = Path(os.environ.get("ANGPT_ROUTE_MATRIX") or default)

    def write(tool: str, route: str, mode: str, row, figure: str) -> None:
        line = json.dumps({"tool": tool, "route": route, "mode": mode, "row": "-".join(row), "figure": figure})
        with open(path, "a") as out:  # one short line per write: the workers' lines do not interleave
            out.write(line + "\n")

    return write


@torch.no_grad()
def compare(reference, candidate, batch: torch.Tensor) -> tuple[float, float]:
    """(next-token agreement, max |Δlogit|) of `candidate` against `reference` on every position of `batch`."""
    expected, actual = reference(batch).logits.float(), candidate(batch).logits.float()
    return (expected.argmax(-1) == actual.argmax(-1)).float().mean().item(), (expected - actual).abs().max().item()


def agreement_figure(agreement: float, delta: float) -> str:
    return f"{100 * agreement:.1f} % / {delta:.3g}"


def refusal_figure(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message  # a refusal is one line
    return f"refused: {message}"


def table(path) -> str:
    """The matrix as a markdown table: one row per tool, route and mode; a column per architecture and form."""
    cells, rows = {}, []
    for line in Path(path).read_text().splitlines():
        cell = json.loads(line)
        key = (cell["tool"], cell["route"], cell["mode"])
        rows += [key] if key not in rows else []
        cells[key, cell["row"]] = cell["figure"]
    order = ["torchao", "bitsandbytes", "PEFT", "ONNX Runtime", "continuous batching"]
    rows.sort(key=lambda key: (order.index(key[0]) if key[0] in order else len(order), key[0]))  # stable: routes
    header = ["tool", "route", "mode", *ROW_IDS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in rows:
        lines.append("| " + " | ".join([*key, *(cells.get((key, row), "") for row in ROW_IDS)]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
