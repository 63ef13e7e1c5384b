"""Runs and grants: the ledger, the grant tree, cancellation and time.

Rules: S2-1..S2-4, S3-1..S3-5, S4-3, S4-4.

A run (`Budget`) owns one lock, the run-wide counters and the trace; its grants share them and
keep their own allowances beside them. A run reserves permits of each whole-number kind ahead,
in blocks, into a pool per kind, and ``step()`` or ``charge(kind)`` takes one with ``list.pop()``,
which is atomic: no lock, no clock. Everything else goes through one check-and-reserve path
driven by the table of kinds, under the lock; a refusal leaves the counters untouched and is
raised after the lock is released, and once a limit is spent for good, refusals need no lock at
all. Time never costs a clock read per step: each deadline is a callback on the run's clock that
sets the run's stop flag.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex, TypeVar, overload

from ._clock import Clock, MonotonicClock, Scheduled, default_clock
from ._duration import parse_duration
from ._errors import BudgetCut, BudgetError, BudgetExceeded, Cancelled, ConfigError
from ._kinds import CHARGE_INDEX as _CHARGE_INDEX
from ._kinds import KIND_INDEX, KINDS, RUN_MS, STEPS, kind_index
from ._limits import NO_LIMITS as _NO_LIMITS
from ._limits import Limits
from ._outcome import Outcome, Status
from ._trace import _GIL, _ROW, EVENT_KINDS, REFUSED, Trace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Budget", "Grant", "Snapshot", "activate", "budget", "current", "stop_error"]

_R = TypeVar("_R")
_INF = math.inf
_DEFAULT_NOTICES = (0.8, 0.95)
_K = len(KINDS)
_WINDOW_KINDS = frozenset(KIND_INDEX[k] for k in ("tokens", "cost_usd", "run_ms"))
_POOLED = tuple(k.integral and k.name != "run_ms" for k in KINDS)
_BLOCK = 256  # permits a pool reserves at a time
_PERMITS: list[None] = [None] * _BLOCK
_REFUSED_CODE = EVENT_KINDS.index(REFUSED)
_ROOT_CAP = tuple(_INF if pooled else -_INF for pooled in _POOLED)  # with no limit: pool freely
_NO_CAP = (-_INF,) * _K
STATE_VERSION = "nbbudget-ledger-v1"

_current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "nbbudget_current", default=None
)


def current() -> Budget | None:
    """The innermost active budget of this thread or context, or `None`."""
    return _current.get()


def activate(run: Budget) -> None:
    """Make *run* what `current` returns in this context, its clock started, without a ``with``
    block: for a host that runs the parts of one long run each in a context of its own (the
    kernel runs each cell of a notebook in its own). The run is not settled this way."""
    run._start_clock()
    _current.set(run)


def stop_error(error: BaseException) -> BaseException:
    """*error* as a ``with run:`` block raises it when it leaves: a stop unwinding through user
    code becomes the public `BudgetError` it stands for; anything else is itself. For hosts
    that run a run's parts outside a ``with`` block (see `activate`)."""
    return error.stop.error() if isinstance(error, _Unwind) else error


class _Incomplete(BaseException):
    """Unwinds work whose call ran out of budget at a checkpoint: the run ends ``incomplete``."""


class _Unwind(BaseException):
    """Unwinds a stopped run through user code that catches ``Exception``; the run that owns the
    stop turns it into a public error when its ``with`` block ends."""

    def __init__(self, stop: _Stop) -> None:
        super().__init__(stop.message)
        self.stop = stop

    def _render_traceback_(self) -> list[str]:
        """How IPython shows a stop that reached the top of a cell, where no ``with`` block
        turned it into its public error (a run made current with `activate`): that error, in
        one line."""
        error = self.stop.error()
        return [f"{type(error).__name__}: {error}"]


#: the trace event of a stop, by its status: a person's cancel is only requested (the work sees
#: it at its next check: ``cancel_observed``); the wall clock cancels the call at once
_STOP_EVENTS = {Status.STOPPED: "cancel_requested", Status.CANCELLED: "cancelled",
                Status.FAILED: "cut", Status.SUSPENDED: "suspended"}


@dataclass(frozen=True)
class _Stop:
    """Why a run stopped: kept as data, first one wins, every later check raises it again."""

    status: Status
    cause: str
    by: str | None
    code: str
    message: str
    origin: Budget
    reason: Any = None
    #: the limit's kind, the limit and what was consumed, for a cut by a limit (S4-8)
    figures: tuple[str, float, float] | None = None

    def signal(self) -> _Unwind:
        """What is raised into the work at a check; the work observes a cancel here."""
        if self.status in (Status.STOPPED, Status.CANCELLED):
            self.origin._observed(self)
        return _Unwind(self)

    def error(self) -> BudgetError:
        if self.status is Status.FAILED:
            return BudgetCut(self.by or "timeout", self.message)
        if self.status is Status.SUSPENDED:
            return BudgetCut("window", self.message)
        return Cancelled(self.message, self.reason)

    def outcome(self, run: Budget, output: Any) -> Outcome:
        origin = self.origin.name if self.origin is not run else None
        return Outcome(self.status, self.cause, self.by, self.code, self.message,
                       output if self.status is Status.FAILED else None, origin)


@dataclass(frozen=True)
class AxisUsage:
    """One armed axis of a run at one moment."""

    kind: str
    limit: float
    consumed: float
    remaining: float
    fraction: float


@dataclass(frozen=True)
class Snapshot:
    """A frozen view of a run, for the panel, the DataFrame and the repr alike."""

    name: str
    status: str
    elapsed_ms: float
    remaining_ms: float | None
    axes: tuple[AxisUsage, ...]
    consumed: Mapping[str, float]
    notice_level: int
    outcome: Outcome | None


class Budget:
    """A run: bounded work with limits, a time grant, a cancel signal and a trace.

    Use it as a context manager; its clock starts when it is entered::

        with nb.budget(steps=10, time="5s") as run:
            run.step()

    Python threads cannot be killed: a stop is delivered at the next ``step()``, ``charge()``
    or ``check()``, or through ``ctx.signal`` inside a tool. A tool that ignores its signal is
    abandoned (its caller is freed and the trace says so), not killed.
    """

    _parent: Budget | None = None

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        time: int | str | None = None,
        clock: Clock | None = None,
        name: str | None = None,
        suspend: bool = False,
        totals: Limits | None = None,
        notices: tuple[float, float] | None = (0.8, 0.95),
        trace: str = "counts",
        **limit_fields: Any,
    ) -> None:
        self.name = name or "run"
        self._limits = _combine(limits, time, limit_fields)
        self._clock = clock if clock is not None else default_clock()
        self._lock = threading.Lock()
        self._root = self
        self._trace = Trace(full=_trace_mode(trace), name=self.name)
        self._trace._stats_source = self._stats
        self._limits_set = self._limits.to_dict()
        self._trace.limits = dict(self._limits_set)
        self._run_id = self._trace.run_index(self.name)
        self._counts: list[float] = [0] * _K
        self._bulk: list[float] = [0] * _K  # amounts beyond one per charge: ops = used - bulk
        self._exhausted = [False] * _K
        self._suspend = bool(suspend)
        self._totals = _check_totals(totals, suspend)
        self._totals_set = {} if self._totals is _NO_LIMITS else self._totals.to_dict()
        self._total = [self._totals_set.get(k.name) for k in KINDS]
        self._base: list[float] = [0] * _K
        self._notices = _check_notices(notices)
        self._trace.notices = list(self._notices or ())
        self._notice_level = 0
        self._active_before_ms = 0.0
        self._init_common()
        self._arm_thresholds()

    _degraded: dict[str, str] | None = None  # S3-7: set once, when the run degrades

    def _init_common(self) -> None:
        self._full = full = self._root._trace.full
        traced = full and self is self._root  # a grant's pools stay empty: it charges locked
        self._pools: list[list[None]] = [_TracedPool(self, i) if traced else []
                                         for i in range(_K)]
        self._step_pool = self._pools[STEPS]
        self._stop: _Stop | None = None
        self._started_ms: float | None = None
        self._paused_at: float | None = None
        self._timers: list[Scheduled] = []
        self._children: list[Grant] = []
        self._listeners: list[Callable[[_Stop], None]] = []
        self._unobserved: list[None] = [None]  # emptied when the work first observes a cancel
        self._outcome: Outcome | None = None
        self._output: Any = None
        self._tokens: list[contextvars.Token[Budget | None]] = []

    # -- the hot path --------------------------------------------------------------------------
    # A run reserves permits of each whole-number kind in blocks, into a pool (a list) per kind.
    # ``step()`` and ``charge(kind)`` take one with ``list.pop()``: a single atomic operation, no
    # lock, no clock. Everything else (a refill, an amount other than 1, a notice to give, a full
    # trace, a refusal, a grant) goes through the locked path below. Consumption is
    # ``_counts - len(pool)``; a pool never holds permits past the limit or the next notice.
    def _arm_thresholds(self) -> None:
        """Recompute, per kind: ``_thr`` (the count that may be reached), ``_watch`` (the use at
        which the next notice is due) and ``_cap`` (how far the pool may reserve ahead)."""
        limits, totals = self._limits_set, self._totals_set
        root = self is self._root
        thr = [_INF] * _K
        watch = [_INF] * _K
        cap = list(_ROOT_CAP if root else _NO_CAP)
        for name in limits.keys() | totals.keys():
            i = KIND_INDEX[name]
            window = limits.get(name)
            thr[i] = min(self._base[i] + window if window is not None else _INF,
                         totals.get(name, _INF))
            if window is not None and self._notices and self._notice_level < 2 and not (
                self._suspend and i in _WINDOW_KINDS
            ):
                watch[i] = self._base[i] + window * self._notices[self._notice_level]
            if _POOLED[i] and root:
                cap[i] = min(thr[i], math.ceil(watch[i]) - 1 if watch[i] != _INF else _INF)
        self._thr, self._watch, self._cap = thr, watch, cap

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
        self._charge(i, n, target)

    def step(self) -> None:
        """Charge one step: ``charge("steps")``."""
        try:
            self._step_pool.pop()
        except IndexError:
            self._charge(STEPS, 1, None)

    def _charge(self, i: int, n: float, target: str | None) -> None:
        """The locked path of one charge (the pool was empty, or the amount is not 1)."""
        if self._stop is not None:
            raise self._stop.signal()
        if self._exhausted[i] and n:  # nothing can free a unit: refuse without the lock
            self._raise(self._refuse(self, i, n, target, "run"))
        with self._lock:
            err = self._take_many(((i, n),), target)
        if err is not None:
            self._raise(err)

    def charge_many(self, amounts: Mapping[str, float], *, target: str | None = None) -> None:
        """Reserve several kinds at once, all or nothing (for a model reply's tokens and cost).

        When several would exceed their limit, the refusal names the first in the attribution
        order tokens > cost > turns > calls and steps > time (S3-3).
        """
        pairs = ((kind_index(k, chargeable=True), _amount(k, n)) for k, n in amounts.items())
        items = tuple(sorted(pairs, key=lambda item: KINDS[item[0]].rank))
        with self._lock:
            err = self._take_many(items, target)
        if err is not None:
            self._raise(err)

    # -- the locked path (the run's lock held) -----------------------------------------------------
    def _take_many(self, items: tuple[tuple[int, float], ...],
                   target: str | None) -> BaseException | None:
        """Check and reserve every item on the run's counters, all or nothing."""
        if self._stop is not None:
            return self._stop.signal()
        short = self._take_all(items)
        if short is not None:
            return self._refuse(self, *short, target, "run")
        for i, n in items:
            self._after_take(i, n, target, self._run_id)
        return None

    def _take_all(self, items: tuple[tuple[int, float], ...]) -> tuple[int, float] | None:
        """Reserve every item, or none: the first item that cannot be had, else None."""
        for k, (i, n) in enumerate(items):
            if not self._take(i, n):
                for j, m in items[:k]:
                    self._untake(j, m)
                return i, n
        return None

    def _take(self, i: int, n: float) -> bool:
        """Reserve *n* of kind *i*: from what is not yet reserved, then from the pool."""
        counts, pool = self._counts, self._pools[i]
        short = counts[i] + n - self._thr[i]
        taken = 0
        while taken < short:  # only whole-number kinds have pools; for others this fails at once
            try:
                list.pop(pool)  # not a charge of its own: a traced pool must not record it
            except IndexError:
                counts[i] -= taken  # what was taken from the pool is free again
                if _POOLED[i] and not pool and self._thr[i] - counts[i] < 1:
                    self._exhausted[i] = True
                return False
            taken += 1
        counts[i] += n - taken
        self._bulk[i] += n - 1
        return True

    def _untake(self, i: int, n: float) -> None:
        self._counts[i] -= n
        self._bulk[i] -= n - 1

    def _after_take(self, i: int, n: float, target: str | None, run_id: int) -> None:
        """What follows a reservation on the run: a full-trace event, a notice, a refill."""
        if self._trace.full:
            self._trace.add_charge(i, n, self._t_ms(), run_id, target)
        if self._used(i) >= self._watch[i]:
            self._maybe_notice()
        pool = self._pools[i]
        room = self._cap[i] - self._counts[i]
        if room >= 1 and not pool:  # refill an empty pool only: it never holds over a block
            k = int(min(_BLOCK, room))
            self._counts[i] += k
            pool.extend(_PERMITS[:k])

    def _drain(self, i: int) -> None:
        """Give back the permits waiting in pool *i* (lock held; pops may race, each is one)."""
        pool = self._pools[i]
        while True:
            try:
                list.pop(pool)  # not a charge: a traced pool records nothing here
            except IndexError:
                return
            self._counts[i] -= 1

    def _used(self, i: int) -> float:
        """What kind *i* has consumed in this slice (reserved, less what waits in the pool)."""
        return self._counts[i] - len(self._pools[i]) - self._base[i]

    def _maybe_notice(self) -> None:
        if not self._notices or self._notice_level >= 2:
            return
        kind, ratio = self._highest_ratio()
        while self._notice_level < 2 and ratio >= self._notices[self._notice_level]:
            self._notice_level += 1
            self._trace.add("approach_notice", self._t_ms(), self._run_id, {
                "level": self._notice_level,
                "threshold": self._notices[self._notice_level - 1],
                "budget_kind": kind, "ratio": round(ratio, 6),
                "advice": "start converging" if self._notice_level == 1 else "deliver now",
            })
        self._arm_thresholds()

    def _highest_ratio(self) -> tuple[str, float]:
        best, best_ratio = "", 0.0
        for kind, limit in self._limits_set.items():
            i = KIND_INDEX[kind]
            if self._suspend and i in _WINDOW_KINDS:
                continue
            used = self._elapsed_ms() if i == RUN_MS else self._used(i)
            if used / limit > best_ratio:
                best, best_ratio = kind, used / limit
        return best, best_ratio

    def _spend(self, items: Sequence[tuple[int, float]], target: str | None) -> None:
        """Record spending that already happened (what a model reply used, S4-10): counted
        even past a limit, then the run (or this grant) fails ``budget-cut`` by the first limit
        passed, in the attribution order (S2-9, S3-3). *items* are ``(kind index, amount)``
        pairs in that order, their amounts already checked."""
        root = self._root
        holders = (self,) if self is root else (self, root)
        over: tuple[Budget, int] | None = None
        with self._lock:
            for i, n in items:
                if self is not root:
                    self._counts[i] += n
                root._counts[i] += n
                root._bulk[i] += n - 1
                root._after_take(i, n, target, self._run_id)
            for i, _ in items:
                for holder in holders:
                    thr = holder._thr[i]
                    if thr != _INF and holder._used(i) + holder._base[i] > thr:
                        over = holder, i
                        break
                if over is not None:
                    break
        if over is None:
            return
        holder, i = over
        name = KINDS[i].name
        with self._lock:
            limit, used = holder._figures(i)
            cut = holder._cut(i, name, f"{name} passed {holder.name}'s limit of {limit}: "
                                       f"{used} used; raise the limit or ask for less")
        holder._halt(cut)
        stop = holder._stop
        assert stop is not None
        raise stop.signal()

    # -- refusals ----------------------------------------------------------------------------------
    def _require(self, kind: str, n: float, target: str | None) -> None:
        """Refuse *n* of *kind* (traced, as any refusal) unless this grant and its run both have
        that much left; nothing is reserved (a clamp before dispatch, S2-9)."""
        i = kind_index(kind, chargeable=True)
        with self._lock:
            err = self._refusal(i, n, target)
        if err is not None:
            self._raise(err)

    def _refusal(self, i: int, n: float, target: str | None) -> BudgetExceeded | None:
        """The refusal of *n* of kind *i* by the first of this grant and its run that has not
        that much left, else None (lock held)."""
        root = self._root
        holders = ((self, "run"),) if self is root else ((self, "grant"), (root, "run"))
        for holder, scope in holders:
            if holder._used(i) + holder._base[i] + n > holder._thr[i]:
                return self._refuse(holder, i, n, target, scope)
        return None

    def _refuse(self, holder: Budget, i: int, n: float, target: str | None,
                scope: str) -> BudgetExceeded:
        """Record a refusal of *n* of kind *i* against *holder*'s counters and return the error
        (safe with or without the lock: the trace takes events from any thread)."""
        root = self._root
        used, base = holder._used(i), holder._base[i]
        total = holder._total[i]
        if total is not None and used + base + n > total:  # a whole-run total: loud (S3-1)
            limit, consumed, window = total, used + base, False
        else:
            limit, consumed = holder._thr[i] - base, used
            window = root._suspend and i in _WINDOW_KINDS and holder is root
        trace = root._trace
        key = (i, limit, consumed, target)  # an exhausted limit refuses with one payload
        ref = trace._interned.get(key)
        if ref is None:
            ref = trace._ref_of({
                "budget_kind": KINDS[i].name, "limit_value": _plain(limit),
                "consumed_value": _plain(consumed), "target_ref": target,
                "runtime_error_code": KINDS[i].code,
            }, key)
        trace._extend((self._t_ms(), n, ref, _REFUSED_CODE + 256 * self._run_id))
        # BaseException.__new__ stores the args; the Python __init__ would only add a call
        err = BudgetExceeded.__new__(BudgetExceeded, KINDS[i].name, limit, consumed, n, target,
                                     KINDS[i].code, scope)
        if window:
            err.window = True
        return err

    def _raise(self, err: BaseException) -> NoReturn:
        """Raise *err* (outside the lock). A spent window suspends the run instead (S3-1)."""
        if isinstance(err, BudgetExceeded) and err.window:
            root = self._root
            root._halt(root._make_stop(
                Status.SUSPENDED, "window", err.kind, "Suspended",
                f"the {err.kind} window of {_plain(err.limit)} is spent; the run is suspended "
                f"and resumes with a fresh window"))
            assert root._stop is not None
            err = root._stop.signal()
        try:
            raise err
        finally:
            del err  # no cycle through this frame

    # -- cancellation and stops ------------------------------------------------------------
    def cancel(self, reason: Any = None) -> None:
        """Stop this run and every descendant (S2-3); idempotent and safe from any thread.

        The run settles as ``stopped``; every later check in it raises again.
        """
        message = f"{self.name} was stopped" + (f": {reason}" if reason is not None else "")
        self._halt(self._make_stop(Status.STOPPED, "user", None, "Stopped", message, reason))

    def _make_stop(self, status: Status, cause: str, by: str | None, code: str, message: str,
                   reason: Any = None) -> _Stop:
        return _Stop(status, cause, by, code, message, self, reason)

    def _figures(self, i: int) -> tuple[float, float]:
        """The limit of kind *i* in force on this run or grant, and what it has consumed."""
        if i == RUN_MS:
            return _plain(self._thr[RUN_MS]), _plain(round(self._elapsed_ms(), 3))
        return _plain(self._thr[i] - self._base[i]), _plain(self._used(i))

    def _cut(self, i: int, by: str, message: str) -> _Stop:
        """A cut by kind *i* of this run or grant: ``failed``, cause ``budget-cut``, with the
        limit and what was consumed in its trace event (S2-4, S4-8)."""
        kind = KINDS[i]
        return _Stop(Status.FAILED, "budget-cut", by, kind.code, message, self, None,
                     (kind.name, *self._figures(i)))

    def _halt(self, stop: _Stop) -> bool:
        with self._lock:
            first = self._halt_locked(stop)
        if first:
            self._notify(stop)
        return first

    def _halt_locked(self, stop: _Stop) -> bool:
        if self._stop is not None:
            return False
        self._stop = stop
        for i in range(_K):  # every later charge takes the locked path, and raises
            self._drain(i)
        kind = _STOP_EVENTS[stop.status]
        if stop.origin is self:
            payload: dict[str, Any] = {"status": stop.status.value, "cause": stop.cause,
                                       "by": stop.by, "code": stop.code, "message": stop.message}
            if stop.figures is not None:
                payload.update(zip(("budget_kind", "limit_value", "consumed_value"),
                                   stop.figures, strict=True))
            self._root._trace.add(kind, self._t_ms(), self._run_id, payload)
        return True

    def _notify(self, stop: _Stop) -> None:
        """Tell listeners and descendants, outside the lock."""
        with self._lock:
            listeners, children = list(self._listeners), list(self._children)
        for child in children:
            child._inherit(stop)
        for listener in listeners:
            listener(stop)

    def _inherit(self, stop: _Stop) -> None:
        with self._lock:
            first = self._halt_locked(stop)
        if first:
            self._notify(stop)

    def _observed(self, stop: _Stop) -> None:
        """The work reached a check after a cancel, and stops there: traced once (S2-3)."""
        try:
            self._unobserved.pop()  # atomic: one thread traces it, whichever gets here first
        except IndexError:
            return
        self._root._trace.add("cancel_observed", self._t_ms(), self._run_id,
                              {"cause": stop.cause, "by": stop.by})

    def _add_listener(self, fn: Callable[[_Stop], None]) -> None:
        with self._lock:
            stop = self._stop
            if stop is None:
                self._listeners.append(fn)
        if stop is not None:
            fn(stop)

    def _remove_listener(self, fn: Callable[[_Stop], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def check(self) -> None:
        """Raise if this run is stopped, cut or out of time; otherwise do nothing."""
        stop = self._stop
        if stop is None:
            self._poll_deadline()
            stop = self._stop
        if stop is not None:
            raise stop.signal()

    @property
    def cancelled(self) -> bool:
        """Whether the run has been stopped, cut or suspended."""
        return self._stop is not None

    # -- time ---------------------------------------------------------------------------------
    def _start_clock(self) -> None:
        if self._started_ms is None:
            self._started_ms = self._clock.now_ms()
            self._arm_deadline()

    def _deadline_ms(self) -> float | None:
        """The absolute time (on the run's clock) at which this run's time runs out."""
        limit = self._thr[RUN_MS]
        if limit == _INF or self._started_ms is None:
            return None
        return self._started_ms + limit - self._active_before_ms

    def _arm_deadline(self) -> None:
        deadline = self._deadline_ms()
        if deadline is not None and self._paused_at is None:
            self._timers.append(self._clock.call_at(deadline, self._on_deadline))
        if self._notices and self._limits.run_ms is not None and not self._suspend:
            for level, frac in enumerate(self._notices):
                if level >= self._notice_level and self._started_ms is not None:
                    at = self._started_ms + self._limits.run_ms * frac - self._active_before_ms
                    self._timers.append(self._clock.call_at(at, self._on_time_notice))

    def _on_time_notice(self) -> None:
        with self._lock:
            if self._stop is None and self._paused_at is None:
                self._maybe_notice()

    def _poll_deadline(self) -> None:
        deadline = self._deadline_ms()
        if deadline is not None and self._paused_at is None and self._clock.now_ms() >= deadline:
            self._on_deadline()

    def _on_deadline(self) -> None:
        if self._paused_at is not None:
            return
        total = self._totals.run_ms
        if self._root._suspend and self is self._root and not (
            total is not None and self._elapsed_ms() >= total
        ):
            stop = self._make_stop(Status.SUSPENDED, "window", "run_ms", "Suspended",
                                   f"the time window of {self._limits.run_ms} ms is spent; the "
                                   f"run is suspended and resumes with a fresh window")
        else:
            limit = self._figures(RUN_MS)[0]
            stop = self._cut(RUN_MS, "timeout", f"{self.name} ran out of time: its time grant "
                                                f"of {limit} ms is spent; give it more time or "
                                                f"do less work")
        self._halt(stop)

    def _elapsed_ms(self) -> float:
        """Active milliseconds spent (time paused is not counted, S4-4)."""
        if self._started_ms is None:
            return self._active_before_ms
        now = self._paused_at if self._paused_at is not None else self._clock.now_ms()
        return self._active_before_ms + now - self._started_ms

    def _t_ms(self) -> float:
        root = self._root
        if root._started_ms is None:
            return 0.0
        return self._clock.now_ms() - root._started_ms

    @property
    def remaining_ms(self) -> float | None:
        """Milliseconds of time grant left (`None` when no time grant applies)."""
        deadline = self._deadline_ms()
        limit = self._thr[RUN_MS]
        if limit == _INF:
            return None
        if deadline is None:
            return max(0.0, limit - self._active_before_ms)
        now = self._paused_at if self._paused_at is not None else self._clock.now_ms()
        return max(0.0, deadline - now)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop this run's clock while the block runs (waiting for a person, say): time spent
        paused is not counted in ``run_ms`` (S4-4). Only a run, not a grant, pauses."""
        if self._parent is not None:
            raise ConfigError(f"{self.name} is a grant; pause the run it belongs to")
        self._set_paused(True)
        try:
            yield
        finally:
            self._set_paused(False)

    def _set_paused(self, pause: bool) -> None:
        with self._lock:
            for t in self._timers:
                t.cancel()
            self._timers = []
            now = self._clock.now_ms()
            if pause:
                self._paused_at = now
            elif self._paused_at is not None and self._started_ms is not None:
                self._started_ms += now - self._paused_at
                self._paused_at = None
            self._root._trace.add("pause" if pause else "unpause", self._t_ms(), self._run_id, {})
            children = list(self._children)
        if not pause:
            self._arm_deadline()
        for child in children:
            child._set_paused(pause)

    # -- entering and leaving --------------------------------------------------------------
    def __enter__(self) -> Budget:
        if self._outcome is not None:
            raise ConfigError(f"{self.name} has already ended ({self._outcome.status}); "
                              f"make a new budget for new work")
        self._start_clock()
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        if self._tokens:
            _current.reset(self._tokens.pop())
        if self._stop is None:
            self._poll_deadline()
        stop = self._stop
        error: BudgetError | None = None
        if isinstance(exc, _Unwind) and exc.stop.origin is not self and (
            stop is None or stop is exc.stop
        ):
            outcome = exc.stop.outcome(self, self._output)
            if not self._has_ancestor(exc.stop.origin):
                error = exc.stop.error()  # a grant used without `with` stopped: surface it here
        elif stop is not None:
            outcome = stop.outcome(self, self._output)
            if stop.origin is self and stop.status is not Status.SUSPENDED and (
                getattr(exc, "_stop", None) is not stop  # an error that reports it already
            ):
                error = stop.error()
        elif exc is None:
            outcome = Outcome(Status.COMPLETED)
        else:
            outcome = _outcome_of(exc, self._output)
        self._settle(outcome)
        if error is not None:
            error.outcome = outcome
            raise error from (exc if not isinstance(exc, _Unwind) else None)
        if isinstance(exc, BudgetError) and exc.outcome is None:
            exc.outcome = outcome
        if isinstance(exc, _Unwind) and exc.stop.origin is self:
            return True  # a suspended run: the block was left at a resumable point
        return None

    def _has_ancestor(self, run: Budget) -> bool:
        parent = self._parent
        while parent is not None:
            if parent is run:
                return True
            parent = parent._parent
        return False

    def _settle(self, outcome: Outcome) -> None:
        with self._lock:
            if self._outcome is not None:
                return
            degraded = self._degraded or self._root._degraded
            if degraded is not None and outcome.degraded is None:
                outcome = dataclasses.replace(outcome, degraded=dict(degraded))
            self._outcome = outcome
            t_end = self._t_ms()
            for t in self._timers:
                t.cancel()
            self._timers = []
            if self._started_ms is not None:
                self._active_before_ms = self._elapsed_ms()
                self._started_ms = self._paused_at = None
            ended = outcome.to_dict()
            self._root._trace.add("outcome", t_end, self._run_id, ended)
            if self is self._root:
                self._trace.outcome = dict(ended)
            open_children = list(self._children)
        for child in open_children:  # grants still open end with their parent
            child._settle(dataclasses.replace(outcome, origin=outcome.origin or self.name))
        if self._parent is not None:
            self._parent._forget(self)  # type: ignore[arg-type]

    def _forget(self, child: Grant) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)

    def _record(self, kind: str, payload: dict[str, Any]) -> None:
        """Add an event of *kind* to the run's trace."""
        self._root._trace.add(kind, self._t_ms(), self._run_id, payload)

    def set_output(self, output: Any) -> None:
        """Keep *output* (the work produced so far): a failed outcome carries it (S3-2)."""
        self._output = output

    @property
    def outcome(self) -> Outcome | None:
        """How the run ended, or `None` while it is active."""
        return self._outcome

    # -- grants ---------------------------------------------------------------------------------
    def grant(self, *, time: int | str | None = None, name: str | None = None,
              **limit_fields: Any) -> Grant:
        """A child grant: its own step and call allowances (S2-2) and a deadline that never
        outlives this run's remaining time (S2-1). Its clock starts now."""
        return Grant(self, _combine(None, time, limit_fields), name)

    # -- tools ----------------------------------------------------------------------------------
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
        from ._tool import make_tool

        if fn is None:
            return lambda f: make_tool(self, f, name, max_silence)
        return make_tool(self, fn, name, max_silence)

    # -- provider calls -------------------------------------------------------------------------
    def provider(self, fn: Callable[..., _R] | None = None, *, name: str | None = None,
                 prices: Mapping[str, float] | None = None,
                 price: Callable[[Any], float] | None = None, retries: int = 0,
                 guardrail: int | str | None = None,
                 degrade: tuple[Callable[..., Any], float] | None = None) -> Any:
        """Decorate the function that calls a model. Each attempt (``retries`` included)
        reserves a ``provider_calls`` permit first (S4-6); a ``max_output_tokens`` argument is
        clamped to what remains (S2-9); the reply's usage (``input_tokens``, ``output_tokens``,
        ``cost_usd``, or a cost from ``prices={"input": usd_per_1k, "output": usd_per_1k}`` or
        ``price(usage)``) is charged after the fact, and a passed limit fails the run
        (S3-3); a call that does not answer within ``guardrail`` (default 1 h, 0 off) is cut
        (S3-8). A reply that is an iterator is a stream: each chunk's usage is charged as it
        comes and the stream is closed the moment a limit is passed (S3-9); a stream that fails
        after content is cut ``by="stream-error"``. ``degrade=(cheaper, fraction)`` switches,
        once, to the cheaper model past that fraction of the cost limit (S3-7)."""
        from ._provider import make_provider

        def wrap(f: Callable[..., _R]) -> Callable[..., _R]:
            return make_provider(self, f, name, prices, price, retries, guardrail, degrade)

        return wrap if fn is None else wrap(fn)

    # -- sub-agents and parallel branches -------------------------------------------------------
    def agent(self, name: str, *, time: int | str | None = None,
              **limit_fields: Any) -> Grant:
        """A sub-agent: counts one ``agent_invocations`` against the run (refused like any
        charge), then opens its own grant (S2-1, S2-2). Use it as a context manager; its outcome
        tells the caller how it ended, and a stopped sub-agent is never retried (S2-3)."""
        from ._parallel import agent

        return agent(self, name, time, limit_fields)

    def parallel(self, branches: Iterable[Callable[[], _R]], *,
                 max_concurrency: int | None = None, max_items: int | None = None,
                 return_exceptions: bool = False) -> list[Any]:
        """Run *branches* (functions of no arguments) at once and return their results in
        order. All of them draw on this run's counters (S4-3). *max_concurrency* bounds the
        branches alive at once and *max_items* how many there may be (S4-11). The first error
        is raised once every branch has ended, unless *return_exceptions*."""
        from ._parallel import parallel

        return parallel(self, branches, max_concurrency=max_concurrency, max_items=max_items,
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
        return self._limits

    @property
    def trace(self) -> Trace:
        """The trace of the whole run, grants included."""
        return self._root._trace

    @property
    def consumed(self) -> dict[str, float]:
        """What was spent, by kind: on a run the run-wide totals, on a grant its own charges."""
        with self._lock:
            used = [self._used(i) + self._base[i] for i in range(_K)]
        out = {k.name: _plain(used[i]) for i, k in enumerate(KINDS) if used[i] and i != RUN_MS}
        elapsed = self._elapsed_ms()
        if elapsed:
            out["run_ms"] = round(elapsed)
        return out

    def remaining(self, kind: str) -> float:
        """What is left of *kind*: the smaller of this grant's own and the run's (``inf`` when
        nothing bounds it)."""
        i = kind_index(kind)
        if i == RUN_MS:
            left = self.remaining_ms
            return _INF if left is None else left
        with self._lock:
            return _plain(self._remaining_locked(i))

    def _remaining_locked(self, i: int) -> float:
        return max(0, self._thr[i] - self._base[i] - self._used(i))

    @property
    def notice_level(self) -> int:
        """0 before any approach notice, 1 after "start converging", 2 after "deliver now"."""
        return self._root._notice_level

    def snapshot(self) -> Snapshot:
        """A frozen view of this run now."""
        axes = []
        limits = self._limits_set
        consumed = self.consumed
        for kind, limit in limits.items():
            if kind == "run_ms":  # whole milliseconds: what a person reads
                base = self._base[RUN_MS] if self._suspend else 0
                used: float = round(self._elapsed_ms() - base)
                left: float = round(self.remaining_ms or 0.0)
            else:
                i = KIND_INDEX[kind]
                used = self._used(i)
                left = self.remaining(kind)
            axes.append(AxisUsage(kind, limit, _plain(used), left, used / limit))
        status = self._outcome.status.value if self._outcome else (
            "stopping" if self._stop is not None else
            "running" if self._started_ms is not None else "ready")
        return Snapshot(self.name, status, self._elapsed_ms(), self.remaining_ms, tuple(axes),
                        consumed, self.notice_level, self._outcome)

    def usage(self) -> pd.DataFrame:
        """A pandas DataFrame, one row per armed axis: ``limit``, ``consumed``, ``remaining``,
        ``fraction``."""
        from ._frames import usage_frame

        return usage_frame(self.snapshot())

    def _stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            used = [self._used(i) + self._base[i] for i in range(_K)]
            ops = [round(used[i] - self._bulk[i]) for i in range(_K)]
        refused = self._trace.refusals_by_kind()
        stats: dict[str, dict[str, float]] = {"checks": {}, "consumptions": {}, "consumed": {},
                                              "refusals": {}}
        for i, kind in enumerate(KINDS):
            name = kind.name
            for table, value in (("checks", ops[i] + refused[name]), ("consumptions", ops[i]),
                                 ("consumed", _plain(used[i])), ("refusals", refused[name])):
                if value:
                    stats[table][name] = value
        if self._limits.run_ms is not None or self._elapsed_ms():
            stats["consumed"]["run_ms"] = round(self._elapsed_ms())
        return stats

    # -- checkpoints (S3-1, S4-4) -------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The ledger state a checkpoint must hold: counters, active time, effective limits,
        totals and notices. JSON-serialisable; `Budget.resume` takes it back."""
        if self._parent is not None:
            raise ConfigError(f"{self.name} is a grant; take the state of its run")
        with self._lock:
            return {
                "version": STATE_VERSION,
                "name": self.name,
                "limits": self._limits.to_dict(),
                "totals": self._totals.to_dict(),
                "suspend": self._suspend,
                "counts": {k.name: _plain(used) for i, k in enumerate(KINDS)
                           if (used := self._used(i) + self._base[i]) and i != RUN_MS},
                "active_ms": _plain(round(self._elapsed_ms(), 3)),
                "notice_level": self._notice_level,
                "notices": list(self._notices) if self._notices else None,
            }

    @classmethod
    def resume(cls, state: Mapping[str, Any], limits: Limits | None = None, *,
               clock: Clock | None = None, trace: str = "counts", **limit_fields: Any) -> Budget:
        """A run that continues from *state*: nothing is reset (S4-4). The saved and the given
        limits combine by minimum; with suspend, windows start fresh and totals stay frozen
        (S3-1). A state that lacks a field or has another version is refused unchanged (S4-5)."""
        saved = _read_state(state)
        run = cls(Limits.from_json(saved["limits"]) & _combine(limits, None, limit_fields),
                  clock=clock, name=saved["name"], suspend=saved["suspend"],
                  totals=Limits.from_json(saved["totals"]) if saved["suspend"] else None,
                  notices=tuple(saved["notices"]) if saved["notices"] else None,
                  trace=trace)
        for kind, value in saved["counts"].items():
            run._counts[kind_index(kind, chargeable=True)] = value
        run._bulk = list(run._counts)  # what earlier slices consumed is not this run's work
        run._active_before_ms = float(saved["active_ms"])
        run._notice_level = int(saved["notice_level"])
        if run._suspend:
            run._base = [run._counts[i] if i in _WINDOW_KINDS else 0 for i in range(_K)]
            run._base[RUN_MS] = run._active_before_ms  # a fresh time window (S3-1)
        run._arm_thresholds()
        run._trace.add("resumed", 0.0, run._run_id, {"counts": dict(saved["counts"]),
                                                     "active_ms": saved["active_ms"]})
        return run

    def __repr__(self) -> str:
        snap = self.snapshot()
        axes = ", ".join(f"{a.kind} {a.consumed}/{a.limit}" for a in snap.axes) or "unbounded"
        return f"<{type(self).__name__} {self.name!r} {snap.status}: {axes}>"


class _TracedPool(list[None]):
    """The pool of a run with ``trace="full"``: each permit it hands out is also recorded as a
    ``consumed`` event (one atomic append), so the fast path stays free of the lock."""

    __slots__ = ("_now", "_ns", "_packed", "_ref", "_rows", "_run")

    def __init__(self, run: Budget, kind: int) -> None:
        super().__init__()
        self._run = run
        self._now = run._clock.now_ms
        # the real clock's reading without a Python call in between (its now_ms is this / 1e6)
        self._ns = time.monotonic_ns if isinstance(run._clock, MonotonicClock) else None
        self._rows = run._trace._rows.frombytes if _GIL else run._trace._locked_append_bytes
        self._ref = -1 - kind
        self._packed = 256 * run._run_id

    def pop(self, index: SupportsIndex = -1) -> None:
        list.pop(self, index)  # IndexError when empty: the caller takes the locked path
        started = self._run._started_ms
        if started is None:
            t = 0.0
        else:
            ns = self._ns
            t = (ns() / 1e6 if ns is not None else self._now()) - started
        self._rows(_ROW.pack(t, 1.0, self._ref, self._packed))  # one atomic append


class Grant(Budget):
    """A child grant of a run (see `Budget.grant`): its own allowances, the run's shared
    counters, a deadline no later than its parent's, and its parent's cancellation."""

    def __init__(self, parent: Budget, limits: Limits, name: str | None) -> None:
        root = parent._root
        self._parent = parent
        self._root = root
        self._lock = root._lock
        self._clock = root._clock
        self._limits = limits
        self._suspend = False
        self._totals = _NO_LIMITS
        self._limits_set, self._totals_set = limits.to_dict(), {}
        self._total: list[float | None] = [None] * _K
        self._base = [0] * _K
        self._counts = [0] * _K
        self._bulk = [0] * _K
        self._exhausted = [False] * _K
        self._notices = None
        self._notice_level = 0
        self._active_before_ms = 0.0
        self._init_common()
        with self._lock:
            self.name = name or f"{parent.name}/grant-{len(root._trace._runs)}"
            self._run_id = root._trace.run_index(self.name)
            self._arm_thresholds()
            self._cap_time(parent)
            parent._children.append(self)
            self._stop = parent._stop
            root._trace.add("grant", self._t_ms(), self._run_id, {
                "parent": parent.name, "limits": limits.to_dict(),
                "time_ms": _plain(self._thr[RUN_MS]) if self._thr[RUN_MS] != _INF else None,
            })
        self._start_clock()

    def _cap_time(self, parent: Budget) -> None:
        """S2-1: the effective time grant is the smaller of its own and the parent's remaining."""
        left = parent.remaining_ms
        if left is not None:
            self._thr[RUN_MS] = min(self._thr[RUN_MS], left)

    def _take_many(self, items: tuple[tuple[int, float], ...],
                   target: str | None) -> BaseException | None:
        """Check this grant's own allowances, then reserve on the run's counters (S2-2)."""
        root = self._root
        if self._stop is not None:
            return self._stop.signal()
        for i, n in items:
            if self._counts[i] + n > self._thr[i]:
                return self._refuse(self, i, n, target, "grant")
        if root._stop is not None:
            return root._stop.signal()
        short = root._take_all(items)
        if short is not None:
            return self._refuse(root, *short, target, "run")
        for i, n in items:
            self._counts[i] += n
            root._after_take(i, n, target, self._run_id)
        return None

    def _remaining_locked(self, i: int) -> float:
        return min(super()._remaining_locked(i), self._root._remaining_locked(i))

    def state(self) -> dict[str, Any]:
        raise ConfigError(f"{self.name} is a grant; take the state of its run")


def budget(limits: Limits | None = None, **kwargs: Any) -> Budget:
    """A new run; the same arguments as `Budget`."""
    return Budget(limits, **kwargs)


# -- helpers --------------------------------------------------------------------------------
def _combine(limits: Limits | None, time: int | str | None, fields: dict[str, Any]) -> Limits:
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


def _amount(kind: str, n: object) -> float:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n >= 0 or n == _INF:
        raise ConfigError(f"charge({kind!r}, {n!r}): the amount must be a finite number >= 0")
    if KINDS[KIND_INDEX[kind]].integral and not float(n).is_integer():
        raise ConfigError(f"charge({kind!r}, {n!r}): {kind} are counted in whole numbers")
    return n


def _check_totals(totals: Limits | None, suspend: bool) -> Limits:
    if totals is None:
        return _NO_LIMITS
    if not isinstance(totals, Limits):
        raise ConfigError(f"totals must be nb.Limits, not {type(totals).__name__}")
    if not suspend:
        raise ConfigError("totals= only applies with suspend=True (whole-run totals over windows)")
    return totals


def _check_notices(notices: object) -> tuple[float, float] | None:
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


def _outcome_of(exc: BaseException, output: Any) -> Outcome:
    if isinstance(exc, _Incomplete):
        return Outcome(Status.INCOMPLETE, "call-budget", None, "Incomplete", str(exc))
    if isinstance(exc, BudgetExceeded):
        return Outcome(Status.FAILED, "budget-cut", exc.kind, exc.code, str(exc), output)
    if isinstance(exc, BudgetCut):
        return Outcome(Status.FAILED, "budget-cut", exc.by, "BudgetCut", str(exc), output)
    if isinstance(exc, Cancelled):
        return Outcome(Status.STOPPED, "user", None, "Stopped", str(exc))
    if isinstance(exc, KeyboardInterrupt):
        return Outcome(Status.STOPPED, "interrupt", None, "KeyboardInterrupt", "interrupted")
    return Outcome(Status.FAILED, "error", None, type(exc).__name__, str(exc), output)


def _read_state(state: object) -> Mapping[str, Any]:
    if not isinstance(state, Mapping):
        raise ConfigError(f"a ledger state is a mapping, not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"ledger state version {state.get('version')!r} is not "
                          f"{STATE_VERSION!r}; it is refused unchanged "
                          f"(see: nbbudget explain S4-5)")
    missing = [k for k in ("name", "limits", "totals", "suspend", "counts", "active_ms",
                           "notice_level", "notices") if k not in state]
    if missing:
        raise ConfigError(f"ledger state lacks {', '.join(missing)}; it is refused unchanged")
    return state


def _plain(x: float) -> float:
    if isinstance(x, float) and x.is_integer() and x != _INF:
        return int(x)
    return x
