"""A leading underscore means "this module only": no module of nbbudget imports another's
private names or reads another's private attributes, and the modules import each other in no
circle, lazy imports included. The layers above the core use `nbbudget._lowlevel`."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nbbudget"

#: what the job runner still reads of a job's private state, until it has its own interface
JOB_RUNNER = {("nbbudget._call", name) for name in ("_detach", "_settle", "_signal", "_timers")}


@functools.cache
def modules() -> dict[str, ast.Module]:
    return {f"nbbudget.{path.stem}" if path.stem != "__init__" else "nbbudget":
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for path in sorted(PACKAGE.glob("*.py"))}


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
    if module != "nbbudget":
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
    assert [r for r in reaches() if r not in JOB_RUNNER] == []


def test_the_reach_check_finds_a_private_import_and_a_private_read(monkeypatch) -> None:
    tree = ast.parse("from ._budget import _current\nrun._core.charge(0, 1, None)\n")
    monkeypatch.setitem(globals(), "modules", lambda: {
        "nbbudget._budget": ast.parse("_current = 1\nclass B:\n    _core = 2\n"),
        "nbbudget._tool": tree})
    assert reaches() == [("nbbudget._tool", "_core"), ("nbbudget._tool", "_current")]


@pytest.mark.parametrize("start", sorted(modules()))
def test_no_module_imports_itself_through_others_lazily_or_not(start: str) -> None:
    graph = imports()
    seen, todo = set(), list(graph[start] - {"nbbudget"})
    while todo:
        name = todo.pop()
        if name in seen or name == "nbbudget":
            continue  # the package re-exports everything: not a layer
        seen.add(name)
        todo += graph[name]
    assert start not in seen, f"{start} imports itself through {sorted(seen)}"
