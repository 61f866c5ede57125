"""What an evaluation runs: suites and lm-eval task names, checked before any model is loaded.

Suites: `offline` (lm-eval group angpt_offline: local held-out text), `paper` (group angpt_paper: the anGPT
paper's downstream set, Hub data), and the project's own evaluators `perplexity` (held-out loss on the
checkpoint's training validation split), `length` (length generalisation) and `needle` (needle retrieval).

Checks here are cheap and do not build lm-eval's task index (about 10 s): a name is looked up in the YAML
files of the include paths (eval/tasks) and, textually, in lm-eval's own task YAMLs; a Hub dataset is probed
with one short request (or not at all under HF_HUB_OFFLINE), and when the Hub cannot be reached, every later
`datasets` call is put in offline mode so nothing waits for retries.
"""
from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

LM_EVAL_SUITES = {"offline": "angpt_offline", "paper": "angpt_paper"}
OWN_SUITES = ("perplexity", "length", "needle")
SUITES = tuple(LM_EVAL_SUITES) + OWN_SUITES
OWN_SUITE_MODULES = {"perplexity": "modeling_angpt.evaluation.perplexity",
                     "length": "modeling_angpt.evaluation.length",
                     "needle": "modeling_angpt.evaluation.needle"}
LOCAL_BUILDERS = {"json", "csv", "text", "parquet", "arrow", "pandas", "imagefolder", "audiofolder"}
_TRUE = {"1", "ON", "YES", "TRUE"}


class SelectionError(ValueError):
    """A suite, task or dataset that cannot be evaluated; the message is one complete line."""


@dataclass
class Selection:
    lm_eval_tasks: list[str] = field(default_factory=list)   # names for lm_eval.simple_evaluate
    own_suites: list[str] = field(default_factory=list)      # perplexity / length / needle, in order
    include_paths: list[str] = field(default_factory=list)
    needs_defaults: bool = False                             # some task comes from lm-eval's own tasks
    needs_offline_data: bool = False                         # some task reads the angpt_offline data
    hub_datasets: dict = field(default_factory=dict)         # task -> (dataset_path, dataset_name)


def default_include_path() -> Path | None:
    """eval/tasks of the source tree, or share/angpt/eval/tasks of a wheel install."""
    for root in (Path(__file__).resolve().parents[2] / "eval" / "tasks",
                 Path(sys.prefix) / "share" / "angpt" / "eval" / "tasks"):
        if root.is_dir():
            return root
    return None


def _yaml_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", ".ipynb_checkpoints")]
        for name in filenames:
            if name.endswith((".yaml", ".yml")):
                yield Path(dirpath) / name


def _names_in(root: Path) -> dict[str, Path]:
    """{task or group name: YAML file} for the `task: NAME` / `group: NAME` lines of the YAMLs under root."""
    found = {}
    pattern = re.compile(r"^(?:task|group):\s*['\"]?([\w.\-]+)['\"]?\s*$", re.M)
    for path in _yaml_files(root):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for name in pattern.findall(text):
            found.setdefault(name, path)
    return found


def _lm_eval_tasks_dir() -> Path:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SelectionError("lm-eval is not installed: pip install 'angpt[eval]'")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks"


@functools.lru_cache(maxsize=1)
def _lm_eval_yamls() -> tuple[tuple[Path, bytes], ...]:
    """Every task YAML of the installed lm-eval, read once (about 14,000 files, 7 MB; under a second)."""
    return tuple((path, path.read_bytes()) for path in _yaml_files(_lm_eval_tasks_dir()))


def _mentioned_in_lm_eval(name: str) -> tuple[bool, Path | None]:
    """(whether NAME appears as a word in some lm-eval task YAML, the YAML whose `task:` is NAME if any).
    Every task, group and tag name is written in some YAML, so a name found nowhere cannot be loaded."""
    word = re.compile(rb"(?<![\w.\-])" + re.escape(name.encode()) + rb"(?![\w.\-])")
    task_line = re.compile(rb"^task:\s*['\"]?" + re.escape(name.encode()) + rb"['\"]?\s*$", re.M)
    mentioned, definition = False, None
    for path, data in _lm_eval_yamls():
        if word.search(data):
            mentioned = True
            if task_line.search(data):
                return True, path
    return mentioned, definition


def _dataset_of(yaml_path: Path) -> tuple[str, str | None] | None:
    """(dataset_path, dataset_name) of a task YAML when its data come from the Hub, else None."""
    from lm_eval.tasks._yaml_loader import load_yaml

    config = load_yaml(yaml_path, resolve_func=False)
    path = config.get("dataset_path")
    if not path or config.get("custom_dataset") or path in LOCAL_BUILDERS or Path(str(path)).exists():
        return None
    return str(path), config.get("dataset_name")


def select(suites: list[str], tasks: list[str], include_paths: list[str]) -> Selection:
    """Resolve suites and task names; SelectionError (one line) for anything unknown."""
    selection = Selection()
    if (tasks or any(s in LM_EVAL_SUITES for s in suites)) and importlib.util.find_spec("lm_eval") is None:
        raise SelectionError("lm-eval is not installed: pip install 'angpt[eval]'")
    default = default_include_path()
    roots = ([str(default)] if default else []) + [str(p) for p in include_paths]
    for path in include_paths:
        if not Path(path).is_dir():
            raise SelectionError(f"--include-path {path}: no such directory")
    selection.include_paths = roots
    local = {}
    for root in roots:
        for name, path in _names_in(Path(root)).items():
            local.setdefault(name, path)

    names = []
    for suite in suites:
        if suite not in SUITES:
            close = difflib.get_close_matches(suite, SUITES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise SelectionError(f"unknown suite {suite!r} (suites: {', '.join(SUITES)}){hint}")
        if suite in LM_EVAL_SUITES:
            if LM_EVAL_SUITES[suite] not in local:
                raise SelectionError(f"suite {suite}: group {LM_EVAL_SUITES[suite]} not found in {roots} "
                                     "(the eval/tasks directory of the angpt source tree)")
            names.append(LM_EVAL_SUITES[suite])
        elif suite not in selection.own_suites:
            selection.own_suites.append(suite)
    names += tasks
    for name in names:
        if name in selection.lm_eval_tasks:
            continue
        if name in local:
            selection.lm_eval_tasks.append(name)
            _expand_local(name, local, selection)
            continue
        mentioned, definition = _mentioned_in_lm_eval(name)
        if not mentioned:
            raise SelectionError(_unknown_task_message(name, local))
        selection.lm_eval_tasks.append(name)
        selection.needs_defaults = True
        if definition is not None:
            hub = _dataset_of(definition)
            if hub:
                selection.hub_datasets[name] = hub
    return selection


def _expand_local(name: str, local: dict[str, Path], selection: Selection) -> None:
    """A group of ours: note which members read offline data, which come from lm-eval (and their Hub data)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from .offline_data import TASKS

    if name in TASKS:
        selection.needs_offline_data = True
    config = load_yaml(local[name], resolve_func=False)
    if "group" not in config:
        if config.get("dataset_path") and not config.get("custom_dataset"):
            hub = _dataset_of(local[name])
            if hub:
                selection.hub_datasets[name] = hub
        return
    for member in config.get("task") or []:
        member = member.get("task") if isinstance(member, dict) else member
        if not isinstance(member, str):
            continue
        if member in local:
            _expand_local(member, local, selection)
            continue
        mentioned, definition = _mentioned_in_lm_eval(member)
        if not mentioned:
            raise SelectionError(f"group {name} ({local[name]}) names task {member!r}, which this lm-eval "
                                 "does not have")
        selection.needs_defaults = True
        if definition is not None:
            hub = _dataset_of(definition)
            if hub:
                selection.hub_datasets[member] = hub


def _unknown_task_message(name: str, local: dict) -> str:
    if name in SUITES:
        return f"unknown task {name!r}: {name} is a suite, use --suite {name}"
    close = difflib.get_close_matches(name, list(local), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown task {name!r}: no lm-eval task, group or tag has this name{hint}"


# ------------------------------------------------------------------------------------------ Hub probing

def hub_offline_reason() -> str | None:
    """Why the Hub cannot be used (an offline variable, or a failed request of a few seconds), else None."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").upper() in _TRUE:
            return f"{variable}={os.environ[variable]}"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/datasets?limit=1", method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except urllib.error.HTTPError:
        return None  # the server answered
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return f"{endpoint} unreachable: {reason}"
    return None


def force_offline() -> None:
    """Make huggingface_hub and datasets answer from the local cache only, also where already imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
        datasets.config.HF_DATASETS_OFFLINE = True


def check_hub_datasets(selection: Selection, offline_group: str = "angpt_offline") -> str | None:
    """Fail fast (SelectionError) when a task's Hub dataset is neither reachable nor cached; returns the reason
    the Hub is offline (then everything later runs offline, so a dataset not found here fails at once instead
    of after lm-eval's retries) or None."""
    if not selection.hub_datasets and not selection.needs_defaults:
        return None
    reason = hub_offline_reason()
    if reason is None:
        return None
    force_offline()
    import datasets

    missing = []
    for task, (path, name) in selection.hub_datasets.items():
        try:
            datasets.load_dataset_builder(path, name)
        except Exception:  # ConnectionError / FileNotFoundError / DatasetNotFoundError: not in the cache
            missing.append((task, path, name))
    if missing:
        task, path, name = missing[0]
        more = f" (and {len(missing) - 1} more task(s))" if len(missing) > 1 else ""
        raise SelectionError(
            f"task {task} needs the Hub dataset {path}{f' ({name})' if name else ''}, which is not cached, "
            f"and the Hugging Face Hub cannot be reached ({reason}){more}; evaluate without the Hub with "
            f"--suite offline (lm-eval group {offline_group})")
    return reason
