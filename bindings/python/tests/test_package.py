"""The package's shape: no import cycle between its modules, and the marker that tells type
checkers to read its annotations (PEP 561) is in the package and declared as package data."""

from __future__ import annotations

import ast
import sys

from conftest import PKG_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tests run on 3.11 and later
    tomllib = None

PACKAGE = PKG_ROOT / "rdzv"


def package_imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at any depth (imports inside functions
    count: a lazy import is still a dependency)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:  # from .x import y
                    deps.add(node.module.split(".")[0])
                else:  # from . import x
                    deps.update(a.name for a in node.names if a.name in modules)
        graph[name] = deps - {name}
    return graph


def test_package_modules_import_without_cycles():
    graph = package_imports()
    assert graph["_ffi"], "the import graph was not read"
    path: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in path:
            raise AssertionError(f"import cycle: {' -> '.join(path[path.index(name):] + [name])}")
        if name in done:
            return
        path.append(name)
        for dep in sorted(graph.get(name, ())):
            visit(dep)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_py_typed_is_shipped():
    assert (PACKAGE / "py.typed").is_file()
    if tomllib is None:
        return
    pyproject = tomllib.loads((PKG_ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["rdzv"]
    # Type checkers and the index read it from the metadata too.
    assert "Typing :: Typed" in pyproject["project"]["classifiers"]
