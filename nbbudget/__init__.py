"""nbbudget: budgets for Jupyter and for plain Python.

``import nbbudget as nb``: run limits, step and time grants, cancellation, watched tools and
traces (`budget`, `Limits`, `Trace`); call budgets whose work detaches to a background job or
pauses at a checkpoint (`call`, `checkpoint`, `jobs`). In IPython, ``%load_ext nbbudget``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .calls import history as _history  # installs the recording of runs that end
from .calls.call import call, checkpoint, resume_state
from .calls.jobs import Job, JobState
from .calls.response import Response
from .calls.runner import jobs
from .calls.store import CheckpointRefused, StoreBusy, StoreDamaged, StoreReadOnly, store
from .core.duration import parse_duration
from .core.errors import (
    BudgetCut,
    BudgetError,
    BudgetExceeded,
    Cancelled,
    ClusterUnanswered,
    ConfigError,
    RunsPerDayExceeded,
    WideningError,
)
from .core.limits import Limits, Manifest
from .core.outcome import Outcome, Status
from .core.suggest import Suggestion
from .core.trace import Event, Replay, Trace
from .run.budget import Budget, Grant, Snapshot, budget, current
from .run.tools import ToolContext

if TYPE_CHECKING:
    from .integrations.models.everywhere import Switch

__version__ = "0.1.0"
_Client = TypeVar("_Client")

#: the envelope of the last ``%%budget`` cell (set by the IPython layer)
last_response: Response | None = None


def step() -> None:
    """``nb.current().step()``: charge one step to the run of this cell, ``with`` block or call
    (S4-3). Outside every run it raises `ConfigError`, saying how to get one. Made for loops:
    one look-up of the current run, then the run's own `Budget.step` (in the hottest loop, take
    ``step = nb.current().step`` once, which skips the look-up)."""
    run = current()
    if run is None:
        raise _no_run("step")
    run.step()


def check() -> None:
    """``nb.current().check()``: raise if the current run is stopped, cut or out of time (a
    cooperative check for long work that charges nothing). Outside every run it raises
    `ConfigError`, saying how to get one."""
    run = current()
    if run is None:
        raise _no_run("check")
    run.check()


def charge(kind: str, n: float = 1, *, target: str | None = None) -> None:
    """``nb.current().charge(kind, n, target=...)``: reserve *n* of *kind* on the current run
    before the work it pays for (S4-3); a refusal raises `BudgetExceeded` and spends nothing.
    Outside every run it raises `ConfigError`, saying how to get one."""
    run = current()
    if run is None:
        raise _no_run("charge")
    run.charge(kind, n, target=target)


def _no_run(name: str) -> ConfigError:
    return ConfigError(f"nb.{name}() found no active run (nb.current() is None here): run it "
                       f"in a cell that starts with %%budget, inside `with nb.budget(...):`, "
                       f"or in the work of nb.call(...)")


@overload
def instrument(client: None = None) -> Switch: ...


@overload
def instrument(client: str, *, prices: Any = None, provider: str | None = None) -> Switch: ...


@overload
def instrument(client: _Client, *, prices: Any = None,
               degrade: tuple[str, float] | None = None, name: str | None = None,
               provider: str | None = None) -> _Client: ...


def instrument(client: Any = None, *, prices: Any = None,
               degrade: tuple[str, float] | None = None, name: str | None = None,
               provider: str | None = None) -> Any:
    """Bound model calls by the run current when each is made.

    ``nb.instrument()``: every model call the process makes, through the OpenAI or Anthropic
    SDK at any base URL, any library built on httpx2, httpx or aiohttp, or boto3's Bedrock
    Converse API, clients made before or after included
    (`nbbudget.integrations.models.everywhere`); returns the switch, whose
    ``.undo()`` (or the end of its ``with`` block) turns it off. Calling it again changes
    nothing. Calls outside every run pass untouched.

    ``nb.instrument("http://localhost:11434", prices="free")``: the same, and the model calls
    made to that base URL are priced so (``prices``) or at ``provider``'s prices in
    genai-prices: a local server, a gateway genai-prices knows under another name, or a proxy
    of Mistral's or Groq's API (``provider="mistral"``), whose calls are then read as that
    API's.

    ``nb.instrument(client)``: a copy of an OpenAI or Anthropic client whose model calls are
    provider calls (`nbbudget.integrations.models`; the ``openai`` and ``anthropic`` extras).
    ``prices``: USD per million tokens, a function of the usage, or ``"free"``; ``provider``:
    the provider's name in genai-prices (default: resolved from the client's base URL). The
    SDK is imported only when a client is instrumented."""
    if client is None:
        given = [k for k, v in (("prices", prices), ("degrade", degrade), ("name", name),
                                ("provider", provider)) if v is not None]
        if given:
            raise ConfigError(f"nb.instrument() with no client takes no {given[0]}=: give it "
                              f"with a client, nb.instrument(client, {given[0]}=...), whose "
                              f"calls it then applies to")
        from .integrations.models.everywhere import install

        return install()
    if isinstance(client, str):
        if degrade is not None or name is not None:
            raise ConfigError(f"nb.instrument({client!r}) takes prices= and provider= only: "
                              f"give {'degrade' if degrade is not None else 'name'}= with a "
                              f"client, nb.instrument(client, ...)")
        from .integrations.models.everywhere import install, installed

        was_on = installed() is not None
        switch = install()
        try:
            switch.price(client, prices, provider)
        except ConfigError:
            if not was_on:  # nothing changed by a call that failed
                switch.undo()
            raise
        return switch
    from .integrations.models import instrument as _instrument

    return _instrument(client, prices=prices, degrade=degrade, name=name, provider=provider)


def suggest_limits(traces: Iterable[Trace] | None = None, *, margin: float = 0.2,
                   quantile: float = 0.95) -> Suggestion:
    """Limits from a history of runs: *traces* (an iterable of `Trace`), or None for the
    store's history (``nbbudget history``): per axis the *quantile* of what the finished runs
    used, plus *margin*; a `Suggestion` with ``.limits`` and ``.to_frame()``. No runs is a
    `ConfigError`."""
    return _history.suggest_limits(traces, margin=margin, quantile=quantile)


def load_ipython_extension(shell: object) -> None:
    """``%load_ext nbbudget``: register nbbudget's magics and settings on the shell."""
    from .jupyter.magics import load

    load(shell)


def unload_ipython_extension(shell: object) -> None:
    """``%unload_ext nbbudget``: remove everything ``%load_ext`` registered."""
    from .jupyter.magics import unload

    unload(shell)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the JupyterLab extension lies in the package (``jupyter labextension develop``
    links it from there; the wheel installs it under ``share/jupyter/labextensions``)."""
    return [{"src": "labextension", "dest": "nbbudget"}]


# Errors show where users import them from: ``nbbudget.ConfigError`` in a traceback, not the
# private module that defines it. (Not the other classes: their type hints are resolved in the
# module that defines them.)
for _error in (BudgetCut, BudgetError, BudgetExceeded, Cancelled, CheckpointRefused,
               ClusterUnanswered, ConfigError, RunsPerDayExceeded, WideningError):
    _error.__module__ = __name__
del _error

__all__ = [
    "Budget",
    "BudgetCut",
    "BudgetError",
    "BudgetExceeded",
    "Cancelled",
    "CheckpointRefused",
    "ClusterUnanswered",
    "ConfigError",
    "Event",
    "Grant",
    "Job",
    "JobState",
    "Limits",
    "Manifest",
    "Outcome",
    "Replay",
    "Response",
    "RunsPerDayExceeded",
    "Snapshot",
    "Status",
    "StoreBusy",
    "StoreDamaged",
    "StoreReadOnly",
    "Suggestion",
    "ToolContext",
    "Trace",
    "WideningError",
    "budget",
    "call",
    "charge",
    "check",
    "checkpoint",
    "current",
    "instrument",
    "jobs",
    "last_response",
    "parse_duration",
    "resume_state",
    "step",
    "store",
    "suggest_limits",
]
