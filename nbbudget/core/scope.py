"""The scope of a run or grant: its stop, its place in the stop tree, its deadline and pause
(S2-1, S2-3, S4-4, S4-7).

A scope knows nothing of counters. A stop is data (`Stop`), set once, first one wins, and every
later check raises it again; stopping a scope stops every descendant, and listeners (a tool
waiting for its worker, a call waiting for its job) hear of it outside the lock. A relative time
becomes an absolute deadline when the scope starts: a callback on the clock, not a clock read
per check. Paused time is not counted.

What a stop means for the counters is its owner's business (the run's or grant's `Core`), given
to the scope once with `Scope.attach`: the scope calls ``on_halt`` (lock held) when it stops, and
asks ``on_expire`` for the stop to make when its deadline passes.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .clock import Clock, Scheduled
from .endings import ENDINGS, Incomplete
from .errors import BudgetCut, BudgetError, Cancelled
from .outcome import Outcome, Status
from .trace import Recorder

__all__ = ["Incomplete", "Scope", "Stop", "Unwind"]

_INF = math.inf

class Unwind(BaseException):
    """Unwinds a stopped run through user code that catches ``Exception``; the run that owns the
    stop turns it into a public error when its ``with`` block ends."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(stop.message)
        self.stop = stop

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickled as its stop's public error: an `Unwind` crosses a process only as the
        context of another error (tblib, which Dask installs, pickles an exception's whole
        chain), and its stop holds the run, which does not pickle."""
        return self.stop.error().__reduce__()

    def _render_traceback_(self) -> list[str]:
        """How IPython shows a stop that reached the top of a cell, where no ``with`` block
        turned it into its public error (a run made current with `activate`): that error, in
        one line."""
        error = self.stop.error()
        return [f"{type(error).__name__}: {error}"]


@dataclass(frozen=True)
class Stop:
    """Why a scope stopped: kept as data, first one wins, every later check raises it again."""

    status: Status
    cause: str
    by: str | None
    code: str
    message: str
    origin: Scope
    reason: Any = None
    #: the limit's kind, the limit and what was consumed, for a cut by a limit (S4-8)
    figures: tuple[str, float, float] | None = None

    @classmethod
    def of(cls, status: Status, message: str, origin: Scope, *, by: str | None = None,
           code: str | None = None, reason: Any = None,
           figures: tuple[str, float, float] | None = None) -> Stop:
        """A stop of *status*, with the cause (and, unless given, the code) of its row in
        `ENDINGS`."""
        ending = ENDINGS[status]
        return cls(status, ending.cause or "", by, code or ending.code or "", message, origin,
                   reason, figures)

    def signal(self) -> Unwind:
        """What is raised into the work at a check; the work observes a cancel here."""
        self.observe()
        return Unwind(self)

    def observe(self) -> None:
        """The stop is raised in the work now: a cancel is observed there (traced once). A
        check (`signal`) and an interrupt (``nbbudget.core.preempt``) raise it so."""
        if self.status in (Status.STOPPED, Status.CANCELLED):
            self.origin.observed(self)

    def error(self) -> BudgetError:
        """The public error of this stop, of its row's class in `ENDINGS`: a cut names what
        cut it (a window's suspension is cut by ``"window"``), a cancel keeps its reason."""
        if ENDINGS[self.status].error is BudgetCut:
            by = "window" if self.status is Status.SUSPENDED else self.by or "timeout"
            return BudgetCut(by, self.message)
        return Cancelled(self.message, self.reason)

    def outcome(self, scope: Scope, output: Any) -> Outcome:
        """How a block run in *scope* ended by this stop (the output kept when it failed,
        S3-2; the origin named when the stop came from elsewhere)."""
        origin = self.origin.name if self.origin is not scope else None
        return Outcome(self.status, self.cause, self.by, self.code, self.message,
                       output if self.status is Status.FAILED else None, origin)

    def event(self) -> dict[str, Any]:
        """The payload of this stop's trace event."""
        payload: dict[str, Any] = {"status": self.status.value, "cause": self.cause,
                                   "by": self.by, "code": self.code, "message": self.message}
        if self.figures is not None:
            payload.update(zip(("budget_kind", "limit_value", "consumed_value"), self.figures,
                               strict=True))
        return payload


def _nothing() -> None:
    return None


#: how many switch intervals before a deadline `Scope.before_deadline` tells its callbacks: a
#: thread woken then has the GIL within one while the work runs Python (see `_wake_in` in
#: `nbbudget.core.clock`), and is done before the deadline
_LEAD_SWITCHES = 3


class Scope:
    """The stop, the deadline and the pause of one run or grant; a grant's scope is a child
    of its parent's and shares its lock and clock."""

    def __init__(self, name: str, recorder: Recorder, clock: Clock, *,
                 parent: Scope | None = None, lock: threading.Lock | None = None) -> None:
        """A scope, a child of *parent* if given (made with its lock held: the child starts
        with its stop, S2-3, and the parent's `adopt` makes it a descendant)."""
        self.name = name
        self.recorder = recorder
        self.clock = clock
        self.parent = parent
        self.root: Scope = parent.root if parent is not None else self
        self.lock = lock if lock is not None else threading.Lock()
        # why it stopped: None while it runs; set once (first stop wins), lock held
        self.stop: Stop | None = parent.stop if parent is not None else None
        # the time grant in force, in active ms: never past the parent's remaining time (S2-1)
        self.limit_ms = _INF
        # when its time (re)started on its clock: None before it starts and after it ends
        self.started_ms: float | None = None
        # when it was paused on its clock: None while its time runs
        self.paused_at: float | None = None
        # active ms counted before started_ms: earlier slices of a resumed run, time paused out
        self.active_before_ms = 0.0
        # what its owner decides (see `attach`): the active ms at which an approach notice may
        # be due, asked when the clock is armed; a time notice may be due (lock held); the
        # scope stops (lock held); the stop of a spent time grant
        self._notice_times: Callable[[], list[float]] = list
        self._on_notice: Callable[[], None] = _nothing
        self._on_halt: Callable[[], None] = _nothing
        self._on_expire: Callable[[], Stop] = self._timed_out
        self._timers: list[Scheduled] = []
        self._children: list[Scope] = []
        self._listeners: list[Callable[[Stop], None]] = []
        self._unobserved: list[None] = [None]  # emptied when the work first observes a cancel
        self._untold: list[None] = []  # holds one while `expire_here`'s stop is not told
        # `before_deadline`'s callbacks; whether the deadline is near (they have been told)
        self._soon: list[Callable[[float], None]] = []
        self._near = False

    def attach(self, limit_ms: float, *, on_halt: Callable[[], None],
               on_expire: Callable[[], Stop],
               notice_times: Callable[[], list[float]] = list,
               on_notice: Callable[[], None] = _nothing) -> None:
        """Take what this scope's owner decides, once, when the owner (the run's or grant's
        `Core`) is made, before the scope starts: its time grant *limit_ms* (``inf``: none),
        *on_halt* (called, lock held, when it stops), *on_expire* (the stop to make when its
        time grant is spent), and for a run's time notices (S3-5) *notice_times* (the active ms
        at which one may be due) and *on_notice* (called, lock held, at those times)."""
        self.limit_ms = limit_ms
        self._on_halt, self._on_expire = on_halt, on_expire
        self._notice_times, self._on_notice = notice_times, on_notice

    def resume_from(self, active_ms: float, limit_ms: float) -> None:
        """Continue a run's time from a checkpoint (S4-4): *active_ms* were spent before, and
        the time grant in force is now *limit_ms*. Called before the scope starts."""
        self.active_before_ms = active_ms
        self.limit_ms = limit_ms

    # -- stopping ------------------------------------------------------------------------------
    def halt(self, stop: Stop) -> bool:
        """Stop this scope and its descendants with *stop*; False when it was stopped already
        (listeners not told of that stop yet are told now: see `expire_here`). Idempotent and
        safe from any thread."""
        with self.lock:
            first = self.halt_locked(stop)
        if first:
            self._notify(stop)
        else:
            self.tell()
        return first

    def expire_here(self) -> Stop | None:
        """Stop now if the deadline has passed, in a signal handler: the main thread's, at the
        kernel's timer (``nbbudget.core.preempt``), so that the thread raises the stop at once
        instead of waiting for the clock's timer thread (which waits for the GIL while the
        work runs Python). The stop is set and traced; listeners and descendants are not told
        here (the thread may be anywhere in code that holds their locks): the clock's callback
        for the same deadline tells them, or the run's leaving (`tell`), whichever comes
        first. The scope's stop (set now or before); None when the deadline has not passed,
        the scope is paused, or its lock is held (then the clock's timer stops it)."""
        if not self.lock.acquire(False):
            return None
        try:
            if self.stop is None:
                deadline = self.deadline_ms()
                if (deadline is None or self.paused_at is not None
                        or self.clock.now_ms() < deadline):
                    return None
                self.halt_locked(self._on_expire())
                self._untold.append(None)
            return self.stop
        finally:
            self.lock.release()

    def tell(self) -> None:
        """Tell listeners and descendants of a stop `expire_here` made, once, outside any
        handler: the clock's timer (`halt`) or the run's leaving (`ending`) calls it."""
        try:
            self._untold.pop()  # atomic: one caller tells them
        except IndexError:
            return
        assert self.stop is not None
        self._notify(self.stop)

    def halt_locked(self, stop: Stop) -> bool:
        """`halt` with the lock held by the caller: the stop is set and traced, and listeners
        and descendants are not told. `halt` calls it; so does a ledger kept elsewhere that
        learns under the lock that its run was stopped there (the Dask ledger), and then
        raises the stop at once."""
        if self.stop is not None:
            return False
        if stop.origin is self:  # traced before it is set: a thread that sees it (and traces
            # that it did, `observed`) finds it traced already (S2-3: requested, then observed)
            event = ENDINGS[stop.status].event
            assert event is not None, f"a run does not stop {stop.status}"
            self.record(event, stop.event())
        self.stop = stop
        self._on_halt()  # every later charge takes the locked path, and raises
        return True

    def _notify(self, stop: Stop) -> None:
        """Tell listeners and descendants, outside the lock."""
        with self.lock:
            listeners, children = list(self._listeners), list(self._children)
        for child in children:
            child.halt(stop)
        for listener in listeners:
            listener(stop)

    def observed(self, stop: Stop) -> None:
        """The work reached a check after a cancel, and stops there: traced once (S2-3)."""
        try:
            self._unobserved.pop()  # atomic: one thread traces it, whichever gets here first
        except IndexError:
            return
        self.record("cancel_observed", {"cause": stop.cause, "by": stop.by})

    def add_listener(self, fn: Callable[[Stop], None]) -> None:
        """Call *fn* with the stop when this scope stops (at once if it has)."""
        with self.lock:
            stop = self.stop
            if stop is None:
                self._listeners.append(fn)
        if stop is not None:
            fn(stop)

    def remove_listener(self, fn: Callable[[Stop], None]) -> None:
        """Stop calling *fn* (given to `add_listener`) when this scope stops: a tool's call
        (``nbbudget.run.tools``) listens only while it waits for its worker."""
        with self.lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def check(self) -> None:
        """Raise the stop's signal if this scope is stopped or out of time."""
        stop = self.stop
        if stop is None:
            self.poll()
            stop = self.stop
        if stop is not None:
            raise stop.signal()

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        """Add an event of *kind* to the run's trace, stamped with the time now."""
        self.recorder.add(kind, self.t_ms(), payload)

    def ending(self, exc: BaseException | None,
               output: Any) -> tuple[Outcome, BudgetError | None] | None:
        """How a block run in this scope ended when a stop is involved, with the error to raise
        for it if any; None when none is. A stop that came from an ancestor settles here as
        the ancestor's; a grant used without ``with`` that stopped surfaces here."""
        if self.stop is None:
            self.poll()
        scope: Scope | None = self
        while scope is not None:  # a stop made in the signal handler, here or above: told now
            scope.tell()
            scope = scope.parent
        stop = self.stop
        if isinstance(exc, Unwind) and exc.stop.origin is not self and (
                stop is None or stop is exc.stop):
            outcome = exc.stop.outcome(self, output)
            return outcome, None if self._has_ancestor(exc.stop.origin) else exc.stop.error()
        if stop is None:
            return None
        reports = isinstance(exc, BudgetError) and exc.reports is stop  # raised for it already
        error = stop.origin is self and ENDINGS[stop.status].raises and not reports
        return stop.outcome(self, output), stop.error() if error else None

    # -- the tree ------------------------------------------------------------------------------
    def adopt(self, child: Scope) -> None:
        """Make *child*, made with this scope as its parent, a descendant (lock held): a later
        stop of this scope stops it too (S2-3)."""
        self._children.append(child)

    def forget(self, child: Scope) -> None:
        """*child* has ended: a later stop of this scope no longer reaches it. A grant's run
        (``nbbudget.run.budget``) calls it when the grant settles."""
        with self.lock:
            if child in self._children:
                self._children.remove(child)

    def _has_ancestor(self, scope: Scope) -> bool:
        parent = self.parent
        while parent is not None:
            if parent is scope:
                return True
            parent = parent.parent
        return False

    # -- time ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start this scope's time now, unless it has started: a run starts it when it is
        entered, a grant when it is made."""
        if self.started_ms is None:
            self.start_at(self.clock.now_ms())

    def start_at(self, now_ms: float) -> None:
        """Start this scope's time as if at *now_ms* on its clock (a run whose parts were built
        after it was entered), unless it has started."""
        if self.started_ms is None:
            self.started_ms = now_ms
            self._arm()

    def deadline_ms(self) -> float | None:
        """The absolute time (on the clock) at which this scope's time runs out."""
        if self.limit_ms == _INF or self.started_ms is None:
            return None
        return self.started_ms + self.limit_ms - self.active_before_ms

    def _arm(self) -> None:
        deadline = self.deadline_ms()
        if deadline is not None and self.paused_at is None:
            self._timers.append(self.clock.call_at(deadline, self._on_deadline))
            self._near = False
            if self._soon:  # (a pause ended, S4-4)
                self._arm_soon(deadline)
        if self.started_ms is not None:
            for at in self._notice_times():
                self._timers.append(self.clock.call_at(
                    self.started_ms + at - self.active_before_ms, self._on_time_notice))

    def _arm_soon(self, deadline: float) -> float | None:
        """`before_deadline`'s callbacks are told a lead before *deadline*: on the clock's
        timer then, or at once when it is that close already (the deadline, to tell them now;
        else None). Lock held, or the scope not shared yet."""
        soon = deadline - _LEAD_SWITCHES * sys.getswitchinterval() * 1000
        if self._near or self.clock.now_ms() >= soon:
            self._near = True
            return deadline
        self._timers.append(self.clock.call_at(soon, self._on_soon))
        return None

    def _on_soon(self) -> None:
        """On the clock's timer, a lead before the deadline: tell `before_deadline`'s
        callbacks when it is."""
        with self.lock:
            deadline = self.deadline_ms()
            if deadline is None or self.paused_at is not None or self.stop is not None:
                return
            self._near = True
            callbacks = list(self._soon)
        for callback in callbacks:
            callback(deadline)

    def before_deadline(self, callback: Callable[[float], None]) -> None:
        """Call *callback* with the deadline (on the clock) a little before it comes: on the
        clock's timer, `_LEAD_SWITCHES` switch intervals early (with the GIL in time while
        the work runs Python), or at once when it is that close already; again each time it
        is that close after a pause (S4-4). ``nbbudget.core.preempt`` sets the kernel's timer
        for the main thread with it: only for a block that runs until its deadline is near,
        so that the others cost no call into the kernel. `forget_before_deadline` ends it.
        The deadline's own callback stays where it was: a scope nobody asks this of has one
        timer, whose thread wakes once."""
        with self.lock:
            first = not self._soon
            self._soon.append(callback)
            deadline = self.deadline_ms()
            if deadline is None or self.paused_at is not None or self.stop is not None:
                return  # told when its time starts again
            tell = deadline if self._near else self._arm_soon(deadline) if first else None
        if tell is not None:
            callback(tell)

    def forget_before_deadline(self, callback: Callable[[float], None]) -> None:
        """`before_deadline`'s *callback* is not called any more."""
        with self.lock:
            if callback in self._soon:
                self._soon.remove(callback)

    def _on_time_notice(self) -> None:
        with self.lock:
            if self.stop is None and self.paused_at is None:
                self._on_notice()

    def poll(self) -> None:
        """Stop now if the deadline has passed (a callback may not have run yet)."""
        deadline = self.deadline_ms()
        if deadline is not None and self.paused_at is None and self.clock.now_ms() >= deadline:
            self._on_deadline()

    def _on_deadline(self) -> None:
        if self.paused_at is None:
            self.halt(self._on_expire())

    def _timed_out(self) -> Stop:
        return Stop.of(Status.FAILED, f"{self.name} ran out of time", self, by="timeout",
                       code="RunTimeBudgetExceeded")

    def elapsed_ms(self) -> float:
        """Active milliseconds spent (time paused is not counted, S4-4)."""
        if self.started_ms is None:
            return self.active_before_ms
        now = self.paused_at if self.paused_at is not None else self.clock.now_ms()
        return self.active_before_ms + now - self.started_ms

    def t_ms(self) -> float:
        """Milliseconds since the run (the root scope) started: the time of a trace event."""
        started = self.root.started_ms
        return 0.0 if started is None else self.clock.now_ms() - started

    def remaining_ms(self) -> float | None:
        """Milliseconds of time grant left (`None` when no time grant applies)."""
        if self.limit_ms == _INF:
            return None
        deadline = self.deadline_ms()
        if deadline is None:
            return max(0.0, self.limit_ms - self.active_before_ms)
        now = self.paused_at if self.paused_at is not None else self.clock.now_ms()
        return max(0.0, deadline - now)

    def set_paused(self, pause: bool) -> None:
        """Stop or restart this scope's clock, and its descendants' (S4-4)."""
        with self.lock:
            self._cancel_timers()
            now = self.clock.now_ms()
            if pause:
                self.paused_at = now
            elif self.paused_at is not None and self.started_ms is not None:
                self.started_ms += now - self.paused_at
                self.paused_at = None
            self.record("pause" if pause else "unpause", {})
            children = list(self._children)
        if not pause:
            self._arm()
        for child in children:
            child.set_paused(pause)

    def end_time(self, now_ms: float | None = None) -> None:
        """The scope has ended (lock held), now or at *now_ms*: its timers go and its active
        time is kept."""
        self._cancel_timers()
        if self.started_ms is not None:
            if now_ms is None or self.paused_at is not None:
                self.active_before_ms = self.elapsed_ms()
            else:
                self.active_before_ms += now_ms - self.started_ms
            self.started_ms = self.paused_at = None

    def _cancel_timers(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers = []
