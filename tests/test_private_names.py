"""A leading underscore means "this module only": no module of nbbudget imports another's
private names or reads another's private attributes, and the modules import each other in no
circle, lazy imports included. The layers above the core use `nbbudget.core.lowlevel`.

The layers (``docs/architecture.md``) only look down: `nbbudget.core`, then `nbbudget.run`,
then `nbbudget.calls`, then `nbbudget.integrations` and `nbbudget.backends` (a backend is loaded
by name, `nbbudget.core.backends.load`, never imported from below), then `nbbudget.jupyter` and
`nbbudget.cli`, then the public modules (`nbbudget`, `nbbudget.testing`, `nbbudget.pydantic_ai`,
`nbbudget.dask`, `nbbudget.demo`). No module imports one of a higher layer, lazily or not.

A public name of an internal module (one of the layers' folders) that another module of the
package imports, or reads through the module (``from ..calls import store as _store``, then
``_store.home``), earns its place with a docstring: a function's or a class's own
(`ast.get_docstring`); for any other name (a constant, a table, an alias), a ``#:`` comment on
the line or lines right above its assignment or after it on its last line, the forms Sphinx's
autodoc reads. A name a module
takes from another and passes on is held to the docstring where it is defined."""

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


# -- public internal names have a docstring --------------------------------------------------------
def source_lines(module: str) -> list[str]:
    """The lines of *module*'s file (the comments the syntax tree leaves out)."""
    path = PACKAGE.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if is_package(module) else path.with_suffix(".py")
    return path.read_text(encoding="utf-8").splitlines()


def documented_names(module: str) -> dict[str, bool]:
    """The public names *module* defines at its top level, each with whether it is documented:
    a function or a class by its docstring, any other name by ``#:`` on the line above."""
    lines = source_lines(module)
    found: dict[str, bool] = {}
    for node in modules()[module].body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = ast.get_docstring(node) is not None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
            told = above.startswith("#:") or "  #: " in lines[node.end_lineno - 1]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found.setdefault(name.id, told)
    return {name: ok for name, ok in found.items() if not name.startswith("_")}


def taken_from() -> dict[str, dict[str, tuple[str, str]]]:
    """Per module, each name it imports from a module of the package: (that module, its name
    there)."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for name, tree in modules().items():
        mine = found.setdefault(name, {})
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = imported(name, node)
                for alias in node.names:
                    if source in modules() and f"{source}.{alias.name}" not in modules():
                        mine.setdefault(alias.asname or alias.name, (source, alias.name))
    return found


def used_across() -> set[tuple[str, str]]:
    """Every (module, name) of an internal module that another module imports or reads through
    the module, followed to the module that defines it."""
    mods, taken = modules(), taken_from()
    used: set[tuple[str, str]] = set()
    for name, tree in mods.items():
        aliases = {}  # a module imported as a name: from ..calls import store as _store
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = imported(name, node)
                used |= {(source, a.name) for a in node.names
                         if source in mods and f"{source}.{a.name}" not in mods}
                aliases |= {a.asname or a.name: f"{source}.{a.name}" for a in node.names
                            if f"{source}.{a.name}" in mods}
            elif isinstance(node, ast.Import):
                aliases |= {a.asname: a.name for a in node.names if a.asname and a.name in mods}
        used |= {(aliases[node.value.id], node.attr) for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                 and node.value.id in aliases}
    defined = set()
    for module, name in used:
        seen = set()
        while name in taken.get(module, {}) and (module, name) not in seen:
            seen.add((module, name))
            module, name = taken[module][name]  # passed on: held where it is defined
        defined.add((module, name))
    return {(module, name) for module, name in defined
            if layer(module) < PUBLIC_LAYER and not name.startswith("_")}


def undocumented() -> list[str]:
    docs = {module: documented_names(module) for module in modules()}
    return sorted(f"{module}.{name}" for module, name in used_across()
                  if docs[module].get(name) is False)


def test_every_public_name_another_module_uses_has_a_docstring() -> None:
    assert undocumented() == [], "say in a docstring (or a #: comment) who uses it and why"


def test_the_docstring_check_finds_a_public_name_used_elsewhere_without_one(monkeypatch) -> None:
    source = ('def told():\n    """Used by b."""\n\ndef bare():\n    pass\n\n'
              'class Shape:\n    x = 1\n\n#: the limit b reads\nLIMIT = 3\nTABLE = {}\n'
              'ROWS = (  # what b reads\n    1,\n)\nCOLS = (\n    2,\n)  #: what b reads\n\n'
              'def unused():\n    pass\n')
    fake = {
        "nbbudget.core.a": source,
        "nbbudget.core.relay": "from .a import bare as passed\n",
        "nbbudget.run.b": ("from ..core.a import told, LIMIT, ROWS, COLS\n"
                           "from ..core import a\n\na.TABLE\n"
                           "from ..core.relay import passed\n\n"
                           "def f():\n    from ..core.a import Shape\n"),
    }
    monkeypatch.setitem(globals(), "modules", lambda: {m: ast.parse(s) for m, s in fake.items()})
    monkeypatch.setitem(globals(), "source_lines", lambda module: fake[module].splitlines())
    assert undocumented() == ["nbbudget.core.a.ROWS", "nbbudget.core.a.Shape",
                              "nbbudget.core.a.TABLE", "nbbudget.core.a.bare"]
