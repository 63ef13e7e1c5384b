"""Model calls an adapter counts itself, so that the HTTP layer does not count them again.

The LangChain handler, the pydantic-ai capability and the Agents SDK hooks count each model
call of their framework (its permits, its usage, its cost) before it is sent. The model's SDK
then sends it over HTTP, where ``nb.instrument()``'s switch, and an instrumented client, would
count it a second time. So an adapter *claims* a model call while it is under way, and the
gate of `nbbudget.integrations.models.clients` sends a claimed request untouched: each call is
counted once, by the adapter, under the adapter's rules.

Two kinds of claim, as each framework allows:

- **in a context** (`claim`, `held`): the framework calls the adapter in the context the model
  request is then sent from (LangChain calls its handlers inline, before the model, in the same
  thread or task; pydantic-ai calls its model through the capability's wrapper model). Only the
  requests sent from that context, and the contexts it starts, are claimed.
- **in a run, by the framework's name** (`claim_in_run`): the Agents SDK runs its hooks as
  tasks of their own, whose context the model request never sees; its models send every
  request with their own ``User-Agent`` (``Agents/Python``). While such a claim is open, the
  run's requests whose ``User-Agent`` begins that way are claimed, and no other.

A claim ends when its model call does (`Claim.end`), and in any case when its run's block
ends. Used by the adapters (``langchain``, ``pydantic_ai``, ``openai_agents``) and read by
``models.clients`` (`claimed`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ..core.lowlevel import Core

__all__ = ["Claim", "claim", "claim_in_run", "claimed", "held"]


class Claim:
    """One model call an adapter counts, open until `end`."""

    __slots__ = ("agent", "core", "open", "previous")

    def __init__(self, core: Core | None, agent: str | None, previous: Claim | None) -> None:
        self.core, self.agent, self.previous = core, agent, previous
        self.open = True

    def end(self) -> None:
        """The model call is over: its requests are no longer claimed (calling it again does
        nothing)."""
        if not self.open:
            return
        self.open = False
        if self.agent is None:
            if _here.get() is self:  # the context it was made in: what was claimed before
                _here.set(self.previous)
        else:
            with _lock:
                claims = _in_runs.get(id(self.core))
                if claims is not None and self in claims:
                    claims.remove(self)
                    if not claims:
                        del _in_runs[id(self.core)]
            assert self.core is not None
            self.core.release(self.end)

    def __repr__(self) -> str:
        where = "in its context" if self.agent is None else f"in its run, {self.agent!r}"
        return f"<Claim {where}: {'open' if self.open else 'ended'}>"


_here: ContextVar[Claim | None] = ContextVar("nbbudget_claim", default=None)
_lock = threading.Lock()
# the open claims by User-Agent, by the id of their run's core (a run's block ending ends them)
_in_runs: dict[int, list[Claim]] = {}


def claim() -> Claim:
    """Claim the model requests sent from the current context (and the contexts it starts)
    until the returned claim ends."""
    made = Claim(None, None, _here.get())
    _here.set(made)
    return made


@contextmanager
def held() -> Iterator[Claim]:
    """`claim`, for the duration of a ``with`` block."""
    token = _here.set(made := Claim(None, None, _here.get()))
    try:
        yield made
    finally:
        made.open = False
        _here.reset(token)


def claim_in_run(core: Core, agent: str) -> Claim:
    """Claim the requests of the run of *core* whose ``User-Agent`` begins with *agent*, until
    the returned claim ends or the run's block does."""
    made = Claim(core, agent, None)
    with _lock:
        _in_runs.setdefault(id(core), []).append(made)
    core.hold(made.end)
    return made


def claimed(request: Any, core: Core) -> bool:
    """Whether an adapter counts *request*, a model request sent in the run of *core*."""
    here = _here.get()
    while here is not None:  # a claim ended from another context leaves the one before it
        if here.open:
            return True
        here = here.previous
    if not _in_runs:  # no claim by name anywhere: the common case, read without the lock
        return False
    with _lock:
        claims = _in_runs.get(id(core))
        agents = [made.agent for made in claims] if claims else ()
    if not agents:
        return False
    agent = request.headers.get("user-agent", "")
    return any(agent.startswith(name) for name in agents if name is not None)
