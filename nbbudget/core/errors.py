"""The exceptions nbbudget raises.

Every error keeps its data as attributes and builds its message from them (the four store
errors live with the store, in `nbbudget.calls.store`)::

    Exception
     +-- BudgetError                 anything a budget stopped
     |    +-- BudgetExceeded         a charge was refused (S4-3, S4-8); nothing was spent
     |    +-- BudgetCut              work was cut: time spent, silent tool, failed stream (S2-4)
     |    +-- Cancelled              the run was stopped by a person or by its wall-clock limit
     |    +-- RunsPerDayExceeded     a start over the work's quota of runs per day (S4-12)
     |    +-- ClusterUnanswered      a cluster did not answer within a call's budget (S0-1)
     +-- ValueError
          +-- ConfigError            a bad value: a limit, a duration, a manifest (S3-4)
               +-- WideningError     a later source tried to widen a limit (S4-2)
               +-- CheckpointRefused a stored checkpoint failed a check (S4-5)
               +-- StoreDamaged      the store's database is damaged or lost what it held
               +-- StoreBusy         another connection kept the store locked too long
               +-- StoreReadOnly     this user cannot write the store: a write was refused

Code inside a run that catches ``Exception`` does not swallow a stop: the run unwinds with an
internal signal derived from ``BaseException`` and turns it into one of the errors above when it
leaves its ``with`` block (as trio does with ``Cancelled``).
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .outcome import Outcome

__all__ = [
    "BudgetCut",
    "BudgetError",
    "BudgetExceeded",
    "Cancelled",
    "ClusterUnanswered",
    "ConfigError",
    "RunsPerDayExceeded",
    "WideningError",
]


class ConfigError(ValueError):
    """A configuration value is invalid: the message names the field, the value and the fix."""


class WideningError(ConfigError):
    """A later source would widen a limit that an earlier source set (S4-2)."""

    def __init__(self, field: str, current: Any, requested: Any) -> None:
        self.field = field
        self.current = current
        self.requested = requested
        super().__init__(
            f"{field}={requested!r} would widen the limit {field}={current!r} already in force; "
            f"a later source may only restrict a limit, so use a value <= {current!r}"
        )

    def __reduce__(self) -> Any:
        return (type(self), (self.field, self.current, self.requested))


class BudgetError(Exception):
    """Base class of every error that means a budget stopped work."""

    outcome: Outcome | None = None
    #: the run's stop this error was raised for, when it reports one: the run's ``with`` block
    #: then re-raises this error rather than a new one (the pydantic-ai adapter's cuts)
    reports: object = None

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it: one line, what happened and what to do, no traceback."""
        return [f"{type(self).__name__}: {self}"]


class BudgetExceeded(BudgetError):
    """A charge was refused before anything was spent; the counters are as they were.

    Attributes: ``kind``, ``limit``, ``consumed``, ``requested``, ``target``, ``code`` (the
    limit's error code, e.g. ``"StepBudgetExceeded"``) and ``scope`` (``"run"`` or ``"grant"``).
    """

    window = False  # the refused limit is a window that suspends the run (S3-1)

    def __init__(
        self, kind: str, limit: float, consumed: float, requested: float = 1,
        target: str | None = None, code: str = "", scope: str = "run",
    ) -> None:
        # kept in ``args`` (set in C, so a refusal stays cheap) and read through properties
        super().__init__(kind, limit, consumed, requested, target, code, scope)

    kind = property(lambda self: self.args[0], doc="the budget kind refused")
    limit = property(lambda self: self.args[1], doc="the limit in force")
    consumed = property(lambda self: self.args[2], doc="what had been consumed")
    requested = property(lambda self: self.args[3], doc="the amount asked for")
    target = property(lambda self: self.args[4], doc="what the charge was for, if given")
    code = property(lambda self: self.args[5], doc="the limit's error code")
    scope = property(lambda self: self.args[6], doc="'run' or 'grant'")

    def __str__(self) -> str:
        what = f"{self.kind} for {self.target}" if self.target else self.kind
        owner = "this grant's" if self.scope == "grant" else "the run's"
        return (
            f"{what} would exceed {owner} limit of {_num(self.limit)} ({_num(self.consumed)} used, "
            f"{_num(self.requested)} more requested); raise the limit or do less work"
        )


class BudgetCut(BudgetError):
    """Work was cut: its time ran out (``by='timeout'``), a tool went silent (``'watchdog'``),
    a stream failed after content (``'stream-error'``), or a limit ran out (the limit's kind)."""

    def __init__(self, by: str, message: str) -> None:
        self.by = by
        super().__init__(message)

    def __reduce__(self) -> Any:
        return (type(self), (self.by, str(self)))


class Cancelled(BudgetError):
    """The run was stopped: by ``cancel()`` (``stopped``) or by its wall clock (``cancelled``)."""

    def __init__(self, message: str, reason: Any = None) -> None:
        self.reason = reason
        super().__init__(message)

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.reason))


class RunsPerDayExceeded(BudgetError):
    """The work has started its quota of times today (UTC); this start ran nothing (S4-12).

    `nb.call` answers it as a failed response with the code ``RunsPerDayExceeded``; a
    ``%%budget --runs-per-day`` cell raises it."""

    code = "RunsPerDayExceeded"


class ClusterUnanswered(BudgetError):
    """The scheduler a resumable call named by its address (``cluster="tcp://..."``) did not
    answer within the call's budget, so nothing ran (S0-1); the connection goes on, for the
    next call. (A call that detaches answers INCOMPLETE instead, state ``starting``, and its
    work goes to the cluster once connected.)

    `nb.call` answers it as a failed response with the code ``cluster_unanswered``."""

    code = "cluster_unanswered"

    def __init__(self, address: str, budget_ms: int | None) -> None:
        self.address = address
        self.budget_ms = budget_ms
        within = f"the call budget of {budget_ms} ms" if budget_ms else "the call budget"
        super().__init__(
            f"the cluster at {address!r} did not answer within {within}, so nothing ran: a "
            f"resumable call starts once its cluster is connected; make the same call again "
            f"in this process (the connection goes on), give it a budget longer than "
            f"connecting takes (a fresh process needs over a second to import Dask and "
            f"connect), or connect first (distributed.Client({address!r})) and pass the "
            f"client as cluster=")

    def __reduce__(self) -> Any:
        return (type(self), (self.address, self.budget_ms))


def _num(v: float) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.6g}"
    return str(int(v))


def show(value: object) -> str:
    """``repr(value)``; integers too long for `str` and very long texts are shortened."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 14_000:
        digits = int(abs(value).bit_length() * 0.30103) + 1
        return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
    return _SHORT.repr(value) if isinstance(value, str) else repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxstring = 80
