"""Runs and grants: the public facade over a ledger account, a scope and a trace recorder.

Rules: S2-1..S2-4, S3-1..S3-5, S4-3, S4-4.

A run (`Budget`) is a small facade: what it may spend and has spent is its account in a
ledger (`nbbudget.core.ledger`; a `LocalLedger` unless ``ledger=`` chooses), its stop, deadline
and pause are its `Scope` (`nbbudget.core.scope`), and its events go through its `Recorder`
(`nbbudget.core.trace`); `Core` (`nbbudget.core.lowlevel`) ties them together for the layers
above. A grant is the same facade over a child account and a child scope of its run.
``step()`` and ``charge(kind)`` take a permit from the account's pool with ``list.pop()``, which
is atomic: no lock, no clock.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, overload

from ..core.backends import load
from ..core.clock import Clock, default_clock
from ..core.duration import parse_duration
from ..core.endings import outcome_of
from ..core.errors import BudgetError, ConfigError
from ..core.kinds import CHARGE_INDEX as _CHARGE_INDEX
from ..core.kinds import KIND_INDEX, KINDS, RUN_MS, STEPS, kind_index
from ..core.ledger import (
    STATE_VERSION,
    Account,
    Ledger,
    LedgerFactory,
    LocalLedger,
    check_totals,
    read_state,
)
from ..core.limits import NO_LIMITS as _NO_LIMITS
from ..core.limits import Limits
from ..core.lowlevel import Core
from ..core.outcome import Outcome, Status
from ..core.scope import Scope, Stop, Unwind
from ..core.snapshot import AxisUsage, Snapshot
from ..core.trace import Trace
from .branches import agent as _agent
from .branches import parallel as _parallel
from .branches import parallel_on as _parallel_on
from .providers import make_provider
from .tools import make_tool

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

    from ..core.ledger import Branch

__all__ = ["STATE_VERSION", "Budget", "Deferred", "Grant", "Snapshot", "activate", "budget",
           "check_notices", "current", "set_ambient", "stop_error"]

_R = TypeVar("_R")
_INF = math.inf
_DEFAULT_NOTICES = (0.8, 0.95)
#: the attributes of a run that its parts provide (built on first use)
_NO_POOL: list[None] = []  # the pools of a run not built yet: always empty, never filled
_NO_POOLS: Sequence[list[None]] = (_NO_POOL,) * len(KINDS)
_P = TypeVar("_P")


class _Part(Generic[_P]):
    """A part of a run (its core, ledger, scope, account or trace), built the first time it is
    read: a run used for nothing costs almost nothing. Once built, the run's own attribute is
    read instead (no ``__getattr__``, which would slow every attribute of every run)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, run: None, owner: type) -> _Part[_P]: ...

    @overload
    def __get__(self, run: _Parts, owner: type) -> _P: ...

    def __get__(self, run: _Parts | None, owner: type) -> _P | _Part[_P]:
        if run is None:
            return self
        run._build_parts()  # its attributes now shadow this descriptor
        part: _P = object.__getattribute__(run, self.name)  # run.__dict__ would slow the run
        return part
_BUILDING = threading.Lock()  # a run's parts are built once, by one thread
_COMPLETED = Outcome(Status.COMPLETED)
_TIME = KINDS[RUN_MS].name  # the kind the run's clock spends

_current: contextvars.ContextVar[Budget | Deferred | None] = contextvars.ContextVar(
    "nbbudget_current", default=None
)


def current() -> Budget | None:
    """The innermost active budget of this thread or context, or `None`."""
    run = _current.get()
    if run is None:
        return _ambient() if _ambient is not None else None
    if run.__class__ is Budget:
        return run
    if isinstance(run, Deferred):  # a host's run made on first use: this is its first use
        return run.run
    return run


#: where `current` looks when no run was entered in this context (`set_ambient`)
_ambient: Callable[[], Budget | None] | None = None


def set_ambient(find: Callable[[], Budget | None] | None) -> None:
    """Install (or remove) where `current` finds the run of a context in which none was
    entered: a host whose work runs in a run it has not entered there (a call's work, whose
    run is made only if it is used) gives its own lookup."""
    global _ambient
    _ambient = find


def activate(run: Budget) -> None:
    """Make *run* what `current` returns in this context, its clock started, without a ``with``
    block: for a host that runs the parts of one long run each in a context of its own (the
    kernel runs each cell of a notebook in its own). The run is not settled this way."""
    run.lowlevel.scope.start()
    _current.set(run)


def stop_error(error: BaseException) -> BaseException:
    """*error* as a ``with run:`` block raises it when it leaves: a stop unwinding through user
    code becomes the public `BudgetError` it stands for; anything else is itself. For hosts
    that run a run's parts outside a ``with`` block (see `activate`)."""
    return error.stop.error() if isinstance(error, Unwind) else error


class _Parts:
    """What a run or grant holds, and the parts it is a facade over (its core, ledger, scope,
    account and trace), built the first time one is needed when nothing about the run is timed:
    a run used for nothing costs almost nothing (entering and leaving it only keep its times and
    its outcome). `Budget` is the facade; this is how it comes by its parts."""

    _core: _Part[Core] = _Part()
    _ledger: _Part[Ledger] = _Part()
    _scope: _Part[Scope] = _Part()
    _account: _Part[Account] = _Part()
    _trace: _Part[Trace] = _Part()
    _pools: Sequence[list[None]]
    _lazy: _Recipe | None
    _cluster: Client | None
    name: str
    _root: Budget
    _outcome: Outcome | None
    _began: float | None
    _ended: float | None
    _end_once: list[None]
    _now: Callable[[], float]

    def _open(self, name: str, root: Budget, parent: Budget | None, full: bool,
              now: Callable[[], float]) -> None:
        """What a run or grant holds of its own, beside its parts. Every run sets the same
        attributes in the same order, its parts last, so that they all share one layout of
        keys (a run whose keys came in another order would read each attribute slower)."""
        self.name = name
        self._root = root
        self._parent = parent
        self._cluster = None  # a run's on a cluster: where its branches go
        self._grants: list[Grant] = []
        self._outcome: Outcome | None = None
        self._output: Any = None
        self._tokens: list[contextvars.Token[Budget | None]] = []
        self._began: float | None = None  # when a run not yet built was entered, and left
        self._ended: float | None = None
        self._end_once: list[None] = _NO_POOL  # emptied by whichever thread traces its end
        self._lazy = None  # what builds the parts, until they are built
        self._now = now
        self._full = full
        self._pools, self._step_pool = _NO_POOLS, _NO_POOL  # until it is built

    def _take(self, recipe: _Recipe) -> None:
        """Build a run's parts now, or, when nothing about it is timed, on first use."""
        if recipe.lazy():
            self._lazy = recipe  # nothing is timed: build on first use (a charge, say)
        else:
            self._attach(recipe.build())

    def _attach(self, core: Core) -> None:
        """Take *core* (an account, a scope, a recorder) as this run's or grant's parts."""
        self._core, self._ledger = core, core.ledger
        self._scope, self._account, self._trace = core.scope, core.account, core.recorder.trace
        self._pools = core.account.pools
        self._step_pool = self._pools[STEPS]
        self._full = self._trace.full

    def _unbuilt(self) -> bool:
        return self._lazy is not None

    def _build_parts(self) -> None:
        """Build this run's parts now (once, whichever thread asks first), started and ended
        as the run was. A thread entering or leaving the run meanwhile, without the lock,
        looks again once it has written its time: one of the two sees the other's write."""
        with _BUILDING:
            recipe = self._lazy
            if recipe is None:
                return
            core = recipe.build()
            self._attach(core)
            self._lazy = None  # from now on, entering and leaving use the parts
            began = self._began
            if began is not None:
                core.scope.start_at(began)
            if self._outcome is not None:
                self._end_built()

    def _end_built(self) -> None:
        """Trace the end of a run that was left before its parts were built (once)."""
        try:
            self._end_once.pop()  # atomic: one of the builder and the leaving thread
        except IndexError:
            return
        outcome, ended = self._outcome, self._ended
        assert outcome is not None and ended is not None
        with self._scope.lock:
            self._core.end_at(outcome.to_dict(), ended)

    def _enter_unbuilt(self) -> None:
        """Enter a run whose parts are not built: only its start is kept."""
        if self._began is None:
            self._began = self._now()
        if self._lazy is None:  # built meanwhile: its builder may not have seen it
            self._scope.start_at(self._began)

    def _leave_unbuilt(self, ended: float | None = None) -> None:
        """Complete a run whose parts were never needed (nothing charged, stopped or granted),
        now or at *ended*: its end and outcome are kept, and traced if its parts are ever
        built."""
        if self._outcome is not None:
            return
        self._end_once = [None]
        self._ended = self._now() if ended is None else ended
        self._outcome = _COMPLETED  # written last: what a builder reads
        if self._lazy is None:  # built meanwhile: its builder may not have seen the end
            self._end_built()

    def _unbuilt_snapshot(self) -> Snapshot:
        """The view of a run whose parts are not built: it has spent nothing but time, and
        each armed axis stands at 0."""
        recipe = self._lazy
        assert recipe is not None
        axes = tuple(AxisUsage(kind, limit, 0, limit, 0.0)
                     for kind, limit in recipe.limits.to_dict().items())
        outcome = self._outcome
        status = outcome.status.value if outcome else (
            "running" if self._began is not None else "ready")
        return Snapshot(self.name, status, self._unbuilt_elapsed(), None, axes,
                        self._unbuilt_consumed(), 0, outcome)

    def _unbuilt_elapsed(self) -> float:
        began, ended = self._began, self._ended
        if began is None:
            return 0.0
        return (ended if ended is not None else self._now()) - began

    def _unbuilt_consumed(self) -> dict[str, float]:
        elapsed = self._unbuilt_elapsed()
        return {_TIME: round(elapsed)} if elapsed else {}


class Budget(_Parts):
    """A run: bounded work with limits, a time grant, a cancel signal and a trace.

    Use it as a context manager; its clock starts when it is entered::

        with nb.budget(steps=10, time="5s") as run:
            run.step()

    Python threads cannot be killed: a stop is delivered at the next ``step()``, ``charge()``
    or ``check()``, or through ``ctx.signal`` inside a tool. A tool that ignores its signal is
    abandoned (its caller is freed and the trace says so), not killed. ``ledger`` (low-level
    API) is the `LedgerFactory` of the place its counters are kept: this process by default;
    ``cluster`` (a ``distributed.Client`` or an address) keeps them on a Dask scheduler.
    """

    def __init__(self, limits: Limits | None = None, *, time: int | str | None = None,
                 clock: Clock | None = None, name: str | None = None, suspend: bool = False,
                 totals: Limits | None = None, notices: tuple[float, float] | None = (0.8, 0.95),
                 trace: str = "counts", ledger: LedgerFactory = LocalLedger, cluster: Any = None,
                 **limit_fields: Any) -> None:
        ledger, client = _on_cluster(cluster, ledger)
        recipe = _recipe(name, _combine(limits, time, limit_fields), clock, trace, suspend,
                         totals, notices, ledger)
        self._open(recipe.name, self, None, recipe.full, recipe.clock.now_ms)
        self._cluster = client
        self._take(recipe)

    @property
    def lowlevel(self) -> Core:
        """This run's parts (ledger account, scope, recorder), for the layers built on it: see
        `nbbudget.core.lowlevel`. Users need none of it."""
        return self._core

    # -- charging -----------------------------------------------------------------------------
    def charge(self, kind: str, n: float = 1, *, target: str | None = None) -> None:
        """Reserve *n* of *kind* atomically before dispatch (S4-3).

        A refusal raises `BudgetExceeded`, records ``dispatch_refused_budget_exceeded`` (S4-8)
        and leaves every counter as it was.
        """
        i = _CHARGE_INDEX.get(kind) if type(kind) is str else None
        if i is None or type(n) is not int or n < 0:
            i, n = kind_index(kind, chargeable=True), _amount(kind, n)
        if n == 1 and (target is None or not self._full):  # a full trace keeps each target
            try:
                self._pools[i].pop()
                return
            except IndexError:
                pass
        self._core.charge(i, n, target)

    def step(self) -> None:
        """Charge one step: ``charge("steps")``."""
        try:
            self._step_pool.pop()
        except IndexError:
            self._core.charge(STEPS, 1, None)

    def charge_many(self, amounts: Mapping[str, float], *, target: str | None = None) -> None:
        """Reserve several kinds at once, all or nothing (for a model reply's tokens and cost).

        When several would exceed their limit, the refusal names the first in the attribution
        order tokens > cost > turns > calls and steps > time (S3-3).
        """
        pairs = ((kind_index(k, chargeable=True), _amount(k, n)) for k, n in amounts.items())
        self._core.reserve(tuple(sorted(pairs, key=lambda item: KINDS[item[0]].rank)), target)

    # -- stopping and time --------------------------------------------------------------------
    def cancel(self, reason: Any = None) -> None:
        """Stop this run and every descendant (S2-3); idempotent and safe from any thread.

        The run settles as ``stopped``; every later check in it raises again.
        """
        message = f"{self.name} was stopped" + (f": {reason}" if reason is not None else "")
        self._scope.halt(Stop.of(Status.STOPPED, message, self._scope, reason=reason))

    def check(self) -> None:
        """Raise if this run is stopped, cut or out of time; otherwise do nothing."""
        if self._lazy is None:  # a run not built yet has no time grant and no stop
            self._scope.check()

    @property
    def cancelled(self) -> bool:
        """Whether the run has been stopped, cut or suspended."""
        return self._lazy is None and self._scope.stop is not None

    @property
    def remaining_ms(self) -> float | None:
        """Milliseconds of time grant left (`None` when no time grant applies)."""
        return None if self._lazy is not None else self._scope.remaining_ms()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop this run's clock while the block runs (waiting for a person, say): time spent
        paused is not counted in ``run_ms`` (S4-4). Only a run, not a grant, pauses."""
        self._scope.set_paused(True)
        try:
            yield
        finally:
            self._scope.set_paused(False)

    # -- entering and leaving --------------------------------------------------------------
    def __enter__(self) -> Budget:
        if self._outcome is not None:
            raise ConfigError(f"{self.name} has already ended ({self._outcome.status}); "
                              f"make a new budget for new work")
        if self._lazy is None:
            self._scope.start()
        else:
            self._enter_unbuilt()
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        if self._tokens:
            _current.reset(self._tokens.pop())
        if exc is None and self._lazy is not None:
            self._leave_unbuilt()
            return None
        outcome, error = self._scope.ending(exc, self._output) or (
            Outcome(Status.COMPLETED) if exc is None else outcome_of(exc, self._output), None)
        self._settle(outcome)
        if error is not None:
            error.outcome = outcome
            raise error from (exc if not isinstance(exc, Unwind) else None)
        if isinstance(exc, BudgetError) and exc.outcome is None:
            exc.outcome = outcome
        if isinstance(exc, Unwind) and exc.stop.origin is self._scope:
            return True  # a suspended run: the block was left at a resumable point
        return None

    def _settle(self, outcome: Outcome) -> None:
        scope = self._scope
        with scope.lock:
            if self._outcome is not None:
                return
            degraded = self._core.degraded or self._root._core.degraded
            if degraded is not None and outcome.degraded is None:
                outcome = dataclasses.replace(outcome, degraded=dict(degraded))
            self._outcome = outcome
            self._core.end(outcome.to_dict())
            open_grants = list(self._grants)
        for child in open_grants:  # grants still open end with their parent
            child._settle(dataclasses.replace(outcome, origin=outcome.origin or self.name))

    def set_output(self, output: Any) -> None:
        """Keep *output* (the work produced so far): a failed outcome carries it (S3-2)."""
        self._output = output

    @property
    def outcome(self) -> Outcome | None:
        """How the run ended, or `None` while it is active."""
        return self._outcome

    # -- grants and the helpers built on the run ------------------------------------------------
    def grant(self, *, time: int | str | None = None, name: str | None = None,
              **limit_fields: Any) -> Grant:
        """A child grant: its own step and call allowances (S2-2) and a deadline that never
        outlives this run's remaining time (S2-1). Its clock starts now."""
        return Grant(self, _combine(None, time, limit_fields), name)

    @overload
    def tool(self, fn: Callable[..., _R], *, name: str | None = None,
             max_silence: int | str | None = None) -> Callable[..., _R]: ...

    @overload
    def tool(self, fn: None = None, *, name: str | None = None,
             max_silence: int | str | None = None
             ) -> Callable[[Callable[..., _R]], Callable[..., _R]]: ...

    def tool(self, fn: Callable[..., _R] | None = None, *, name: str | None = None,
             max_silence: int | str | None = None) -> Any:
        """Decorate a tool: each call reserves a ``tool_calls`` permit, then runs on a worker
        thread, capped by this run's time (S2-6) and by *max_silence* (S2-5). A function with a
        ``ctx`` parameter receives a `ToolContext` (``ctx.signal``, ``ctx.progress(data)``)."""
        if fn is None:
            return lambda f: make_tool(self, f, name, max_silence)
        return make_tool(self, fn, name, max_silence)

    def provider(self, fn: Callable[..., _R] | None = None, *, name: str | None = None,
                 prices: Mapping[str, float] | None = None,
                 price: Callable[[Any], float] | None = None, retries: int = 0,
                 guardrail: int | str | None = None,
                 degrade: tuple[Callable[..., Any], float] | None = None) -> Any:
        """Decorate the function that calls a model. Each attempt (``retries`` included)
        reserves a ``provider_calls`` permit (S4-6); ``max_output_tokens`` is clamped to what
        remains (S2-9); the reply's usage (``input_tokens``, ``output_tokens``, ``cost_usd``, or a
        cost from ``prices={"input": usd_per_1k, "output": usd_per_1k}`` or ``price(usage)``) is
        charged after the fact, and a passed limit fails the run (S3-3). ``guardrail`` (default
        1 h, 0 off) cuts a call that does not answer (S3-8). A streamed reply is charged chunk by
        chunk and closed the moment a limit is passed (S3-9); one that fails after content is cut
        ``by="stream-error"``. ``degrade=(cheaper, fraction)`` switches to the cheaper model,
        once, past that fraction of the cost limit (S3-7)."""

        def wrap(f: Callable[..., _R]) -> Callable[..., _R]:
            return make_provider(self, f, name, prices, price, retries, guardrail, degrade)

        return wrap if fn is None else wrap(fn)

    def agent(self, name: str, *, time: int | str | None = None,
              **limit_fields: Any) -> Grant:
        """A sub-agent: counts one ``agent_invocations`` against the run (refused like any
        charge), then opens its own grant (S2-1, S2-2). Use it as a context manager; its outcome
        tells the caller how it ended, and a stopped sub-agent is never retried (S2-3)."""
        grant = _agent(self, name, time, limit_fields)
        assert isinstance(grant, Grant)
        return grant

    def parallel(self, branches: Iterable[Callable[[], _R]], *,
                 max_concurrency: int | None = None, max_items: int | None = None,
                 return_exceptions: bool = False) -> list[Any]:
        """Run *branches* (functions of no arguments) at once and return their results in
        order. All of them draw on this run's counters (S4-3). *max_concurrency* bounds the
        branches alive at once and *max_items* how many there may be (S4-11). The first error
        is raised once every branch has ended, unless *return_exceptions*. On a cluster
        (``cluster=``) each branch is a task on a worker, where ``nb.current()`` is this run."""
        on = self._root._cluster
        dispatch = _parallel if on is None else functools.partial(_parallel_on, on, self, join)
        return dispatch(branches, max_concurrency=max_concurrency, max_items=max_items,
                        return_exceptions=return_exceptions)

    def map(self, fn: Callable[[Any], _R], items: Iterable[Any], *,
            max_concurrency: int | None = None, max_items: int | None = None) -> list[_R]:
        """``fn(item)`` for each item, as parallel branches; the results in order."""
        return self.parallel([functools.partial(fn, item) for item in items],
                             max_concurrency=max_concurrency, max_items=max_items)

    # -- reading ----------------------------------------------------------------------------
    @property
    def limits(self) -> Limits:
        """The limits in force for this run (for a grant: its own allowances)."""
        return self._account.limits

    @property
    def trace(self) -> Trace:
        """The trace of the whole run, grants included."""
        return self._trace

    @property
    def consumed(self) -> dict[str, float]:
        """What was spent, by kind: on a run the run-wide totals, on a grant its own charges."""
        if self._lazy is not None:
            return self._unbuilt_consumed()
        return self._core.consumed()

    def remaining(self, kind: str) -> float:
        """What is left of *kind*: the smaller of this grant's own and the run's (``inf`` when
        nothing bounds it)."""
        return self._core.remaining(kind_index(kind))

    @property
    def notice_level(self) -> int:
        """0 before any approach notice, 1 after "start converging", 2 after "deliver now"."""
        return self._ledger.notice_level

    def snapshot(self) -> Snapshot:
        """A frozen view of this run now."""
        if self._lazy is not None:
            return self._unbuilt_snapshot()
        scope = self._scope
        axes = self._ledger.axes(self._account, scope.elapsed_ms(), self.remaining_ms)
        status = self._outcome.status.value if self._outcome else (
            "stopping" if scope.stop is not None else
            "running" if scope.started_ms is not None else "ready")
        return Snapshot(self.name, status, scope.elapsed_ms(), self.remaining_ms, axes,
                        self.consumed, self.notice_level, self._outcome)

    def usage(self) -> pd.DataFrame:
        """A pandas DataFrame, one row per armed axis: ``limit``, ``consumed``, ``remaining``,
        ``fraction``."""
        from ..core.frames import usage_frame

        return usage_frame(self.snapshot())

    # -- checkpoints (S3-1, S4-4) -------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The ledger state a checkpoint must hold: counters, active time, effective limits,
        totals and notices. JSON-serialisable; `Budget.resume` takes it back."""
        return self._ledger.state(self._scope.elapsed_ms())

    @classmethod
    def resume(cls, state: Mapping[str, Any], limits: Limits | None = None, *,
               clock: Clock | None = None, trace: str = "counts", cluster: Any = None,
               ledger: LedgerFactory = LocalLedger, **limit_fields: Any) -> Budget:
        """A run that continues from *state*: nothing is reset (S4-4). The saved and the given
        limits combine by minimum; with suspend, windows start fresh and totals stay frozen
        (S3-1). A state that lacks a field or has another version is refused unchanged (S4-5)."""
        saved = read_state(state)
        run = cls(Limits.from_json(saved["limits"]) & _combine(limits, None, limit_fields),
                  clock=clock, name=saved["name"], suspend=saved["suspend"],
                  totals=Limits.from_json(saved["totals"]) if saved["suspend"] else None,
                  notices=tuple(saved["notices"]) if saved["notices"] else None,
                  trace=trace, ledger=ledger, cluster=cluster)
        run._core.restore(saved)
        return run

    def __repr__(self) -> str:
        snap = self.snapshot()
        axes = ", ".join(f"{a.kind} {a.consumed}/{a.limit}" for a in snap.axes) or "unbounded"
        return f"<{type(self).__name__} {self.name!r} {snap.status}: {axes}>"


class Grant(Budget):
    """A child grant of a run (see `Budget.grant`): its own allowances, the run's shared
    counters, a deadline no later than its parent's, and its parent's cancellation."""

    def __init__(self, parent: Budget, limits: Limits, name: str | None) -> None:
        with parent._scope.lock:
            core = parent._core.grant(name, limits)
            self._open(core.name, parent._root, parent, core.recorder.trace.full,
                       core.clock.now_ms)
            self._attach(core)
            parent._grants.append(self)
        self._scope.start()

    def paused(self) -> Any:
        raise ConfigError(f"{self.name} is a grant; pause the run it belongs to")

    def state(self) -> dict[str, Any]:
        raise ConfigError(f"{self.name} is a grant; take the state of its run")

    def _settle(self, outcome: Outcome) -> None:
        super()._settle(outcome)
        parent = self._parent
        assert parent is not None
        with self._scope.lock:
            if self in parent._grants:
                parent._grants.remove(self)
        parent._scope.forget(self._scope)


class Deferred:
    """A run made the first time something uses it: for a host whose work may never use its
    run (a call of a function that never reads ``nb.current()``, which is most calls), so that
    such work pays for no run at all.

    `begin` starts it in the work's context: from then on `current` there makes it (begun at
    that moment) and returns it. `end` ends it as leaving a ``with run:`` block would, raising
    what that block would raise. `run` makes it from any thread (begun, and ended if it has
    ended, at the times it was); `made` says whether anything has. A run whose time is
    limited is made at once: its clock must run from its start. One lock makes a run once,
    whichever thread asks first; work that never used its run takes no lock. `note` keeps an
    event its host has to say about the run (a call's job detached): in its trace at once if
    the run is made, else when (if) it is, at the time it was noted, ahead of its end.
    """

    __slots__ = ("_began", "_clock", "_ended", "_limits", "_made", "_name", "_notes", "_notices",
                 "_token")
    #: makes a run once, whichever thread asks first (the maker may then build the run's
    #: parts, under `_BUILDING`: never taken the other way round)
    _making = threading.Lock()

    def __init__(self, limits: Limits, *, clock: Clock, name: str,
                 notices: tuple[float, float] | None = _DEFAULT_NOTICES,
                 began: float | None = None) -> None:
        self._limits, self._clock, self._name = limits, clock, name
        if notices is not _DEFAULT_NOTICES and notices != _DEFAULT_NOTICES:
            notices = check_notices(notices)
        self._notices = notices
        self._made: Budget | None = None
        self._began = began  # when its work began (None: when it is begun)
        self._ended: float | None = None
        self._token: contextvars.Token[Budget | Deferred | None] | None = None
        #: the events `note` kept for the run while it was not made: (kind, payload, the time
        #: on its clock); traced by `_make`, and never added to once the run is made
        self._notes: tuple[tuple[str, dict[str, Any], float], ...] = ()
        if limits.run_ms is not None:
            self._make()

    def made(self) -> Budget | None:
        """The run, if something has made it; None while nothing has used it."""
        return self._made

    @property
    def run(self) -> Budget:
        """The run, made now if nothing has used it yet."""
        made = self._made
        return made if made is not None else self._make()

    def note(self, kind: str, payload: dict[str, Any]) -> None:
        """Add an event of *kind* to the run's trace, stamped with the time now: at once if the
        run is made, else when (if) something makes it. For a host that has something to say
        about a run its work may never use (`nbbudget.calls.jobs.Job.note`: a call's job
        detached), without making the run for it."""
        at = self._clock.now_ms()
        with self._making:
            made = self._made
            if made is None:  # traced by `_make`, at its time
                self._notes = (*self._notes, (kind, payload, at))
                return
        made.lowlevel.record(kind, payload)

    def begin(self) -> None:
        """Start the run in this context: `current` returns it from now on."""
        self.__enter__()

    def __enter__(self) -> Deferred:
        made = self._made
        if made is not None:
            made.__enter__()
        elif self._began is None:
            self._began = self._clock.now_ms()
        self._token = _current.set(self)
        return self

    def end(self, exc: BaseException | None) -> bool | None:
        """End the run as leaving its ``with`` block with *exc* would (its outcome kept, a stop
        turned into the public error it stands for), and restore what `current` returned."""
        return self.__exit__(None, exc, None)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        made = self._made
        if made is None and exc is None:
            self._ended = self._clock.now_ms()
            made = self._made
            if made is None:  # nothing made it meanwhile: its maker will see the end
                return None
            with self._making:  # made meanwhile: once its maker is done, did it see the end?
                if made._outcome is not None:
                    return None
        run = made if made is not None else self.run
        return run.__exit__(type(exc) if exc is not None else None, exc,
                            exc.__traceback__ if exc is not None else None)

    def _make(self) -> Budget:
        with self._making:
            made = self._made
            if made is not None:
                return made
            run = Budget.__new__(Budget)
            recipe = _recipe(self._name, self._limits, self._clock, "counts", False, None,
                             self._notices, LocalLedger)
            run._open(recipe.name, run, None, False, recipe.clock.now_ms)
            run._take(recipe)
            # made late only when nothing about it is timed: its parts wait, as an entered
            # run's do, and it began (and ended) when its work did
            run._began = self._began
            notes = self._notes
            if notes:  # what was noted goes first, at its time: its parts are needed now
                core = run.lowlevel  # (built under `_BUILDING`, started when its work began)
                started = core.scope.started_ms
                for kind, payload, at in notes:
                    core.recorder.add(kind, 0.0 if started is None else at - started, payload)
                self._notes = ()
            self._made = run  # before reading the end: `end` looks again after writing it
            ended = self._ended
            if ended is not None:
                run._leave_unbuilt(ended)
        return run


class _Recipe(NamedTuple):
    """What builds a run's parts, checked (see `_recipe`)."""

    name: str
    limits: Limits
    clock: Clock
    full: bool
    suspend: bool
    totals: Limits
    notices: tuple[float, float] | None
    ledger: LedgerFactory

    def lazy(self) -> bool:
        """Whether the parts may wait for first use: nothing about the run is timed (no time
        grant, no full trace) and its counters are kept in this process."""
        return (self.ledger is LocalLedger and not self.full and self.limits.run_ms is None
                and self.totals.run_ms is None)

    def build(self) -> Core:
        return Core.run(self.name, self.limits, self.clock, full=self.full,
                        suspend=self.suspend, totals=self.totals, notices=self.notices,
                        ledger=self.ledger)


def _recipe(name: str | None, limits: Limits, clock: Clock | None, trace: str, suspend: bool,
            totals: Limits | None, notices: tuple[float, float] | None,
            ledger: LedgerFactory) -> _Recipe:
    """The recipe of a run from what `Budget` was given, each argument checked."""
    full = False if trace == "counts" else _trace_mode(trace)
    totals = _NO_LIMITS if totals is None else check_totals(totals, suspend)
    return _Recipe(name or "run", limits, clock if clock is not None else default_clock(), full,
                   bool(suspend), totals,
                   _DEFAULT_NOTICES if notices == _DEFAULT_NOTICES else check_notices(notices),
                   ledger)


def join(branch: Branch) -> Budget:
    """The run of a branch sent to a worker (see `Budget.parallel`): the same counters on the
    cluster's scheduler, the time the run had left, and the run's stop."""
    left = branch.remaining_ms
    return Budget(Limits.from_json(branch.limits), name=branch.name, notices=branch.notices,
                  time=None if left is None else max(1, math.ceil(left)),
                  ledger=load("dask", "ledger").joining(branch))


def budget(limits: Limits | None = None, **kwargs: Any) -> Budget:
    """A new run; the same arguments as `Budget`."""
    return Budget(limits, **kwargs)


# -- helpers --------------------------------------------------------------------------------
def _combine(limits: Limits | None, time: int | str | None, fields: dict[str, Any]) -> Limits:
    if time is None and not fields and type(limits) is Limits:
        return limits
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError(f"limits must be nb.Limits, not {type(limits).__name__}; "
                          f"pass fields as keywords (steps=10) or use Limits.from_json")
    unknown = [k for k in fields if k not in KIND_INDEX]
    if unknown:
        raise ConfigError(f"unknown limit {unknown[0]!r}; known limits are "
                          f"{', '.join(KIND_INDEX)} (and time=)")
    out = limits if limits is not None else _NO_LIMITS
    if fields:
        out = out & Limits(**fields)
    if time is not None:
        ms = parse_duration(time, field="time")
        if ms == 0:
            raise ConfigError("time=0 is not a time grant; use None for no time grant")
        out = out & Limits(run_ms=ms)
    return out


def _on_cluster(cluster: Any, ledger: LedgerFactory) -> tuple[LedgerFactory, Client | None]:
    """The ledger factory of a run, and the client of the cluster its branches go to."""
    if cluster is None:
        return ledger, None
    if ledger is not LocalLedger:
        raise ConfigError("give cluster= or ledger=, not both: cluster= chooses the ledger")
    factory = load("dask", "ledger").on_cluster(cluster)
    return factory, factory.client


def _amount(kind: str, n: object) -> float:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n >= 0 or n == _INF:
        raise ConfigError(f"charge({kind!r}, {n!r}): the amount must be a finite number >= 0")
    if KINDS[KIND_INDEX[kind]].integral and not float(n).is_integer():
        raise ConfigError(f"charge({kind!r}, {n!r}): {kind} are counted in whole numbers")
    return n


def check_notices(notices: object) -> tuple[float, float] | None:
    if notices is None or notices is False:
        return None
    if notices == _DEFAULT_NOTICES:
        return _DEFAULT_NOTICES
    if (not isinstance(notices, (tuple, list)) or len(notices) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in notices)):
        raise ConfigError(f"notices={notices!r}: give two thresholds (first, second), or None")
    first, second = float(notices[0]), float(notices[1])
    if not (0 < first <= second <= 1):
        raise ConfigError(f"notices={notices!r}: each threshold must be in (0, 1] and "
                          f"first <= second, e.g. (0.8, 0.95)")
    return first, second


def _trace_mode(mode: object) -> bool:
    if mode not in ("counts", "full"):
        raise ConfigError(f"trace={mode!r}: use 'counts' (the default) or 'full'")
    return mode == "full"

