"""The package's imports point one way, and its functions fit on a screen (docs/architectures.md, "Reading the code").

The graph is read from the source with `ast`, not by importing: every import statement counts, at module level,
inside functions and under `if TYPE_CHECKING:`, relative or absolute. An import of a submodule is an edge to that
submodule; the parent packages Python imports on the way are not edges of their own (every module would then
depend on `modeling_angpt/__init__.py`). Modules reach each other's public names only: a `_`-prefixed name is private
to its module.

`.venv/bin/python tests/contract/test_import_graph.py` prints the graph (one `module -> imported module` per line),
then its cycles, private imports and long functions, if any.
"""
from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "modeling_angpt"
MAX_FUNCTION_LINES = 80


def package_modules(root: pathlib.Path = ROOT, package: str = PACKAGE) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file of the package (a package is its __init__.py)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_package(name: str, modules: dict[str, pathlib.Path]) -> bool:
    return modules[name].name == "__init__.py"


def imports_of(name: str, modules: dict[str, pathlib.Path]) -> list[tuple[str, str, int]]:
    """(imported module of the package, imported name or "", line) for every import statement in module `name`."""
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    here = name if _is_package(name, modules) else name.rpartition(".")[0]  # what `.` means in this file
    found = []
    for node in ast.walk(tree):  # every statement: module level, function bodies, `if TYPE_CHECKING:` blocks
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base not in modules:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:  # `from . import x` with x a module of its own
                    found.append((submodule, "", node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
    return found


def import_graph(modules: dict[str, pathlib.Path] | None = None) -> dict[str, set[str]]:
    modules = package_modules() if modules is None else modules
    return {name: {target for target, _, _ in imports_of(name, modules) if target != name} for name in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def private_imports() -> list[str]:
    """`module:line imports _name from other_module` for every private name one module takes from another."""
    modules = package_modules()
    found = []
    for name in modules:
        for target, imported, line in imports_of(name, modules):
            private = imported.startswith("_") and not (imported.startswith("__") and imported.endswith("__"))
            if private and target != name:
                found.append(f"{modules[name].relative_to(ROOT)}:{line} imports {imported} from {target}")
    return found


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`file:line name (n lines)` for every function or method longer than `limit` lines, decorators excluded."""
    found = []
    for path in package_modules().values():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The reader itself, on a package made for it: an import under TYPE_CHECKING, one inside a function, relative
    and absolute, `from . import module`, are all edges, and the cycle they close is found."""
    files = {"pkg/__init__.py": "",
             "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.b import B\n",
             "pkg/sub/__init__.py": "",
             "pkg/sub/b.py": "def load():\n    import pkg.c\n    from .. import c\n",
             "pkg/c.py": "from . import a\nfrom .a import _hidden\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = package_modules(tmp_path, "pkg")
    graph = import_graph(modules)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(), "pkg.sub.b": {"pkg.c"},
                     "pkg.c": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert ("pkg.a", "_hidden", 2) in imports_of("pkg.c", modules)
    assert "modeling_angpt.modeling_angpt" in import_graph()["modeling_angpt"]  # inside register_auto_classes()


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (each line: the modules of one cycle):\n" + "\n".join(map(", ".join, found))


def test_no_module_imports_a_private_name_of_another():
    found = private_imports()
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_no_function_longer_than_a_screen():
    found = long_functions()
    assert not found, f"functions longer than {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


def test_the_model_file_starts_with_the_model():
    """After its imports, modeling_angpt.py defines the model (rotary embedding, attention, layers, heads), no module
    constants of version plumbing first; no model file (the flat *_angpt.py files) branches on the transformers
    version by inspecting it (docs/transformers-compat.md, "Supported transformers versions")."""
    tree = ast.parse((ROOT / PACKAGE / "modeling_angpt.py").read_text())
    definitions = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))
                   and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]  # the docstring
    assert isinstance(definitions[0], (ast.FunctionDef, ast.ClassDef)), ast.unparse(definitions[0])[:200]
    for path in sorted((ROOT / PACKAGE).glob("*_angpt.py")):
        text = path.read_text()
        for probe in ("__dataclass_fields__", "inspect.signature", "transformers.__version__"):
            assert probe not in text, f"{path.name} reads {probe}"


if __name__ == "__main__":
    for module, targets in sorted(import_graph().items()):
        for target in sorted(targets):
            print(f"{module} -> {target}")
    for title, lines in (("cycles", map(", ".join, cycles(import_graph()))), ("private imports", private_imports()),
                         (f"functions over {MAX_FUNCTION_LINES} lines", long_functions())):
        lines = list(lines)
        print(f"\n{title}: {len(lines)}", *lines, sep="\n")
