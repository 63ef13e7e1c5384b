"""Clients of scheduler addresses: one per address for this process, and a first connection made
off the caller's path when the caller has a budget to keep.

``cluster="tcp://..."`` names a scheduler; the first use connects a ``distributed.Client`` to it,
which takes a fresh process more than half a second (importing Dask, most of it), more than a
short call budget. A caller with a budget (`client_of` with *within_s*) starts the connection on
a thread of its own (``nbbudget-connect``, which ends when the connection is made or fails and
what was handed to it has run) and waits at most that long: if the scheduler has not answered by
then, `ClusterUnanswered` says so, and the connection goes on. A call answered then hands the
rest of its start to the connection (`when_connected`): it runs on that thread once the client
is made, and a process that exits first waits for it, at most `EXIT_WAIT_S` seconds. Without a
budget (``nb.budget(cluster=...)``, a call with no budget) the caller waits for the connection,
as for any ``Client``.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core.clock import Latch
from ...core.errors import ClusterUnanswered, ConfigError

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["EXIT_WAIT_S", "client_class", "client_of", "when_connected"]

#: how long, in seconds, a process that exits waits in all for the starts handed to connections
#: still being made (`when_connected`); what has not run by then is reported on standard error
EXIT_WAIT_S = 10.0

_LIVE = ("running", "connecting", "newly-created")
_clients: dict[str, Client] = {}
_connecting: dict[str, _Connection] = {}
_lock = threading.Lock()  # guards both maps, and what each connection was handed
_held: list[_Connection] = []  # the connections something was handed to: waited for at exit
_held_lock = threading.Lock()  # guards `_held` and `_exit_wait`
_exit_wait = False  # whether this process waits for them at exit (`_wait_at_exit_once`)


class _Handed:
    """What was handed to a connection (*run*, given the client, or the error the connection
    failed with), described as *what*, and how it went: None until it has run, then ``""``, or
    the error it raised, as a line."""

    __slots__ = ("outcome", "run", "what")

    def __init__(self, run: Callable[[Client | None, BaseException | None], None],
                 what: str) -> None:
        self.run = run
        self.what = what
        self.outcome: str | None = None


class _Connection:
    """A client being connected to *address* on a thread of its own (Dask imported there too,
    half a second the first time), then made ready with *prepare*; `done` is set when it is
    connected (kept in `_clients`) or failed (`error`, raised to the callers that wait), and
    what was handed to it (`when_connected`) then runs on the same thread."""

    def __init__(self, address: str, prepare: Callable[[Client], object]) -> None:
        self.address = address
        self._prepare = prepare
        self.done = Latch()
        self.client: Client | None = None
        self.error: BaseException | None = None
        self.handed: list[_Handed] = []
        self.taking = True  # still takes what is handed to it (until it connected or failed)
        self._thread = threading.Thread(target=self._connect, daemon=True,
                                        name=f"nbbudget-connect-{address}")

    def start(self) -> None:
        self._thread.start()

    def _connect(self) -> None:
        client = None
        try:
            make = client_class()
            _reachable(self.address)
            client = make(self.address, set_as_default=False)
            self._prepare(client)
        except BaseException as exc:  # noqa: BLE001 - kept: raised to whoever waits for it
            self.error = exc
        with _lock:
            if client is not None and self.error is None:
                _clients[self.address] = self.client = client
            if _connecting.get(self.address) is self:  # a later caller connects again
                del _connecting[self.address]
            self.taking = False
            handed = list(self.handed)
        self.done.set()
        for start in handed:
            try:
                start.run(self.client, self.error)
            except BaseException as exc:  # noqa: BLE001 - its caller has it (and it is said at exit)
                start.outcome = f"{type(exc).__name__}: {exc}"
            else:
                start.outcome = ""

    def result(self, within_s: float | None, budget_ms: int | None) -> Client:
        """The client, once connected, waiting at most *within_s* seconds (None: as long as
        the connection takes); `ClusterUnanswered` (naming the call budget *budget_ms*) when
        it is not connected by then, the connection's own error when it failed."""
        if not self.done.wait(None if within_s is None else max(0.0, within_s)):
            raise ClusterUnanswered(self.address, budget_ms)
        if self.error is not None:
            raise self.error
        assert self.client is not None
        return self.client

    def join(self, timeout: float) -> None:
        """Wait at most *timeout* seconds for the thread to end."""
        self._thread.join(max(0.0, timeout))

    def ended(self) -> bool:
        return not self._thread.is_alive()


def client_class() -> type[Client]:
    """``distributed.Client`` (Dask imported now, if it was not); a `ConfigError` naming the
    extra to install when Dask is missing."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise ConfigError("cluster= needs Dask: pip install 'nbbudget[dask]'") from exc
    return Client


def _reachable(address: str) -> None:
    """Connect to the scheduler at *address* once and close that connection, on an event loop
    that ends with it; raises what connecting raises (past Dask's connect timeout). A client
    is made only then: one that cannot connect keeps its event loop's thread running (a
    ``distributed.Client`` whose start failed is left closed with its loop running)."""
    import asyncio

    from distributed.comm.core import connect
    from distributed.security import Security

    async def probe() -> None:
        security = Security()  # type: ignore[no-untyped-call]  # distributed is untyped
        args = security.get_connection_args("client")  # type: ignore[no-untyped-call]
        comm = await connect(address, **args)  # type: ignore[no-untyped-call]
        await comm.close()

    asyncio.run(probe())


def client_of(address: str, prepare: Callable[[Client], object], within_s: float | None = None,
              budget_ms: int | None = None) -> Client:
    """The client of the scheduler at *address* for this process, connected now if it has
    none (or its last one closed), and given to *prepare* before anyone uses it. With
    *within_s*, the connection is waited for at most that long (the rest of a call budget of
    *budget_ms*): see the module."""
    with _lock:
        client = _clients.get(address)
        if client is not None and client.status in _LIVE:
            return client
        connection = _connecting.get(address)
        if connection is None:
            connection = _connecting[address] = _Connection(address, prepare)
            connection.start()
    return connection.result(within_s, budget_ms)


def when_connected(address: str, run: Callable[[Client | None, BaseException | None], None],
                   what: str) -> bool:
    """For a call whose cluster did not answer within its budget (`nbbudget.calls.call`): run
    *run* on the thread connecting to *address*, with the client once it is made (or with the
    error the connection failed with, the client None); a process that exits before it has
    run waits for it, at most `EXIT_WAIT_S`, and says on standard error, naming *what*, when
    it has not run by then or raised. False, with nothing handed, when no connection to
    *address* is being made (it ended since the caller stopped waiting for it)."""
    with _lock:
        connection = _connecting.get(address)
        if connection is None or not connection.taking:
            return False
        connection.handed.append(_Handed(run, what))
    with _held_lock:
        _wait_at_exit_once()
        _held[:] = [c for c in _held if not c.ended() and c is not connection]
        _held.append(connection)
    return True


def _forget_after_fork() -> None:
    """A child made by fork has none of its parent's threads: nothing of theirs to wait for."""
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _wait_at_exit_once() -> None:
    """Make this process wait at exit for what was handed to connections (`_wait_at_exit`).
    The wait is registered where ``concurrent.futures`` and anyio finish their threads' work,
    before the interpreter shuts its thread pools and refuses imports that register there (an
    `atexit` function runs after: a connection could no longer resolve a host name, or import
    Dask); the modules that register there as they are imported are imported first, so that
    the wait runs before them and Dask's import registers nothing while it runs."""
    global _exit_wait
    if _exit_wait:
        return
    for module in ("concurrent.futures.thread", "concurrent.futures.process"):
        importlib.import_module(module)
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # an interpreter without it: wait in atexit, which may come too late
        import atexit

        register = atexit.register
    try:
        register(_wait_at_exit)
    except RuntimeError:  # the interpreter is exiting already: it waits for nothing more
        return
    _exit_wait = True


def _wait_at_exit() -> None:
    """Wait, at most `EXIT_WAIT_S` in all, for the connections that were handed what has not
    run yet, then say on standard error what has not run by then, or raised meanwhile."""
    deadline = time.monotonic() + EXIT_WAIT_S
    with _held_lock:
        held = list(_held)
    waited = [(c, start) for c in held for start in c.handed if start.outcome is None]
    for connection in {c for c, _ in waited}:
        connection.join(deadline - time.monotonic())
    for connection, start in waited:
        why = start.outcome
        if why is None:
            doing = "being started" if connection.done.is_set() else "connecting"
            why = (f"it was still {doing} when this process exited, {EXIT_WAIT_S:g} s after "
                   f"it began to exit")
        if why:
            print(f"nbbudget: {start.what} was not started on the cluster at "
                  f"{connection.address!r}: {why}; make the identical call again to start it",
                  file=sys.stderr, flush=True)
