"""The result files of `angpt eval`: results.json (the whole report) and results.md (the table), moved from the
staging directory into the output directory only when the run succeeded (runner.execute)."""
from __future__ import annotations

import json
import os
from pathlib import Path


def _format(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "nan"
        return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"
    return str(value)


def markdown_table(report: dict) -> str:
    lm = report.get("lm_eval", {})
    versions, shots, counts = lm.get("versions", {}), lm.get("n-shot", {}), lm.get("n-samples", {})
    lines = ["| Task | Version | n-shot | n | Metric | Value | Stderr |", "|---|---:|---:|---:|---|---:|---:|"]
    for task, metrics in report["results"].items():
        n = counts.get(task, {}).get("effective", "")
        first = True
        for metric, value in metrics.items():
            if metric.endswith("_stderr") or "_stderr " in metric:
                continue
            name, _, filter_part = metric.partition(" [")
            stderr = metrics.get(f"{name}_stderr" + (f" [{filter_part}" if filter_part else ""))
            stderr = "" if stderr is None else _format(stderr)
            cells = [task, str(versions.get(task, "")), str(shots.get(task, "")), str(n)] if first \
                else ["", "", "", ""]
            lines.append("| " + " | ".join(cells + [metric, _format(value), stderr]) + " |")
            first = False
    return "\n".join(lines)


def markdown_report(report: dict) -> str:
    checkpoint = report["checkpoint"]
    head = [f"# Evaluation of {checkpoint['path']}", "",
            f"weights sha256 {checkpoint['weights_sha256'][:16]}…, {report['dtype']} on {report['device']}, "
            f"{report['created']}; angpt {report['versions'].get('angpt')}, lm-eval {report['versions'].get('lm_eval')}",
            ""]
    if report.get("offline_data"):
        data = report["offline_data"]
        head += [f"offline tasks: {data['corpus']}, seed {data['seed']}", ""]
    return "\n".join(head + [markdown_table(report), ""])


def _json_default(value):
    try:
        from lm_eval.utils import handle_non_serializable

        return handle_non_serializable(value)
    except ImportError:
        return str(value)


def write_report(report: dict, staging_dir: Path, output_dir: Path) -> Path:
    """results.json + results.md into staging_dir, then everything staged into output_dir (created if needed);
    an existing file there is never replaced."""
    (staging_dir / "results.json").write_text(json.dumps(report, indent=2, default=_json_default,
                                                         ensure_ascii=False))
    (staging_dir / "results.md").write_text(markdown_report(report))
    output_dir.mkdir(parents=True, exist_ok=True)
    clashes = [p.name for p in staging_dir.iterdir() if (output_dir / p.name).exists()]
    if clashes:
        raise FileExistsError(f"{output_dir / clashes[0]} appeared during the evaluation; results left in "
                              f"{staging_dir}")
    for path in sorted(staging_dir.iterdir()):
        os.replace(path, output_dir / path.name)
    staging_dir.rmdir()
    return output_dir / "results.json"
