"""Every private or internal name of another project the code touches is in the ledger (modeling_angpt/
dependencies/ledger.py), and the installed versions still have each (docs/usage.md, "Supported versions"): a release
that renamed one fails here with one line naming the entry, not deep in a run."""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from modeling_angpt.dependencies import ledger as internals_ledger
from modeling_angpt.dependencies.ledger import (ENTRIES, INTERNAL_MODULES, SERVING_ENTRIES, describe_missing,
                                                installed_version, lacks, serving_refusal)

REPO = Path(__file__).resolve().parents[2]


def _skip_reason(entry) -> str | None:
    if installed_version(entry.distribution) is None:
        return f"{entry.distribution} is not installed"
    if entry in SERVING_ENTRIES and importlib.util.find_spec("fastapi") is None:
        return "transformers' server is not installed (transformers[serving])"
    if entry in SERVING_ENTRIES and serving_refusal() is not None and "is older than" in serving_refusal():
        return "angpt serve refuses this transformers (older than its server needs), so it uses none of these"
    return None


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.label())
def test_the_installed_version_has_the_entry(entry):
    reason = _skip_reason(entry)
    if reason is not None:
        pytest.skip(reason)
    if lacks(entry):
        pytest.fail(describe_missing(entry), pytrace=False)


def test_a_renamed_name_is_found_missing_and_named_in_one_line():
    """The check itself against names known to exist and not to: a method, an attribute set on instances, a
    module attribute, a registry's key."""
    check = next(entry for entry in ENTRIES if entry.name == "PreTrainedModel._check_and_adjust_attn_implementation")
    stored = next(entry for entry in ENTRIES if entry.name == "PreTrainedConfig._attn_implementation_internal")
    registered = next(entry for entry in ENTRIES if entry.key is not None)
    assert not lacks(check) and not lacks(stored) and not lacks(registered)
    renamed = [dataclasses.replace(check, name="PreTrainedModel._check_attn_implementation_v2"),
               dataclasses.replace(stored, name="PreTrainedConfig._attn_implementation_stored"),
               dataclasses.replace(check, module="transformers.no_such_module"),
               dataclasses.replace(registered, key="paged|eager_v2")]
    assert all(lacks(entry) for entry in renamed)
    line = internals_ledger.missing_entries(renamed[:1])[0]
    assert "\n" not in line and "PreTrainedModel._check_attn_implementation_v2" in line and \
        "modeling_angpt/modeling_angpt.py" in line


def _foreign_private_names(path: Path, own: str = "modeling_angpt") -> set[str]:
    """Dotted names of other projects with a private part that `path` imports or reads: `from x import _y`,
    `import x._y`, `from x._y import z`, attribute chains from an imported module such as `torch._dynamo.x`, and
    any name imported from a module the ledger calls internal (INTERNAL_MODULES)."""
    tree, found, modules = ast.parse(path.read_text()), set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]
                if any(part.startswith("_") for part in alias.name.split(".")):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and not node.level and not node.module.startswith(own):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if any(part.startswith("_") and not part.startswith("__") for part in dotted.split(".")) or \
                        any(f"{node.module}.".startswith(f"{internal}.") for internal in INTERNAL_MODULES):
                    found.add(dotted)
    inner_attributes = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):  # each whole chain `a.b._c.d` once, from its outermost attribute
        if not isinstance(node, ast.Attribute) or id(node) in inner_attributes:
            continue
        chain, inner = [], node
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        private = any(part.startswith("_") and not part.startswith("__") for part in chain)
        if private and isinstance(inner, ast.Name) and modules.get(inner.id, "os") not in sys.stdlib_module_names:
            found.add(".".join([modules[inner.id], *reversed(chain)]))
    return found


def test_every_foreign_private_name_in_the_code_is_in_the_ledger():
    labels = {entry.label() for entry in ENTRIES} | {entry.module for entry in ENTRIES}
    unlisted = []
    for path in sorted([*(REPO / "modeling_angpt").rglob("*.py"), *(REPO / "bench").glob("*.py")]):
        for name in sorted(_foreign_private_names(path)):
            if not any(label == name or label.startswith(f"{name}.") or name.startswith(f"{label}.")
                       for label in labels):
                unlisted.append(f"{path.relative_to(REPO)}: {name}")
    assert not unlisted, "private names of other projects missing from modeling_angpt/dependencies/ledger.py: " + \
        "; ".join(unlisted)
