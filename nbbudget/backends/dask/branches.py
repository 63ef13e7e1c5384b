"""A run on a Dask cluster (``nb.budget(..., cluster=client)``), as the run holds it: the
factory of its ledger on the scheduler, and its branches sent to the workers as tasks
(``run.parallel``, ``run.map``). `DaskCluster` is a `nbbudget.core.backends.Cluster`.

In each branch's task, ``nb.current()`` is a run that charges the same counters on the
scheduler (joined there with the run's `nbbudget.core.ledger.Branch`), with the time the run had
left when the branch was sent, and that stops when the run stops. A branch's function must be
one that Dask can ship (cloudpickle); inside it, reach the run with ``nb.current()``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from distributed import Client, Future

    from ...core.ledger import Branch
    from .ledger import OnCluster

__all__ = ["DaskCluster", "run_branch"]

_T = TypeVar("_T")
_groups = itertools.count(1)


class DaskCluster:
    """The cluster of *factory*'s client, as a run given it holds it: `ledger` keeps the run's
    counters on its scheduler, and `parallel` runs the run's branches on its workers. Made by
    the backend's ``RUNS.cluster`` (`nbbudget.backends.dask.DaskBackend.cluster`)."""

    def __init__(self, factory: OnCluster) -> None:
        self.factory = factory
        self.client: Client = factory.client

    @property
    def ledger(self) -> OnCluster:
        """The factory of the run's ledger on this cluster's scheduler."""
        return self.factory

    def parallel(self, join: Callable[[Branch], AbstractContextManager[Any]], branch: Branch,
                 items: Sequence[Callable[[], Any]], max_concurrency: int | None) -> list[Any]:
        """Run *items* as tasks on the workers, at most *max_concurrency* at a time (a new
        one submitted as each ends); in each, ``join(branch)`` is the run the branch charges.
        Each one's outcome in order: its value, or the exception it raised."""
        from distributed import as_completed

        group, todo = f"nbb-branch-{next(_groups)}-{id(branch):x}", list(enumerate(items))
        futures: dict[Future[Any], int] = {}
        running = as_completed()  # type: ignore[no-untyped-call]  # untyped in Dask

        def submit() -> None:
            index, fn = todo.pop(0)
            future = self.client.submit(run_branch, join, branch, fn, key=f"{group}-{index}",
                                        pure=False)
            futures[future] = index
            running.add(future)  # type: ignore[no-untyped-call]  # untyped in Dask

        for _ in range(min(len(todo), max_concurrency or len(todo))):
            submit()
        outcomes: list[Any] = [None] * len(items)
        for future in running:
            error = future.exception()
            outcomes[futures[future]] = error if error is not None else future.result()
            if todo:
                submit()
        return outcomes


def run_branch(join: Callable[[Branch], AbstractContextManager[Any]], branch: Branch,
               fn: Callable[[], _T]) -> _T:
    """A branch, in a task on a worker: *fn* inside the run that ``join(branch)`` makes."""
    with join(branch):
        return fn()
