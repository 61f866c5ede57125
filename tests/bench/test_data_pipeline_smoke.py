"""bench/data_pipeline.py end to end at a smoke size: a 0.4 MB generated corpus, one prepare worker, two training
steps per memory run; the section goes to a page under tmp_path."""
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow  # two training processes and a prepare: about 40 s on a loaded 2-core machine
def test_data_pipeline_smoke(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import data_pipeline

    page = tmp_path / "benchmarks.md"
    data_pipeline.main(["--corpus-mb", "0.4", "--work-dir", str(tmp_path / "work"), "--num-proc", "1",
                        "--train-steps", "2", "--loader-batches", "4", "--results", str(page)])
    text = page.read_text()
    for row in ("| prepare large (0.4 MB of text, 1 process) |", "| second `angpt prepare`",
                "| the 0.5B recipe's consumption per A100 | ", "| resume at step 10,000",
                "| peak RSS of `angpt train`"):
        assert row in text, row
    sys.modules.pop("data_pipeline")
