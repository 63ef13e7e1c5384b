"""Runs and grants: the public facade over a ledger account, a scope and a trace recorder.

Rules: S2-1..S2-4, S3-1..S3-5, S4-3, S4-4.

A run (`Budget`) is a small facade over one state: `_Unbuilt` until something needs its parts
(it answers from its recipe and the times it was entered and left), then `_Built`, switched
once by `Budget._build`. A built run's parts: what it may spend and has spent is its account in
a ledger (`nbbudget.core.ledger`; a `LocalLedger` unless ``ledger=`` chooses), its stop,
deadline and pause are its `Scope` (`nbbudget.core.scope`), and its events go through its
`Recorder` (`nbbudget.core.trace`); `Core` (`nbbudget.core.lowlevel`) ties them together for
the layers above. A grant is the same facade, always built, over a child account and a child
scope of its run.
``step()`` and ``charge(kind)`` take a permit from the account's pool with ``list.pop()``, which
is atomic: no lock, no clock.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import operator
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, overload

from ..core import preempt as _preempt
from ..core.backends import load
from ..core.clock import Clock, default_clock
from ..core.duration import parse_duration
from ..core.endings import budget_cause, outcome_of
from ..core.errors import BudgetCut, BudgetError, Cancelled, ConfigError
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
from .prices import Given, PriceFn
from .providers import make_provider
from .tools import make_tool

if TYPE_CHECKING:
    import pandas as pd

    from ..core.backends import Cluster
    from ..core.ledger import Branch

__all__ = ["DEFAULT_NOTICES", "STATE_VERSION", "Budget", "Deferred", "Grant", "Snapshot",
           "activate", "budget", "check_notices", "current", "set_ambient", "set_on_end",
           "stop_error", "time_only"]

_R = TypeVar("_R")
_INF = math.inf
#: the approach-notice thresholds (S3-5) a run is given unless told otherwise; `nb.call`
#: (`nbbudget.calls.call`) passes this very tuple, so a run of a call tells it apart by identity
DEFAULT_NOTICES = (0.8, 0.95)
_NO_POOL: list[None] = []  # the pools of a run not built yet: always empty, never filled
_NO_POOLS: Sequence[list[None]] = (_NO_POOL,) * len(KINDS)
_BUILDING = threading.Lock()  # held while a run switches from unbuilt to built: once, by one thread
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
    run is made only if it is used) gives its own lookup. ``nbbudget.calls.call`` installs
    the lookup of the call running on this thread."""
    global _ambient
    _ambient = find


#: what is told when a run (never a grant) ends: `set_on_end`
_on_end: Callable[[Budget | Deferred, str, Trace | None], None] | None = None


def set_on_end(hook: Callable[[Budget | Deferred, str, Trace | None], None] | None) -> None:
    """Install (or remove) what is told, on the thread that ends it, when a run ends: the run
    (a `Deferred` whose run was never made, for a call whose work never used it), how it was
    run (``"run"``: a ``with`` block; ``"call"``: the work of a call) and its trace (None when
    its parts were never built: it spent nothing but time). Called once per run, after its
    outcome is kept, whatever the block raises; grants are not told. The hook must be cheap:
    ``nbbudget.calls.history`` installs one that queues the run for its background writer."""
    global _on_end
    _on_end = hook


def activate(run: Budget) -> None:
    """Make *run* what `current` returns in this context, its clock started, without a ``with``
    block: for a host that runs the parts of one long run each in a context of its own (the
    kernel runs each cell of a notebook in its own). The run is not settled this way.
    ``nbbudget.jupyter.kernel_run`` activates a notebook's run at the start of each cell."""
    run.lowlevel.scope.start()
    _current.set(run)


def _reset_current(tokens: list[contextvars.Token[Budget | Deferred | None]]) -> None:
    """Restore what `current` returned before this context's innermost entry into a run, whose
    *tokens* hold one per entry in every context: the last is this context's unless another
    thread or task entered the same run since (a worker that enters its cell's run)."""
    last = tokens[-1]
    try:
        _current.reset(last)
    except ValueError:  # made in another context: find this context's own
        for token in reversed(list(tokens)):
            try:
                _current.reset(token)
            except ValueError:
                continue
            tokens.remove(token)
            return
        raise
    tokens.remove(last)


def settle_escaped() -> list[str]:
    """Leave the runs of this thread whose block a stop left without the block's end running
    (CPython 3.13, `nbbudget.core.preempt.escaped`), innermost first, as their ``with``
    statements would have: each settled, what `current` returned before it restored. What
    happened to each, in a sentence with the error its block would have raised, for the
    caller to say: entering a run warns, the magics print it under the cell (after each cell,
    ``post_run_cell``)."""
    said: list[str] = []
    for entry in reversed(_preempt.escaped(threading.get_ident())):
        run = entry.owner
        if not isinstance(run, Budget) or entry.stop is None:
            continue
        try:
            run._leave(entry.stop.signal(), "run")
        except BudgetError as error:
            why = f": {type(error).__name__}: {error}"
        else:
            why = ""
        said.append(f"nbbudget: {run.name}'s block was left without its end running (CPython "
                    f"3.13 skips a function's handlers when a stop lands in a while loop's "
                    f"condition, CPython issue 130279); the run is ended now{why}")
    return said


def _settle_escaped_here() -> None:
    """Before this thread enters a run: end the runs a stop left without their block's end
    (`settle_escaped`), each with a warning at the ``with`` statement entering the new one."""
    if _preempt.escaped(threading.get_ident()):
        for text in settle_escaped():
            warnings.warn(text, RuntimeWarning, stacklevel=3)


def _named(exc: BaseException) -> str:
    """*exc*'s class as its library names it: ``litellm.InternalServerError``."""
    kind = type(exc)
    module = kind.__module__.split(".")[0]
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def time_only(run: Budget) -> tuple[str, float] | None:
    """What *run*'s snapshot would show when it shows nothing but its status and time: the
    status and the time run (ms) of a run whose parts were never built and that has no limits
    (no axes, nothing spent but time); None for any other run, whose `Budget.snapshot` says
    more. The magic's summary of a cell (``nbbudget.jupyter.panel.run_summary``) reads it: a
    snapshot, made for nothing more, cost a fifth of what ``%%budget`` added to a cell."""
    state = run._state
    if state.__class__ is not _Unbuilt:
        return None
    limits = state.recipe.limits
    if limits is not _NO_LIMITS and limits:
        return None
    _, status, elapsed = state.now()
    return status, elapsed


def stop_error(error: BaseException) -> BaseException:
    """*error* as a ``with run:`` block raises it when it leaves: a stop unwinding through user
    code becomes the public `BudgetError` it stands for; anything else is itself. For hosts
    that run a run's parts outside a ``with`` block (see `activate`):
    ``nbbudget.jupyter.kernel_run`` reads the budget error that ended a cell with it."""
    return error.stop.error() if isinstance(error, Unwind) else error


class _Unbuilt:
    """The state of a run whose parts are not built: its counters would be kept in this
    process and it is not traced in full, so until something needs the parts (a charge, a
    stop, a grant, its trace) it answers from its recipe and the times it was entered and left.
    It has spent nothing but time; nothing can have stopped it. A run with a time grant is
    built as it is entered, once its start is taken (`enter`): building counts inside its
    time, not before its clock starts (bench_preempt.py: the build was a third of how late a
    deadline's stop reached the ``except`` after the block).

    Entering and leaving write their times here without a lock, while another thread may be
    building the parts (`Budget._build`, under `_BUILDING`). The builder switches the run's
    state first and then reads these times; the entering or leaving thread writes its time
    first and then looks whether the state was switched, and if so hands the time over itself
    (`_Built.take_over`). One of the two sees the other's write.
    """

    __slots__ = ("began", "end_once", "ended", "outcome", "recipe")

    full = False  # a run traced in full is built at once
    pools = _NO_POOLS  # every charge misses the pool and takes the path that builds the parts
    core = None  # no parts yet: `Budget.lowlevel` builds them

    def __init__(self, recipe: _Recipe, began: float | None) -> None:
        self.recipe = recipe  # what builds the parts: checked, lazy() is True
        # when the run was entered, on its clock; None until then. Set once.
        self.began = began
        # when it was left, on its clock; None until then. Written before `outcome`.
        self.ended: float | None = None
        # how it ended: None until it is left; then COMPLETED, for a run that needed no parts
        # could neither be stopped nor fail. Written last when it is left: what a builder reads.
        self.outcome: Outcome | None = None
        # holds one item from when the run is left until its end is traced in its built parts;
        # whichever of the builder and the leaving thread pops it (atomic) traces the end
        self.end_once: list[None] = _NO_POOL

    @property
    def limits(self) -> Limits:
        return self.recipe.limits

    @property
    def clock(self) -> Clock:
        return self.recipe.clock

    def built(self, run: Budget) -> _Built:
        """The run's built state: its parts are built now."""
        return run._build(self)

    def check(self) -> None:
        return None  # no time grant, and nothing stopped it

    def cancelled(self) -> bool:
        return False

    def remaining_ms(self) -> float | None:
        return self.recipe.time_ms()  # not entered yet, or nothing is timed

    def enter(self, run: Budget) -> None:
        """The run's start is kept; a run with a time grant is built now, started then."""
        if self.began is None:
            self.began = self.recipe.clock.now_ms()
        # built meanwhile (its builder may not have seen the start), or timed: built now
        if run._state is not self or self.recipe.time_ms() is not None:
            self.built(run).take_over(run, self)

    def leave(self, run: Budget, exc: BaseException | None) -> bool | None:
        """A run left without an error completes with no parts built; an error needs them,
        to settle as a built run does."""
        if exc is not None:
            return self.built(run).leave(run, exc)
        self.complete(run, self.recipe.clock.now_ms())
        return None

    def complete(self, run: Budget, ended: float) -> None:
        """The run's work completed at *ended*: its end and outcome are kept here, and traced
        if its parts are ever built."""
        if self.outcome is not None:
            return
        self.end_once = [None]
        self.ended = ended
        self.outcome = _COMPLETED  # written last: what a builder reads
        if run._state is not self:  # built meanwhile: its builder may not have seen the end
            self.built(run).take_over(run, self)

    def elapsed_ms(self) -> float:
        began, ended = self.began, self.ended
        if began is None:
            return 0.0
        return (ended if ended is not None else self.recipe.clock.now_ms()) - began

    def consumed(self) -> dict[str, float]:
        elapsed = self.elapsed_ms()
        return {_TIME: round(elapsed)} if elapsed else {}

    def snapshot(self, run: Budget) -> Snapshot:
        """Each armed axis stands at 0: only time was spent."""
        armed = self.recipe.limits.to_dict()
        axes = tuple(AxisUsage(kind, limit, 0, limit, 0.0)
                     for kind, limit in armed.items()) if armed else ()
        outcome, status, elapsed = self.now()
        return Snapshot(run.name, status, elapsed, self.recipe.time_ms(), axes,
                        {_TIME: round(elapsed)} if elapsed else {}, 0, outcome)

    def now(self) -> tuple[Outcome | None, str, float]:
        """The run's outcome, its status and the time it has run (ms), each read once (the
        outcome first: it is written last when the run is left), as its snapshot shows them."""
        outcome, began, ended = self.outcome, self.began, self.ended
        if began is None:
            return outcome, (outcome.status.value if outcome else "ready"), 0.0
        elapsed = (ended if ended is not None else self.recipe.clock.now_ms()) - began
        return outcome, (outcome.status.value if outcome else "running"), elapsed


class _Built:
    """The state of a run or grant whose parts are built: its `Core` (what ties them together),
    its ledger and account (what it may spend and has spent), its scope (stop, deadline,
    pause) and its trace. It answers from its parts."""

    __slots__ = ("account", "core", "full", "ledger", "outcome", "pools", "scope", "trace")

    def __init__(self, core: Core) -> None:
        self.core = core
        self.ledger: Ledger = core.ledger
        self.account: Account = core.account
        self.scope: Scope = core.scope
        self.trace: Trace = core.recorder.trace
        self.full = self.trace.full  # a full trace keeps each charge's target
        self.pools: Sequence[list[None]] = core.account.pools  # a grant's stay empty
        # how the run ended; None while it is active. Written once, under the scope's lock.
        self.outcome: Outcome | None = None

    @property
    def limits(self) -> Limits:
        return self.account.limits

    @property
    def clock(self) -> Clock:
        return self.scope.clock

    def built(self, run: Budget) -> _Built:
        return self

    def check(self) -> None:
        self.scope.check()

    def cancelled(self) -> bool:
        return self.scope.stop is not None

    def remaining_ms(self) -> float | None:
        return self.scope.remaining_ms()

    def enter(self, run: Budget) -> None:
        self.scope.start()

    def leave(self, run: Budget, exc: BaseException | None) -> bool | None:
        """Settle the run (and its open grants) as its scope says the block ended, and raise
        the public error of a stop that came from it. Spending still under way is charged
        first (`Core.settle_held`)."""
        if self.core.held:
            self.core.settle_held()
        # nbbudget's error a library raised its own for (LiteLLM's InternalServerError for a
        # refusal, its MidStreamFallbackError for a stream's cut): the block ends as that error
        # would have, had it reached the block (a cut raised for the scope's stop is re-raised
        # as it is, with its salvage, not replaced by the stop's own error)
        wrapped = None
        if exc is not None and not isinstance(exc, (BudgetError, Unwind)):
            wrapped = budget_cause(exc)
        ending = self.scope.ending(exc if wrapped is None else wrapped, run._output)
        if wrapped is not None and exc is not None:
            told, error = ending or (outcome_of(wrapped, run._output), None)
            ending = dataclasses.replace(told, message=f"{told.message} (the caller got it as "
                                                       f"{_named(exc)})"), error or wrapped
            if wrapped.outcome is None:
                wrapped.outcome = ending[0]
        outcome, error = ending or (
            _COMPLETED if exc is None else outcome_of(exc, run._output), None)
        run._settle(outcome)
        if error is not None and error is wrapped:
            raise wrapped from None  # the block ends as nbbudget's error would have
        if error is not None:
            error.outcome = outcome
            raise error from (exc if not isinstance(exc, Unwind) else None)
        if isinstance(exc, BudgetError) and exc.outcome is None:
            exc.outcome = outcome
        if isinstance(exc, Unwind) and exc.stop.origin is self.scope:
            return True  # a suspended run: the block was left at a resumable point
        return None

    def end(self, outcome: Outcome, degraded: dict[str, str] | None) -> bool:
        """Keep *outcome* (with how the run degraded, S3-7) and trace it, lock held; False when
        the run has ended already."""
        if self.outcome is not None:
            return False
        if degraded is not None and outcome.degraded is None:
            outcome = dataclasses.replace(outcome, degraded=dict(degraded))
        self.outcome = outcome
        self.core.end(outcome.to_dict())
        return True

    def complete(self, run: Budget, ended: float) -> None:
        """The run's work completed at *ended*, a time before now: traced at that time."""
        with self.scope.lock:
            if self.outcome is None:
                self.outcome = _COMPLETED
                self.core.end_at(_COMPLETED.to_dict(), ended)

    def take_over(self, run: Budget, unbuilt: _Unbuilt) -> None:
        """Take what *run* kept while it was *unbuilt*: started when it was entered, and
        completed (traced once) when it was left. Called by the builder, and by a thread that
        entered or left while it built."""
        began = unbuilt.began
        if began is not None:
            self.scope.start_at(began)
        if unbuilt.outcome is None:
            return
        try:
            unbuilt.end_once.pop()  # atomic: one of the builder and the leaving thread
        except IndexError:
            return
        ended = unbuilt.ended
        assert ended is not None  # written before the outcome
        self.complete(run, ended)

    def consumed(self) -> dict[str, float]:
        return self.core.consumed()

    def snapshot(self, run: Budget) -> Snapshot:
        scope = self.scope
        remaining_ms = scope.remaining_ms()
        axes = self.ledger.axes(self.account, scope.elapsed_ms(), remaining_ms)
        outcome = self.outcome
        status = outcome.status.value if outcome else (
            "stopping" if scope.stop is not None else
            "running" if scope.started_ms is not None else "ready")
        return Snapshot(run.name, status, scope.elapsed_ms(), remaining_ms, axes,
                        self.core.consumed(), self.ledger.notice_level, outcome,
                        self.core.models())


#: what a run is now: its parts not built yet, or built
_State = _Unbuilt | _Built


class Budget:
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
                 preempt: bool = True, **limit_fields: Any) -> None:
        ledger, on = _on_cluster(cluster, ledger)
        recipe = _recipe(name, _combine(limits, time, limit_fields), clock, trace, suspend,
                         totals, notices, ledger)
        self._open(recipe.name, self, None, recipe.state(None), on, _preempt.checked(preempt))

    def _open(self, name: str, root: Budget, parent: Budget | None, state: _State,
              cluster: Cluster | None = None, preempt: bool = True) -> None:
        """What every run and grant holds, set in the same order each time so that they all
        share one layout of keys (a run whose keys came in another order would read each
        attribute slower)."""
        self.name = name
        self._root = root  # the run at the top; itself for a run
        self._parent = parent  # the run or grant a grant was made from; None for a run
        self._cluster = cluster  # a run's on a cluster: where its branches go
        self._grants: list[Grant] = []  # grants made from this one and still open
        self._output: Any = None  # the work's output so far, for a failed outcome (S3-2)
        self._tokens: list[contextvars.Token[Budget | Deferred | None]] = []  # one per entry
        # N-5: whether a stop interrupts the threads inside the run; those threads, one entry
        # each (`nbbudget.core.preempt`), fired by a listener on the scope once it is built
        self._preempt = preempt
        self._entries: list[_preempt.Entry] = []
        self._switch(state)

    def _build(self, unbuilt: _Unbuilt) -> _Built:
        """Switch this run from *unbuilt* to built, once, whichever thread asks first: the
        only place a run's state changes. What it kept before (when it was entered, and left)
        is taken over after the switch; a thread entering or leaving meanwhile, without the
        lock, looks again once it has written its time (see `_Unbuilt`)."""
        with _BUILDING:
            state = self._state
            if state is not unbuilt:  # another thread built it first
                return state.built(self)
            built = _Built(unbuilt.recipe.build())
            self._switch(built)
            built.take_over(self, unbuilt)
            for entry in list(self._entries):  # entered before: its stops reach them now
                built.scope.add_listener(entry.fire)
        return built

    def _switch(self, state: _State) -> None:
        """Make *state* what this run is (when it is made, and once more by `_build`)."""
        # what the run is now: `_Unbuilt` until something needs its parts, then `_Built`
        self._state = state
        # the hot path's copies of the state's pools and trace mode, so that ``step()`` reads
        # one attribute of the run: a run not built has only empty pools, and its first charge
        # takes the locked path, which builds it. Written after `_state`: a thread that finds
        # a pool empty finds the state it will be refilled from.
        self._pools, self._step_pool, self._full = state.pools, state.pools[STEPS], state.full
        self._core: Core | None = state.core  # what `lowlevel` reads, once built

    def _parts(self) -> _Built:
        """This run's built state, its parts built now if they were not."""
        return self._state.built(self)

    @property
    def lowlevel(self) -> Core:
        """This run's parts (ledger account, scope, recorder), for the layers built on it: see
        `nbbudget.core.lowlevel`. Users need none of it."""
        core = self._core  # read before every model request: one attribute, once built
        return core if core is not None else self._state.built(self).core

    # -- charging -----------------------------------------------------------------------------
    def charge(self, kind: str, n: float = 1, *, target: str | None = None) -> None:
        """Reserve *n* of *kind* atomically before dispatch (S4-3).

        A refusal raises `BudgetExceeded`, records ``dispatch_refused_budget_exceeded`` (S4-8)
        and leaves every counter as it was.
        """
        # the hot path, kept in this one function: a permit from the pool with list.pop()
        # (atomic: no lock, no clock); anything else takes the locked path in the run's core
        i = _CHARGE_INDEX.get(kind) if type(kind) is str else None
        if i is None or type(n) is not int or n < 0:
            i, n = kind_index(kind, chargeable=True), _amount(kind, n)
        if n == 1 and (target is None or not self._full):  # a full trace keeps each target
            try:
                self._pools[i].pop()
                return
            except IndexError:
                pass
        self._state.built(self).core.charge(i, n, target)

    def step(self) -> None:
        """Charge one step: ``charge("steps")``."""
        try:
            self._step_pool.pop()
        except IndexError:
            self._state.built(self).core.charge(STEPS, 1, None)

    def charge_many(self, amounts: Mapping[str, float], *, target: str | None = None) -> None:
        """Reserve several kinds at once, all or nothing (for a model reply's tokens and cost).

        When several would exceed their limit, the refusal names the first in the attribution
        order tokens > cost > turns > calls and steps > time (S3-3).
        """
        items = []
        for kind, n in amounts.items():
            i = _CHARGE_INDEX.get(kind) if type(kind) is str else None
            if i is None or type(n) is not int or n < 0:  # a float, or a name to check
                i, n = kind_index(kind, chargeable=True), _amount(kind, n)
            items.append((_RANKS[i], i, n))
        items.sort(key=_by_rank)  # stable: kinds of one rank keep the order given
        self._parts().core.reserve(tuple((i, n) for _, i, n in items), target)

    # -- stopping and time --------------------------------------------------------------------
    def cancel(self, reason: Any = None) -> None:
        """Stop this run and every descendant (S2-3); idempotent and safe from any thread.

        The run settles as ``stopped``; every later check in it raises again.
        """
        message = f"{self.name} was stopped" + (f": {reason}" if reason is not None else "")
        scope = self._parts().scope
        scope.halt(Stop.of(Status.STOPPED, message, scope, reason=reason))

    def check(self) -> None:
        """Raise if this run is stopped, cut or out of time; otherwise do nothing."""
        self._state.check()

    @property
    def cancelled(self) -> bool:
        """Whether the run has been stopped, cut or suspended."""
        return self._state.cancelled()

    @property
    def remaining_ms(self) -> float | None:
        """Milliseconds of time grant left (`None` when no time grant applies)."""
        return self._state.remaining_ms()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop this run's clock while the block runs (waiting for a person, say): time spent
        paused is not counted in ``run_ms`` (S4-4). Only a run, not a grant, pauses."""
        scope = self._parts().scope
        scope.set_paused(True)
        try:
            yield
        finally:
            scope.set_paused(False)

    # -- entering and leaving --------------------------------------------------------------
    def __enter__(self) -> Budget:
        _settle_escaped_here()
        self.enter_for()
        self.interrupt_here(sys._getframe(1))
        return self

    async def __aenter__(self) -> Budget:
        """``async with nb.budget(...)`` (N-6): the run is current in this task and in every
        task it starts; its deadline, a cancel and the panel's Stop cancel this task, and the
        block ends with the run's error, not ``CancelledError`` (as ``asyncio.timeout``)."""
        _settle_escaped_here()
        self.enter_for()
        self.interrupt_here(sys._getframe(1))
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        return self._leave(exc, "run")

    def enter_for(self) -> None:
        """Enter the run in this context as a ``with`` block would, without this thread being
        interrupted by its stop: for work that another thread will run and leave
        (``nbbudget.calls.call`` prepares a call's context so), which calls `interrupt_here`
        when it starts."""
        state = self._state
        if state.outcome is not None:
            raise ConfigError(f"{self.name} has already ended ({state.outcome.status}); "
                              f"make a new budget for new work")
        state.enter(self)
        self._tokens.append(_current.set(self))

    def interrupt_here(self, frame: FrameType | None = None) -> _preempt.Entry | None:
        """N-5: this thread is inside the run until it leaves it; a stop from elsewhere
        interrupts it (`nbbudget.core.preempt`), unless the run was made with
        ``preempt=False``. *frame*: the block's, when a coroutine's its task is cancelled
        (N-6). A run not built yet cannot be stopped: its builder listens for it (`_build`); if
        it was built meanwhile, both may: a stop fires once. The entry, which leaving the run
        closes (``nbbudget.calls.call`` closes it too, whatever happens)."""
        if not self._preempt:
            return None
        entry = _preempt.enter(self._state.clock, frame)
        self._adopt_entry(entry)
        return entry

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        return self._leave(exc, "run")

    def _leave(self, exc: BaseException | None, how: str) -> bool | None:
        """Leave the block with *exc*; once the outermost block of a run (not a grant) is left,
        the end is told to `set_on_end`'s hook, *how* saying how the run was run."""
        entry = self._entry_here() if self._entries else None
        late = self._release(entry, exc is None) if entry is not None else None
        tokens = self._tokens
        if tokens:
            _reset_current(tokens)
        try:
            return self._state.leave(self, exc)
        except (BudgetCut, Cancelled) as error:
            if late is not None and error.outcome is not None:
                error.args = (f"{error}; {late}", *error.args[1:])
            raise
        finally:
            if _on_end is not None and self._parent is None and not tokens:
                state = self._state
                _on_end(self, how, state.trace if state.__class__ is _Built else None)

    def _release(self, entry: _preempt.Entry, completed: bool) -> str | None:
        """The thread of *entry*, taken off `_entries`, is done with the run: no stop is raised
        in it any more. What the run's error adds when the thread went on long after its stop
        (C code, N-7); None when it did not, or nothing could stop the run."""
        _preempt.leave(entry)
        state = self._state
        if state.__class__ is not _Built:
            return None  # nothing could stop it
        scope = state.scope
        scope.remove_listener(entry.fire)
        return entry.late_note(scope.clock.now_ms(), scope.deadline_ms(), completed)

    def interrupt_done(self, entry: _preempt.Entry) -> None:
        """The thread of *entry* (from `interrupt_here`) is done with the run without leaving a
        block of it (a tool's worker, ``nbbudget.run.tools``): nothing more is raised in it."""
        with contextlib.suppress(ValueError):
            self._entries.remove(entry)
        self._release(entry, False)

    def stop_waits_ms(self) -> float | None:
        """N-5, N-7: how long a stop sent to a thread inside the run has waited without landing
        (past `nbbudget.core.preempt.LATE_MS`: the thread is inside a call Python cannot
        interrupt), or None. The panel says then what it waits for."""
        waits = [w for entry in list(self._entries) if (w := entry.waiting()) is not None]
        return max(waits) if waits else None

    def _entry_here(self) -> _preempt.Entry | None:
        """This thread's innermost entry into the run (this task's, on an event loop), taken
        off its list."""
        entries, here = self._entries, threading.get_ident()
        task: Any = False  # not looked up yet
        for i in range(len(entries) - 1, -1, -1):
            entry = entries[i]
            if entry.thread == here:
                if entry.task is not None:
                    if task is False:
                        task = _preempt.current_task()
                    if entry.task is not task:
                        continue
                return entries.pop(i)
        return None

    def _adopt_entry(self, entry: _preempt.Entry) -> None:
        """The thread of *entry* is inside this run (entered now, or before the run was made:
        the work of a call, `Deferred`): its stops reach that thread from now on. One that came
        before (its deadline passed while the thread was entering) is fired from the clock's
        timer: the listener, called at once in the entering thread, leaves it to a check."""
        self._entries.append(entry)
        entry.owner = self
        state = self._state
        if state.__class__ is _Built:
            scope = state.scope
            scope.add_listener(entry.fire)
            stop = scope.stop
            if stop is not None:
                scope.clock.call_at(scope.clock.now_ms(), functools.partial(entry.fire, stop))
            else:
                entry.arm(scope)

    def _completed_at(self, ended: float) -> None:
        """The work of this run completed at *ended* on its clock (a run made after its work
        ended, see `Deferred`): kept as leaving its block then would have."""
        self._state.complete(self, ended)

    def _settle(self, outcome: Outcome) -> None:
        """End this run or grant with *outcome* (once), and the grants still open with it."""
        parts = self._parts()
        with parts.scope.lock:
            degraded = parts.core.degraded or self._root._parts().core.degraded
            if not parts.end(outcome, degraded):
                return
            open_grants = list(self._grants)
        for child in open_grants:  # grants still open end with their parent
            child._settle(dataclasses.replace(outcome, origin=outcome.origin or self.name))

    def set_output(self, output: Any) -> None:
        """Keep *output* (the work produced so far): a failed outcome carries it (S3-2)."""
        self._output = output

    @property
    def outcome(self) -> Outcome | None:
        """How the run ended, or `None` while it is active."""
        return self._state.outcome

    # -- grants and the helpers built on the run ------------------------------------------------
    def grant(self, *, time: int | str | None = None, name: str | None = None,
              **limit_fields: Any) -> Grant:
        """A child grant: its own step and call allowances (S2-2) and a deadline that never
        outlives this run's remaining time (S2-1). Its clock starts now."""
        return Grant(self, _combine(None, time, limit_fields), name)

    def _adopt(self, grant: Grant) -> None:
        """*grant* was made from this run or grant (its scope's lock held): it ends with it."""
        self._grants.append(grant)

    def _forget(self, grant: Grant) -> None:
        """*grant* has ended: it no longer ends with this run or grant."""
        parts = self._parts()
        with parts.scope.lock:
            if grant in self._grants:
                self._grants.remove(grant)
        parts.scope.forget(grant._parts().scope)

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
                 prices: Given | None = None, price: PriceFn | None = None, retries: int = 0,
                 guardrail: int | str | None = None,
                 degrade: tuple[Callable[..., Any], float] | None = None) -> Any:
        """Decorate the function that calls a model. Each attempt (``retries`` included)
        reserves a ``provider_calls`` permit (S4-6); ``max_output_tokens`` is clamped to what
        remains (S2-9); the reply's usage (``input_tokens``, ``output_tokens``, optionally
        ``cache_read_tokens``, ``cache_write_tokens`` and ``cost_usd``) is charged after the
        fact, and a passed limit fails the run (S3-3). Its cost is ``prices=`` of the usage
        (``{"input": usd, "output": usd}`` per million tokens, a function of the usage, or
        ``"free"``; ``price=`` is the older name of a function) when given, else the cost the
        reply reports. ``guardrail`` (default 1 h, 0 off) cuts a call that does not answer
        (S3-8). A streamed reply is charged chunk by chunk and closed the moment a limit is
        passed (S3-9); one that fails after content is cut ``by="stream-error"``.
        ``degrade=(cheaper, fraction)`` switches to the cheaper model, once, past that fraction
        of the cost limit (S3-7)."""

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
        return self._state.limits

    @property
    def trace(self) -> Trace:
        """The trace of the whole run, grants included."""
        return self._parts().trace

    @property
    def consumed(self) -> dict[str, float]:
        """What was spent, by kind: on a run the run-wide totals, on a grant its own charges."""
        return self._state.consumed()

    def remaining(self, kind: str) -> float:
        """What is left of *kind*: the smaller of this grant's own and the run's (``inf`` when
        nothing bounds it)."""
        return self._parts().core.remaining(kind_index(kind))

    @property
    def notice_level(self) -> int:
        """0 before any approach notice, 1 after "start converging", 2 after "deliver now"."""
        return self._parts().ledger.notice_level

    def snapshot(self) -> Snapshot:
        """A frozen view of this run now."""
        return self._state.snapshot(self)

    def usage(self, by: str | None = None) -> pd.DataFrame:
        """A pandas DataFrame, one row per armed axis: ``limit``, ``consumed``, ``remaining``,
        ``fraction``.

        ``by="model"``: one row per provider and model this run (every grant's calls included)
        or grant called, in the order first called, indexed by ``provider`` and ``model``:
        ``calls``, every attempt (retries included) counted as it takes its ``provider_calls``
        permit before it is sent, so that they add up to ``provider_calls`` where every
        provider call is a model call (S4-6; an attempt that then fails counts too, as its
        permit is not refunded, S4-3); ``input_tokens`` (cached ones included) and
        ``output_tokens`` as the replies reported them; ``cost_usd`` as charged (NaN for a
        model no price was known for). No rows when no model was called. The calls counted
        are those of the model clients (``nb.instrument``), ``run.provider`` (provider
        ``unknown``, model its name, or the cheaper function's once degraded) and the
        LangChain, Agents SDK and pydantic-ai adapters. A run on a cluster (``cluster=``)
        counts the model calls made in this process, not those of its branches on workers.
        Anything else for *by* is a `ConfigError`."""
        from ..core.frames import models_frame, usage_frame

        if by is None:
            return usage_frame(self.snapshot())
        if by == "model":
            return models_frame(self.snapshot().models)
        raise ConfigError(f"usage(by={by!r}): give by='model' for one row per provider and "
                          f"model, or nothing for one row per armed axis")

    # -- checkpoints (S3-1, S4-4) -------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The ledger state a checkpoint must hold: counters, active time, effective limits,
        totals and notices. JSON-serialisable; `Budget.resume` takes it back."""
        parts = self._parts()
        state = parts.ledger.state(parts.scope.elapsed_ms())
        models = parts.core.models_state()
        if models:  # what it spent on each model (`usage(by="model")`), taken back too
            state["models"] = models
        return state

    @classmethod
    def resume(cls, state: Mapping[str, Any], limits: Limits | None = None, *,
               clock: Clock | None = None, trace: str = "counts", cluster: Any = None,
               ledger: LedgerFactory = LocalLedger, preempt: bool = True,
               **limit_fields: Any) -> Budget:
        """A run that continues from *state*: nothing is reset (S4-4). The saved and the given
        limits combine by minimum; with suspend, windows start fresh and totals stay frozen
        (S3-1). A state that lacks a field or has another version is refused unchanged (S4-5)."""
        saved = read_state(state)
        run = cls(Limits.from_json(saved["limits"]) & _combine(limits, None, limit_fields),
                  clock=clock, name=saved["name"], suspend=saved["suspend"],
                  totals=Limits.from_json(saved["totals"]) if saved["suspend"] else None,
                  notices=tuple(saved["notices"]) if saved["notices"] else None,
                  trace=trace, ledger=ledger, cluster=cluster, preempt=preempt)
        run._parts().core.restore(saved)
        return run

    def __repr__(self) -> str:
        snap = self.snapshot()
        axes = ", ".join(f"{a.kind} {a.consumed}/{a.limit}" for a in snap.axes) or "unbounded"
        return f"<{type(self).__name__} {self.name!r} {snap.status}: {axes}>"


class Grant(Budget):
    """A child grant of a run (see `Budget.grant`): its own allowances, the run's shared
    counters, a deadline no later than its parent's, and its parent's cancellation."""

    def __init__(self, parent: Budget, limits: Limits, name: str | None,
                 preempt: bool | None = None) -> None:
        """A grant of *parent*; *preempt* None: interruptible as *parent* is (N-5)."""
        parts = parent._parts()
        with parts.scope.lock:
            core = parts.core.grant(name, limits)
            state = _Built(core)
            self._open(core.name, parent._root, parent, state, None,
                       parent._preempt if preempt is None else preempt)
            parent._adopt(self)
        state.scope.start()

    def paused(self) -> Any:
        raise ConfigError(f"{self.name} is a grant; pause the run it belongs to")

    def state(self) -> dict[str, Any]:
        raise ConfigError(f"{self.name} is a grant; take the state of its run")

    def _settle(self, outcome: Outcome) -> None:
        super()._settle(outcome)
        parent = self._parent
        assert parent is not None
        parent._forget(self)


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

    __slots__ = ("_began", "_clock", "_ended", "_entry", "_limits", "_made", "_name", "_notes",
                 "_notices", "_preempt", "_token")
    #: makes a run once, whichever thread asks first (the maker may then build the run's
    #: parts, under `_BUILDING`: never taken the other way round)
    _making = threading.Lock()

    def __init__(self, limits: Limits, *, clock: Clock, name: str,
                 notices: tuple[float, float] | None = DEFAULT_NOTICES,
                 began: float | None = None, preempt: bool = True) -> None:
        self._limits, self._clock, self._name = limits, clock, name
        self._preempt = preempt  # N-5: a stop interrupts the thread the work runs on
        self._entry: _preempt.Entry | None = None  # that thread, while the run is not made
        if notices is not DEFAULT_NOTICES and notices != DEFAULT_NOTICES:
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
        self.enter_for()
        self.interrupt_here()
        return self

    def enter_for(self) -> None:
        """Start the run in this context for work that another thread will run and end: that
        thread calls `interrupt_here` when it starts (``nbbudget.calls.call``)."""
        made = self._made
        if made is not None:
            made.enter_for()
        elif self._began is None:
            self._began = self._clock.now_ms()
        self._token = _current.set(self)

    def interrupt_here(self) -> _preempt.Entry | None:
        """N-5: a stop of the run interrupts this thread until the run ends here (`end`); if
        the run is not made yet, from when it is (`_make`). None with ``preempt=False``."""
        if not self._preempt:
            return None
        made = self._made
        if made is None:
            with self._making:  # `_make` adopts the entry if it makes the run after this
                made = self._made
                if made is None:
                    entry = self._entry = _preempt.enter(self._clock)
                    return entry
        return made.interrupt_here()

    def end(self, exc: BaseException | None) -> bool | None:
        """End the run as leaving its ``with`` block with *exc* would (its outcome kept, a stop
        turned into the public error it stands for), and restore what `current` returned."""
        return self.__exit__(None, exc, None)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        entry = self._entry
        if entry is not None:
            _preempt.leave(entry)
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        made = self._made
        if made is None and exc is None:
            self._ended = self._clock.now_ms()
            made = self._made
            if made is None:  # nothing made it meanwhile: its maker will see the end
                if _on_end is not None:
                    _on_end(self, "call", None)
                return None
            with self._making:  # made meanwhile: once its maker is done, did it see the end?
                ended = made.outcome is not None
            if ended:
                if _on_end is not None:
                    _on_end(made, "call", None)
                return None
        run = made if made is not None else self.run
        return run._leave(exc, "call")

    def _make(self) -> Budget:
        with self._making:
            made = self._made
            if made is not None:
                return made
            run = Budget.__new__(Budget)
            recipe = _recipe(self._name, self._limits, self._clock, "counts", False, None,
                             self._notices, LocalLedger)
            # made late only when nothing about it is timed: its parts wait, as an entered
            # run's do, and it began (and ended) when its work did
            run._open(recipe.name, run, None, recipe.state(self._began), None, self._preempt)
            entry = self._entry
            if entry is not None and not entry.closed:
                run._adopt_entry(entry)
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
                run._completed_at(ended)
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
        """Whether the parts may wait: its counters are kept in this process and it is not
        traced in full. They wait for first use, or for the run to be entered when it has a
        time grant (`_Unbuilt`)."""
        return self.ledger is LocalLedger and not self.full

    def time_ms(self) -> float | None:
        """The run's time grant in full (its window, or its whole-run total if less), or None
        when it has none: what a run not entered yet has left."""
        window, total = self.limits.run_ms, self.totals.run_ms
        if window is None:
            return total
        return window if total is None else min(window, total)

    def state(self, began: float | None) -> _State:
        """The state a new run of this recipe starts in: unbuilt (begun at *began*, if given)
        when it may wait for first use, else built now."""
        return _Unbuilt(self, began) if self.lazy() else _Built(self.build())

    def build(self) -> Core:
        """The parts of a run of this recipe, new."""
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
                   DEFAULT_NOTICES if notices == DEFAULT_NOTICES else check_notices(notices),
                   ledger)


def join(branch: Branch) -> Budget:
    """The run of a branch sent to a worker (see `Budget.parallel`): the same counters on the
    cluster's scheduler, the time the run had left, and the run's stop."""
    left = branch.remaining_ms
    return Budget(Limits.from_json(branch.limits), name=branch.name, notices=branch.notices,
                  time=None if left is None else max(1, math.ceil(left)),
                  ledger=load("dask").joining(branch), preempt=False)


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


def _on_cluster(cluster: Any, ledger: LedgerFactory) -> tuple[LedgerFactory, Cluster | None]:
    """The ledger factory of a run, and the cluster its branches go to (None: this process's
    threads), from the run's ``cluster=`` (made ready by the backend that serves it)."""
    if cluster is None:
        return ledger, None
    if ledger is not LocalLedger:
        raise ConfigError("give cluster= or ledger=, not both: cluster= chooses the ledger")
    on = load("dask").cluster(cluster)
    return on.ledger, on


_RANKS = tuple(kind.rank for kind in KINDS)  # the attribution order of each kind index (S3-3)
_by_rank = operator.itemgetter(0)


def _amount(kind: str, n: object) -> float:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n >= 0 or n == _INF:
        raise ConfigError(f"charge({kind!r}, {n!r}): the amount must be a finite number >= 0")
    if KINDS[KIND_INDEX[kind]].integral and not float(n).is_integer():
        raise ConfigError(f"charge({kind!r}, {n!r}): {kind} are counted in whole numbers")
    return n


def check_notices(notices: object) -> tuple[float, float] | None:
    """*notices* as the two approach-notice thresholds (S3-5) a run takes, or None for none;
    else a `ConfigError` that says what to give. A run and a `Deferred` check their
    ``notices=`` with it; the ``%%budget`` magic (``nbbudget.jupyter.magics``) checks its
    ``--notices`` option with it before it makes the run."""
    if notices is None or notices is False:
        return None
    if notices == DEFAULT_NOTICES:
        return DEFAULT_NOTICES
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


# N-5: a stop is never raised inside nbbudget's own entering of a run (the block would be left
# without its end) or its leaving (which reads the stop anyway): it lands in the block
for _own in (Budget.__enter__, Budget.__aenter__, Budget.__exit__, Budget.__aexit__,
             Budget._leave, Deferred.__enter__, Deferred.__exit__, Deferred.end):
    _preempt.shield(_own.__code__)
