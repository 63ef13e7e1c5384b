"""The backends a run or a call can be given, loaded by name.

A run given ``cluster=`` and a call given ``cluster=`` reach the backend that serves it through
`load`, which imports ``nbbudget.backends.<name>`` on first use (the way anyio loads
``anyio._backends._<name>``): the core and the call layer never import a backend's modules, and
a user who never names a cluster never imports Dask.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: the backends nbbudget has, by the name `load` takes
NAMES = ("dask",)


def load(name: str, module: str = "") -> ModuleType:
    """The module *module* of the backend *name* (its package when *module* is empty), imported
    on first use. Used by `nbbudget.run` and `nbbudget.calls` where a cluster is given."""
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; nbbudget has {', '.join(NAMES)}")
    return importlib.import_module(f"nbbudget.backends.{name}" + (f".{module}" if module else ""))
