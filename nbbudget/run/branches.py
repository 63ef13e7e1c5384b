"""Sub-agents and parallel branches of a run (S2-1..S2-3, S4-3, S4-11).

Every branch and every sub-agent draws on the run's counters: a permit is checked and reserved
atomically before dispatch, so two branches never get the same last one.

A run on a cluster (``nb.budget(..., cluster=client)``) sends its branches to the cluster
(`parallel_on`), which runs them where it runs work (`nbbudget.core.backends.Cluster`; Dask: as
tasks on its workers): in each, ``nb.current()`` is a run that charges the same counters on the
cluster, with the time the run had left when the branch was sent, and stops when the run stops.
What the branch needs of its run there comes from the run's ledger, asked for what only a
ledger on a cluster does (`nbbudget.core.ledger.ClusterLedger`, through ``Ledger.cluster``). A
branch's function must be one the cluster can ship (for Dask, cloudpickle); inside it, reach the
run with ``nb.current()``.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from ..core import preempt
from ..core.errors import ConfigError
from ..core.kinds import KIND_INDEX

if TYPE_CHECKING:
    from ..core.backends import Cluster
    from ..core.ledger import Branch
    from ..core.lowlevel import Run

__all__ = ["agent", "parallel", "parallel_on"]

_T = TypeVar("_T")
_AGENTS = KIND_INDEX["agent_invocations"]
_groups = itertools.count(1)


def agent(run: Run, name: str, time: int | str | None, fields: dict[str, Any]) -> Run:
    """Count one ``agent_invocations`` on the run (refused like any charge), then open the
    sub-agent's own grant."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"agent({name!r}): name the sub-agent with a non-empty string")
    run.lowlevel.charge(_AGENTS, 1, f"agent:{name}")
    return run.grant(time=time, name=name, **fields)


def parallel(branches: Iterable[Callable[[], _T]], *,
             max_concurrency: int | None, max_items: int | None,
             return_exceptions: bool) -> list[Any]:
    """Run *branches* at once, at most *max_concurrency* alive at a time, each in the caller's
    context (``nb.current()`` is the run); their results in order."""
    items = _checked(branches, max_concurrency, max_items)
    if not items:
        return []
    workers = min(len(items), max_concurrency or len(items))
    prefix = f"nbbudget-branch-{next(_groups)}"
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix) as pool:
        futures = [pool.submit(contextvars.copy_context().run, item) for item in items]
        outcomes: list[Any] = []
        for future in futures:
            error = future.exception()
            outcomes.append(error if error is not None else future.result())
    return _results(outcomes, return_exceptions)


def parallel_on(cluster: Cluster, run: Run,
                join: Callable[[Branch], AbstractContextManager[Any]],
                branches: Iterable[Callable[[], _T]], *, max_concurrency: int | None,
                max_items: int | None, return_exceptions: bool) -> list[Any]:
    """Run *branches* of *run* (a run given *cluster*) on the cluster, at most
    *max_concurrency* at a time; in each, ``join(branch)`` is the run the branch charges,
    *branch* what the run's ledger on the cluster says of it. Their results in order."""
    core = run.lowlevel
    on_cluster = core.ledger.cluster
    if on_cluster is None:
        raise ConfigError(f"{run.name} keeps its counters in this process: its branches cannot "
                          f"run on a cluster; make the run with cluster=")
    branch = on_cluster.branch(core.account, run.name, core.scope.remaining_ms())
    items = _checked(branches, max_concurrency, max_items)
    outcomes = cluster.parallel(join, branch, items, max_concurrency)
    return _results(outcomes, return_exceptions)


def _checked(branches: Iterable[Callable[[], _T]], max_concurrency: int | None,
             max_items: int | None) -> Sequence[Callable[[], _T]]:
    items: Sequence[Callable[[], _T]] = list(branches)
    _check_bound("max_concurrency", max_concurrency)
    _check_bound("max_items", max_items)
    if max_items is not None and len(items) > max_items:
        raise ConfigError(f"{len(items)} branches exceed max_items={max_items}; split the work "
                          f"or raise max_items")
    for item in items:
        if not callable(item):
            raise ConfigError(f"parallel() takes functions of no arguments, not {item!r}")
    return items


def _results(outcomes: list[Any], return_exceptions: bool) -> list[Any]:
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors and not return_exceptions:
        raise errors[0]
    return outcomes


def _check_bound(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive integer, or None for no bound")


# N-5: the thread waiting for a run's branches on a cluster is not interrupted: the stop is
# pushed to the branches, which stop at their next check and answer; the wait then returns
# their results, and the run's block raises the stop
preempt.guard(parallel_on.__code__)
