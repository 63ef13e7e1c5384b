"""How a run ends, in one table: for each `Status`, why it ended, the error a stop of it raises,
the trace event that records the stop, and what a call answers (its envelope's error code and
its exit code). The core, the call layer, the magic and the command line all read it here.

==========  ===========  ==========  =========  ================  =========  ====
status      cause        code        error      trace event       envelope   exit
==========  ===========  ==========  =========  ================  =========  ====
completed                                                                    0
incomplete  call-budget  Incomplete                                          14
failed      budget-cut   (limit's)   BudgetCut  cut               (error's)  1
suspended   window       Suspended   BudgetCut  suspended         (error's)  1
stopped     user         Stopped     Cancelled  cancel_requested  stopped    130
cancelled   wall-clock   Cancelled   Cancelled  cancelled         cancelled  124
==========  ===========  ==========  =========  ================  =========  ====

A suspended run's own ``with`` block ends quietly (S3-1); a call's run has no windows and never
suspends. A failed run's outcome code is its limit's (``StepBudgetExceeded``) or its error's
class name, and its envelope's code is `envelope_code` of the error it ended with; a call
refused before its work started is ``failed`` too, exit 1, with the code of what refused it
(``checkpoint_refused``, ``store_damaged``, ``store_busy``, ``RunsPerDayExceeded``). A person's
cancel is only *requested* when it is recorded (the work observes it at its next check,
``cancel_observed``); the wall clock cancels a call at once (S4-7). The exit codes follow the
shell: 124 as with ``timeout(1)``, 130 as with Ctrl-C, and 14 for INCOMPLETE (S0-12).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .errors import BudgetCut, BudgetError, BudgetExceeded, Cancelled, ConfigError
from .outcome import Outcome, Status

__all__ = ["ENDINGS", "EXIT_CANCELLED", "EXIT_FAILED", "EXIT_INCOMPLETE", "EXIT_OK",
           "EXIT_STOPPED", "OUT_OF_TIME", "Ending", "Incomplete", "budget_cause", "by_in_words",
           "envelope_code", "outcome_of"]

# The exit codes of an envelope (``meta.exit_code``), re-exported by `nbbudget.calls.response`
# for `Response` and read by the table below, the magic and ``nbbudget run``.
EXIT_OK = 0  #: the work is done
EXIT_FAILED = 1  #: the work failed, or a limit or a refusal ended it
EXIT_INCOMPLETE = 14  #: the work goes on in the background or is paused (S0-12)
EXIT_CANCELLED = 124  #: the wall-clock limit fired, as with timeout(1)
EXIT_STOPPED = 130  #: a person stopped the work, as with Ctrl-C


class Ending(NamedTuple):
    """One way a run ends. ``code`` is its outcome's code when it has one of its own (None: the
    limit's or the error's); ``error`` is the class of the error a stop of it is, outside the
    work it stopped; ``event`` is the trace event of that stop; ``envelope`` is a call's
    ``error.code`` when it has one of its own (None: `envelope_code` of the error); ``raises``
    says whether the run that stopped raises that error when its ``with`` block ends (a
    suspended run ends quietly, to be resumed with a fresh window, S3-1)."""

    status: Status
    cause: str | None
    code: str | None
    error: type[BudgetError] | None
    event: str | None
    envelope: str | None
    exit_code: int
    raises: bool = True

    def outcome(self, message: str | None = None, *, cause: str | None = None,
                by: str | None = None, code: str | None = None, output: Any = None) -> Outcome:
        """An outcome of this ending, with its row's cause and code unless given."""
        return Outcome(self.status, cause or self.cause, by, code or self.code, message, output)


#: the table itself, one `Ending` per status: the scope makes its stops from it, the call
#: layer, the magic and ``nbbudget run``'s runner read their codes and exit codes from it
ENDINGS: dict[Status, Ending] = {e.status: e for e in (
    Ending(Status.COMPLETED, None, None, None, None, None, EXIT_OK),
    Ending(Status.INCOMPLETE, "call-budget", "Incomplete", None, None, None, EXIT_INCOMPLETE),
    Ending(Status.FAILED, "budget-cut", None, BudgetCut, "cut", None, EXIT_FAILED),
    Ending(Status.SUSPENDED, "window", "Suspended", BudgetCut, "suspended", None, EXIT_FAILED,
           raises=False),
    Ending(Status.STOPPED, "user", "Stopped", Cancelled, "cancel_requested", "stopped",
           EXIT_STOPPED),
    Ending(Status.CANCELLED, "wall-clock", "Cancelled", Cancelled, "cancelled", "cancelled",
           EXIT_CANCELLED),
)}


class Incomplete(BaseException):
    """Unwinds work whose call ran out of budget at a checkpoint: the run ends ``incomplete``."""


def outcome_of(exc: BaseException, output: Any = None) -> Outcome:
    """How a run ends when *exc* leaves its ``with`` block (*output*: what the work had produced,
    kept when it failed, S3-2)."""
    failed = ENDINGS[Status.FAILED]
    if isinstance(exc, Incomplete):
        return ENDINGS[Status.INCOMPLETE].outcome(str(exc))
    if isinstance(exc, BudgetExceeded):
        return failed.outcome(str(exc), by=exc.kind, code=exc.code, output=output)
    if isinstance(exc, BudgetCut):
        return failed.outcome(str(exc), by=exc.by, code="BudgetCut", output=output)
    if isinstance(exc, Cancelled):
        return ENDINGS[Status.STOPPED].outcome(str(exc))
    if isinstance(exc, KeyboardInterrupt):
        return ENDINGS[Status.STOPPED].outcome("interrupted", cause="interrupt",
                                               code="KeyboardInterrupt")
    return failed.outcome(str(exc), cause="error", code=type(exc).__name__, output=output)


def budget_cause(exc: BaseException) -> BudgetError | None:
    """The budget error *exc* was raised for, when it is another library's error raised while
    handling one of nbbudget's (LiteLLM turns a refused model call into its own
    ``InternalServerError``): the first `BudgetError` among its causes and contexts, nearest
    first; None when there is none. A run's block that such an error leaves ends as that
    budget error would have (``nbbudget.run.budget``)."""
    seen: set[int] = set()
    queue: list[BaseException] = [exc]
    while queue and len(seen) < 32:
        err = queue.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, BudgetError) and err is not exc:
            return err
        queue.extend(e for e in (err.__cause__, err.__context__) if e is not None)
    return None


def envelope_code(error: BaseException) -> str:
    """A failed call's ``error.code`` for the error its work ended with: a cut names what cut it
    (``budget_cut_timeout``), nbbudget's other errors carry their code (``StepBudgetExceeded``,
    ``store_damaged``, ``store_busy``...), anything else is its class name."""
    if isinstance(error, BudgetCut):
        return f"budget_cut_{error.by}".replace("-", "_")
    code = getattr(error, "code", None) if isinstance(error, (BudgetError, ConfigError)) else None
    return code if isinstance(code, str) and code else type(error).__name__


#: what a person reads where a run's time grant ran out (``by="timeout"``, ``--time``): never
#: "timeout", which is ``--timeout``'s word, the wall clock's (N-7)
OUT_OF_TIME = "out of time"


def by_in_words(by: str) -> str:
    """What cut a run, as a person reads it: `OUT_OF_TIME` for its time grant, else ``by
    steps``. The panel, the magic's line, the frames' plot, the what-if explorer and a tool's
    cut say it so."""
    return OUT_OF_TIME if by == "timeout" else f"by {by}"
