"""The kernel's side of ``nbbudget run``: one run whose counters every cell of the notebook
shares (S4-2, S4-3), ``nb.current()`` in every cell, and what the runner asks of it between
cells (consumption, a budget stop, a pause while the notebook waits to be continued).

The runner calls these functions through silent executions, which trigger no cell events;
nothing else uses them. A ``%%budget`` cell inside the notebook runs as a grant of the run.

Inside a notebook run the notebook is the unit that detaches or pauses: a ``%%budget`` cell's
own ``--detach`` or ``--resume`` runs to its end in place, as ``--budget 0`` makes it (an input
transformer adds that flag to the cell's line as it runs; the saved notebook keeps the cell as
written), and the runner warns that it did. An INCOMPLETE the command could not continue (each
identical command would start the notebook, and the cell's job, anew) never happens.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from ..core.endings import ENDINGS
from ..core.errors import BudgetError
from ..core.limits import Limits, negative_values_joined
from ..core.outcome import Status
from ..run.budget import Budget, activate, stop_error

__all__ = ["IN_PLACE", "begin", "pause", "status", "unpause"]

_STOPS = ("cut", "cancelled", "suspended")  # the trace events of a run that stopped
_CELL_MAGIC = "%%budget"
#: what a ``%%budget`` line that declares ``--detach`` or ``--resume`` gets inside a notebook
#: run: its call budget off, so the cell runs to its end (the last ``--budget`` given counts);
#: the runner (`nbbudget.cli.runner`) names it in its warning
IN_PLACE = "--budget 0"


class NotebookRun:
    """The notebook's run, made current at the start of every cell."""

    def __init__(self, shell: Any, limits: Limits, name: str) -> None:
        self.run = Budget(limits, name=name)
        self.error: dict[str, Any] | None = None  # the budget error that ended the last cell
        #: the ``%%budget`` lines run in place since the runner last read the status
        self.in_place: list[str] = []
        self._paused: Any = None
        activate(self.run)
        shell.events.register("pre_run_cell", self.enter)
        shell.events.register("post_run_cell", self.after)
        shell.input_transformers_cleanup.append(_in_place_cells(shell, self.in_place))

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
        in_place, self.in_place[:] = list(self.in_place), []
        return {"consumed": self.run.consumed, "remaining_ms": self.run.remaining_ms,
                "stop": self.stop(), "error": self.error, "in_place": in_place}


def _in_place_cells(shell: Any, seen: list[str]) -> Callable[[list[str]], list[str]]:
    """An input transformer (``shell.input_transformers_cleanup``, which runs before the cell
    magic is read) that adds `IN_PLACE` to the line of a ``%%budget`` cell declaring
    ``--detach`` or ``--resume``, and keeps that line in *seen*. A line the magic would refuse
    is left as it is: the magic says what is wrong with it."""

    def transform(lines: list[str]) -> list[str]:
        line = lines[0].rstrip("\r\n") if lines else ""
        magic = shell.find_cell_magic("budget")
        if line.split(maxsplit=1)[:1] != [_CELL_MAGIC] or magic is None:
            return lines
        try:
            args = magic.parser.parse_args(
                negative_values_joined(shlex.split(line[len(_CELL_MAGIC):])))
        except Exception:  # noqa: BLE001  (a UsageError, an unclosed quote: the magic's to say)
            return lines
        if not (args.detach or args.resume):
            return lines
        seen.append(line.strip())
        return [f"{line} {IN_PLACE}\n", *lines[1:]]

    transform.has_side_effects = True  # type: ignore[attr-defined]  # IPython's is-complete
    return transform                   # check leaves it out


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
    """The run's figures as JSON: ``consumed``, ``remaining_ms``, ``stop``, ``error``, and
    ``in_place``: the ``%%budget`` lines that ran to their end in place since the last call."""
    return json.dumps(_run().status())


def pause() -> None:
    """The notebook waits at a cell boundary to be continued: time paused is not counted in
    ``run_ms`` (S4-4)."""
    _run().pause()


def unpause() -> None:
    _run().unpause()
