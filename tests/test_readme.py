"""The README's usage example runs as written."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}  # blocks run in order, as a reader would paste them
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "my-angpt" / "model.safetensors").is_file()
