"""bench/RESULTS.md is shared by the benchmark scripts: each owns one section between its own markers."""
from __future__ import annotations

import pathlib

RESULTS = pathlib.Path(__file__).with_name("RESULTS.md")


def update_section(name: str, body: str) -> None:
    """Replace the section `name` (or append it) and leave the other sections alone."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    section = f"{start}\n{body.strip()}\n{end}"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if start in text and end in text:
        text = text[: text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text)
