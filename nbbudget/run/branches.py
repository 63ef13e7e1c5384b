"""Sub-agents and parallel branches of a run (S2-1..S2-3, S4-3, S4-11).

Every branch and every sub-agent draws on the run's counters: a permit is checked and reserved
atomically before dispatch, so two branches never get the same last one.

A run on a cluster (``nb.budget(..., cluster=client)``) sends its branches to the cluster's
workers as tasks (`parallel_on`): in each, ``nb.current()`` is a run that charges the same
counters on the scheduler, with the time the run had left when the branch was sent, and stops
when the run stops. A branch's function must be one that Dask can ship (cloudpickle); inside it,
reach the run with ``nb.current()``.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.backends import load
from ..core.errors import ConfigError
from ..core.kinds import KIND_INDEX

if TYPE_CHECKING:
    from distributed import Client

    from ..core.ledger import Branch
    from ..core.lowlevel import Run

__all__ = ["agent", "parallel", "parallel_on", "run_branch"]

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


def parallel_on(client: Client, run: Run, join: Callable[[Branch], AbstractContextManager[Any]],
                branches: Iterable[Callable[[], _T]], *, max_concurrency: int | None,
                max_items: int | None, return_exceptions: bool) -> list[Any]:
    """Run *branches* of *run* (a run on *client*'s cluster) as tasks on its workers, at most
    *max_concurrency* at a time; in each, ``join(branch)`` is the run the branch charges. Their
    results in order."""
    from distributed import as_completed

    core = run.lowlevel
    assert isinstance(core.ledger, load("dask", "ledger").DaskLedger)
    branch = core.ledger.branch(core.account, run.name, core.scope.remaining_ms())
    items = _checked(branches, max_concurrency, max_items)
    group, todo = f"nbb-branch-{next(_groups)}-{id(branch):x}", list(enumerate(items))
    futures: dict[Any, int] = {}
    running = as_completed()  # type: ignore[no-untyped-call]  # untyped in Dask
    for _ in range(min(len(todo), max_concurrency or len(todo))):
        _submit(client, join, branch, group, todo.pop(0), futures, running)
    outcomes: list[Any] = [None] * len(items)
    for future in running:
        error = future.exception()
        outcomes[futures[future]] = error if error is not None else future.result()
        if todo:
            _submit(client, join, branch, group, todo.pop(0), futures, running)
    return _results(outcomes, return_exceptions)


def _submit(client: Client, join: Callable[[Branch], AbstractContextManager[Any]],
            branch: Branch, group: str, item: tuple[int, Callable[[], Any]],
            futures: dict[Any, int], running: Any) -> None:
    index, fn = item
    future = client.submit(run_branch, join, branch, fn, key=f"{group}-{index}", pure=False)
    futures[future] = index
    running.add(future)


def run_branch(join: Callable[[Branch], AbstractContextManager[Any]], branch: Branch,
               fn: Callable[[], _T]) -> _T:
    """A branch, in a task on a worker: *fn* inside the run that ``join(branch)`` makes."""
    with join(branch):
        return fn()


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
