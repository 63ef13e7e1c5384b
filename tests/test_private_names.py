"""A leading underscore means "this module only": no module of nbbudget imports another's
private names or reads another's private attributes, and the modules import each other in no
circle, lazy imports included. The layers above the core use `nbbudget.core.lowlevel`.

The layers (``docs/architecture.md``) only look down: `nbbudget.core`, then `nbbudget.run`,
then `nbbudget.calls`, then `nbbudget.integrations` and `nbbudget.backends` (a backend is loaded
by name, `nbbudget.core.backends.load`, never imported from below), then `nbbudget.jupyter` and
`nbbudget.cli`, then the public modules (`nbbudget`, `nbbudget.testing`, `nbbudget.pydantic_ai`,
`nbbudget.dask`, `nbbudget.demo`). No module imports one of a higher layer, lazily or not."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nbbudget"

#: each folder's layer; the modules at the top of the package are the public layer
LAYERS = {"core": 0, "run": 1, "calls": 2, "integrations": 3, "backends": 3, "jupyter": 4, "cli": 4}
PUBLIC_LAYER = 5


def module_name(path: Path) -> str:
    parts = ["nbbudget", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for path in sorted(PACKAGE.rglob("*.py"))}


def is_package(module: str) -> bool:
    return (PACKAGE.joinpath(*module.split(".")[1:]) / "__init__.py").exists()


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 and parts[1] in LAYERS else PUBLIC_LAYER


def private_names(tree: ast.Module) -> set[str]:
    """The underscored names a module defines: functions, classes, attributes, variables."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def imported(module: str, node: ast.ImportFrom) -> str:
    """The module an ``import from`` names, resolved against *module*."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package(module):
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def reaches() -> list[tuple[str, str]]:
    mods = modules()
    defined = {name: private_names(tree) for name, tree in mods.items()}
    elsewhere = {n for names in defined.values() for n in names}
    found = []
    for name, tree in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = imported(name, node)
                found += [(name, a.name) for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")
                          and source.startswith("nbbudget")
                          and f"{source}.{a.name}" not in mods]
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                  and not node.attr.startswith("__")
                  and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                  and node.attr not in defined[name] and node.attr in elsewhere):
                found.append((name, node.attr))
    return sorted(set(found))


@functools.cache
def imports() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, tree in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = imported(name, node)
                targets = [source, *(f"{source}.{a.name}" for a in node.names)]
                graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def test_no_module_reads_or_imports_another_modules_private_names() -> None:
    assert reaches() == []


def test_every_module_of_the_package_is_in_a_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS)
    assert len(modules()) > 30  # the walk found the folders' modules


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_imports_a_higher_layer_lazily_or_not(module: str) -> None:
    upward = sorted(t for t in imports()[module] if layer(t) > layer(module))
    assert upward == [], f"{module} (layer {layer(module)}) imports {upward}"


def test_the_layer_check_finds_an_upward_import(monkeypatch) -> None:
    monkeypatch.setitem(globals(), "modules", lambda: {
        "nbbudget.core.ledger": ast.parse("def f():\n    from ..calls.jobs import Job\n"),
        "nbbudget.calls.jobs": ast.parse("Job = 1\n")})
    monkeypatch.setitem(globals(), "imports", imports.__wrapped__)
    assert imports()["nbbudget.core.ledger"] == {"nbbudget.calls.jobs"}
    assert layer("nbbudget.core.ledger") < layer("nbbudget.calls.jobs")


def test_the_reach_check_finds_a_private_import_and_a_private_read(monkeypatch) -> None:
    tree = ast.parse("from ._budget import _current\nrun._core.charge(0, 1, None)\n")
    monkeypatch.setitem(globals(), "modules", lambda: {
        "nbbudget.run.budget": ast.parse("_current = 1\nclass B:\n    _core = 2\n"),
        "nbbudget.run.tools": tree})
    assert reaches() == [("nbbudget.run.tools", "_core"), ("nbbudget.run.tools", "_current")]


PACKAGES = {name for name in modules() if is_package(name)}


@pytest.mark.parametrize("start", sorted(modules()))
def test_no_module_imports_itself_through_others_lazily_or_not(start: str) -> None:
    graph = imports()
    seen, todo = set(), list(graph[start] - PACKAGES)
    while todo:
        name = todo.pop()
        if name in seen or name in PACKAGES:
            continue  # a package's __init__ only documents or re-exports: not a layer
        seen.add(name)
        todo += graph[name]
    assert start not in seen, f"{start} imports itself through {sorted(seen)}"
