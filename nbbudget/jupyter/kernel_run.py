"""The kernel's side of ``nbbudget run``: one run whose counters every cell of the notebook
shares (S4-2, S4-3), ``nb.current()`` in every cell, and what the runner asks of it between
cells (consumption, a budget stop, a pause while the notebook waits to be continued).

The runner calls these functions through silent executions, which trigger no cell events;
nothing else uses them. A ``%%budget`` cell inside the notebook runs as a grant of the run.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.endings import ENDINGS
from ..core.errors import BudgetError
from ..core.limits import Limits
from ..core.outcome import Status
from ..run.budget import Budget, activate, stop_error

__all__ = ["begin", "pause", "status", "unpause"]

_STOPS = ("cut", "cancelled", "suspended")  # the trace events of a run that stopped


class NotebookRun:
    """The notebook's run, made current at the start of every cell."""

    def __init__(self, shell: Any, limits: Limits, name: str) -> None:
        self.run = Budget(limits, name=name)
        self.error: dict[str, Any] | None = None  # the budget error that ended the last cell
        self._paused: Any = None
        activate(self.run)
        shell.events.register("pre_run_cell", self.enter)
        shell.events.register("post_run_cell", self.after)

    def enter(self, info: Any = None) -> None:
        activate(self.run)
        self.error = None

    def after(self, result: Any) -> None:
        """Keep the budget error that ended the cell, with its code, for the runner."""
        raised = result.error_in_exec
        error = stop_error(raised) if raised is not None else None
        if not isinstance(error, BudgetError):
            return
        if error is not raised:  # the run's own stop reached the top of the cell
            code = (self.stop() or {}).get("code")
        else:
            code = getattr(error, "code", None) or (error.outcome.code if error.outcome else None)
        self.error = {"code": code or type(error).__name__, "ename": type(error).__name__,
                      "message": str(error)}

    def stop(self) -> dict[str, Any] | None:
        """How the run stopped (its time grant spent, cancelled), or None while it may go on."""
        if not self.run.cancelled:
            return None
        for event in reversed(self.run.trace.events):
            if event.kind in _STOPS:
                return dict(event.payload)
        return {"code": ENDINGS[Status.STOPPED].code, "message": f"{self.run.name} was stopped"}

    def pause(self) -> None:
        if self._paused is None:
            self._paused = self.run.paused()
            self._paused.__enter__()

    def unpause(self) -> None:
        if self._paused is not None:
            self._paused.__exit__(None, None, None)
            self._paused = None

    def status(self) -> dict[str, Any]:
        return {"consumed": self.run.consumed, "remaining_ms": self.run.remaining_ms,
                "stop": self.stop(), "error": self.error}


_notebook: NotebookRun | None = None


def begin(limits: str, name: str) -> None:
    """Load nbbudget into this kernel's shell and start the notebook's run, named *name*, with
    *limits* (JSON, the keys of ``--run-limits-json``)."""
    from IPython import get_ipython

    global _notebook
    shell = get_ipython()
    shell.extension_manager.load_extension("nbbudget")
    _notebook = NotebookRun(shell, Limits.from_json(limits), name)


def _run() -> NotebookRun:
    if _notebook is None:
        raise RuntimeError("no notebook run in this kernel: nbbudget run starts one with begin()")
    return _notebook


def status() -> str:
    """The run's figures as JSON: ``consumed``, ``remaining_ms``, ``stop`` and ``error``."""
    return json.dumps(_run().status())


def pause() -> None:
    """The notebook waits at a cell boundary to be continued: time paused is not counted in
    ``run_ms`` (S4-4)."""
    _run().pause()


def unpause() -> None:
    _run().unpause()
