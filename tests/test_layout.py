"""The package's structure (issue 38): data flows one way, and packages meet only through public names.

An AST walk of every module under hyflash/ collects every import, at the top of a module or inside a function,
so an import moved into a function to dodge a circle is still seen. The nodes of the graph are the top-level
modules (hyflash/engine.py) and the subpackages (hyflash/drafters/, all of its modules together).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hyflash"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _node(module: str) -> str:
    """hyflash.drafters.model -> hyflash.drafters; hyflash.engine -> hyflash.engine; hyflash -> hyflash."""
    return ".".join(module.split(".")[:2])


def _is_cli(module: str) -> bool:
    return module.split(".")[-1] == "cli"


def _imports() -> list[tuple[str, str, str | None, int]]:
    """(importing module, imported module, imported name or None, line) for every import under hyflash/."""
    sources = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    found = []
    for module, path in sources.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(module, alias.name, None, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against the importing module's package
                    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in sources:  # `from hyflash import engine`: the module engine
                        found.append((module, submodule, None, node.lineno))
                    else:
                        found.append((module, base, alias.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, imported, _, _ in _imports():
        if imported.split(".")[0] == "hyflash" and _node(module) != _node(imported):
            edges.setdefault(_node(module), set()).add(_node(imported))
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_imports_inside_functions():
    imports = _imports()
    assert len(imports) > 200
    # hyflash.cli imports its commands' modules inside the handlers (so --help stays fast): the walk sees them.
    assert any(m == "hyflash.cli" and i == "hyflash.engine" for m, i, _, _ in imports)


def test_only_command_line_modules_import_the_cli():
    offenders = [f"{m}:{line}" for m, i, _, line in _imports() if _node(i) == "hyflash.cli" and not _is_cli(m)]
    assert not offenders, f"the library imports hyflash.cli (move what it needs below the CLI): {offenders}"


def test_no_module_imports_another_packages_private_names():
    offenders = []
    for module, imported, name, line in _imports():
        if imported.split(".")[0] != "hyflash" or _node(module) == _node(imported):
            continue
        private = [part for part in imported.split(".") + [name or ""] if part.startswith("_") and part[:2] != "__"]
        if private:
            offenders.append(f"{module}:{line} imports {imported}.{name or ''}")
    assert not offenders, f"make shared pieces public in the module that owns them: {offenders}"


def test_no_import_circles_between_packages_and_modules():
    cycles = _cycles(_graph())
    assert not cycles, f"import circles (data should flow one way): {cycles}"


def test_the_library_never_imports_experiments():
    offenders = [f"{m}:{line}" for m, i, _, line in _imports() if i.split(".")[0] == "experiments"]
    assert not offenders, f"hyflash/ imports experiments/: {offenders}"
