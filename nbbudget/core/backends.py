"""The backends a run or a call can be given, loaded by name.

A run given ``cluster=`` and a call given ``cluster=`` reach the backend that serves it by its
name, which imports the package ``nbbudget.backends.<name>`` on first use (the way anyio loads
``anyio._backends._<name>`` and reads its ``backend_class``): the core and the call layer never
import a backend's modules, and a user who never names a cluster never imports Dask.

A backend package offers each layer what that layer needs of it, as an object typed by a
protocol of that layer, at module level: ``RUNS``, a `ClusterRuns` (this module's: what a run
needs), read by `load`; and ``CALLS``, a ``nbbudget.calls.clusters.ClusterCalls`` (what a call
needs), read by ``nbbudget.calls.clusters.load_calls``. The package assigns each to a name
annotated with its protocol, so ``mypy --strict`` checks there that the backend implements it
in full (``nbbudget/backends/dask/__init__.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, Protocol

from .ledger import Branch, LedgerFactory

#: the backends nbbudget has, by the name `load` takes
NAMES = ("dask",)


class Cluster(Protocol):
    """A cluster a run was given (``nb.budget(..., cluster=...)``), connected: the ledger
    factory of the run's counters there, and the place its branches run. Made by
    `ClusterRuns.cluster`; held by the run (`nbbudget.run.budget.Budget`) for its
    ``parallel`` and ``map``."""

    @property
    def ledger(self) -> LedgerFactory:
        """The factory of the run's ledger, kept on the cluster."""

    def parallel(self, join: Callable[[Branch], AbstractContextManager[Any]], branch: Branch,
                 items: Sequence[Callable[[], Any]], max_concurrency: int | None) -> list[Any]:
        """Run each of *items* (checked functions of no arguments) as a task on the cluster's
        workers, at most *max_concurrency* at a time, inside the run ``join(branch)`` makes
        there (*branch*: what the run's `nbbudget.core.ledger.ClusterLedger` gave); each
        one's outcome in order: its value, or the exception it raised."""


class ClusterRuns(Protocol):
    """What a run needs of a cluster backend (``RUNS`` of its package, read by `load`):
    `nbbudget.run.budget` makes a run on a cluster and joins a branch's run on a worker."""

    def cluster(self, cluster: object) -> Cluster:
        """The cluster *cluster* names (what the backend's users give ``cluster=``: for Dask a
        ``distributed.Client`` or a scheduler address), connected; `ConfigError` for a value
        that names none."""

    def joining(self, branch: Branch) -> LedgerFactory:
        """The ledger factory of a branch's run, in a task on a worker: it charges the run's
        counters on the cluster, at *branch*'s place."""


def package(name: str) -> ModuleType:
    """The package of the backend *name*, imported on first use. Read by `load` here and by
    ``nbbudget.calls.clusters.load_calls``, for the object each layer takes from it."""
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; nbbudget has {', '.join(NAMES)}")
    return importlib.import_module(f"nbbudget.backends.{name}")


def load(name: str) -> ClusterRuns:
    """What a run needs of the backend *name* (its package's ``RUNS``, checked against
    `ClusterRuns` where the package defines it). Used by `nbbudget.run` where a run is given
    a cluster, and where a branch's run is joined on a worker."""
    runs: ClusterRuns = package(name).RUNS
    return runs
