"""Clients of scheduler addresses: one per address for this process, and a first connection made
off the caller's path when the caller has a budget to keep.

``cluster="tcp://..."`` names a scheduler; the first use connects a ``distributed.Client`` to it,
which takes a few hundred milliseconds, more than a short call budget. A caller with a budget
(`client_of` with *within_s*) starts the connection on a thread of its own (``nbbudget-connect``,
which ends when the connection is made or fails) and waits at most that long: if the scheduler
has not answered by then, `ClusterUnanswered` says so and nothing ran, and the connection goes
on for the next call. Without a budget (``nb.budget(cluster=...)``, a call with no budget) the
caller waits for the connection, as for any ``Client``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .clock import Latch
from .errors import ClusterUnanswered, ConfigError

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["client_class", "client_of"]

_LIVE = ("running", "connecting", "newly-created")
_clients: dict[str, Client] = {}
_connecting: dict[str, _Connection] = {}
_lock = threading.Lock()  # guards both maps


class _Connection:
    """A client being connected to *address* on a thread of its own (Dask imported there too,
    half a second the first time), then made ready with *prepare*; `done` is set when it is
    connected (kept in `_clients`) or failed (`error`, raised to the callers that wait)."""

    def __init__(self, address: str, prepare: Callable[[Client], object]) -> None:
        self.address = address
        self._prepare = prepare
        self.done = Latch()
        self.client: Client | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._connect, daemon=True,
                                        name=f"nbbudget-connect-{address}")

    def start(self) -> None:
        self._thread.start()

    def _connect(self) -> None:
        client = None
        try:
            make = client_class()
            client = make(self.address, set_as_default=False)  # type: ignore[no-untyped-call]
            self._prepare(client)
        except BaseException as exc:  # noqa: BLE001  (kept: raised to whoever waits for it)
            self.error = exc
        with _lock:
            if client is not None and self.error is None:
                _clients[self.address] = self.client = client
            if _connecting.get(self.address) is self:  # a later caller connects again
                del _connecting[self.address]
        self.done.set()

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


def client_class() -> type[Client]:
    """``distributed.Client`` (Dask imported now, if it was not); a `ConfigError` naming the
    extra to install when Dask is missing."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise ConfigError("cluster= needs Dask: pip install 'nbbudget[dask]'") from exc
    return Client


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
