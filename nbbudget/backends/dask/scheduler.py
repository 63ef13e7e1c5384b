"""The server half of the Dask ledger: a run's counters on the scheduler of a Dask cluster
(``pip install 'nbbudget[dask]'``), and the listener that carries a stop to the workers.

`LedgerExtension` is a scheduler plugin. Its handlers are plain functions run on the
scheduler's one event loop, so nothing interleaves between a check and its update: a
reservation over a grant's allowance and its run's limits is all or nothing (S2-2, S4-3), and
exactly the limit is ever granted, however many kernels and workers reserve at once. Each
reservation carries an id chosen by its sender; a message sent again with the same id gets the
first answer and changes nothing, so a retried message never charges twice. A refusal names
the scope that refused, with its limit and what it has consumed (S4-8).

A *lease* is a reservation of a whole-number kind that may come back in part: the holder keeps
the permits in its lock-free pool, and its next lease settles the unused ones in the same round
trip. Leases are granted only from what is free, shrink as the limit nears (a share of what is
free among the holders) and never cross the next approach notice (S3-5). A request that finds
nothing free while another holder's lease is open waits, bounded, for that lease to be settled
before it refuses, so unused permits in a lease never cause a false refusal. Permits held by a
worker that died count as spent: they are never reclaimed by a timeout, which would let a slow
holder spend permits given again to another.

A stop (a cancel, or the whole work's ``timeout=`` measured on the scheduler's clock) marks the
scope and every scope under it, so each later reservation there is refused, and is pushed as a
``nbb_cancelled`` message to the workers whose `CancelListener` announced itself: a worker has
no handler for an op it does not know, and dies of one. Every run has a numbered journal (runs,
grants, refusals, notices, stops, spending past a limit, leases lost with a worker) that the
kernel reads with ``nbb_journal`` into its trace.

Install with `install` (idempotent: a second registration keeps the counters) or with
``dask scheduler --preload nbbudget.dask``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from distributed.utils import sync

from ...core.ledger import plain

if TYPE_CHECKING:
    from distributed import Client, Scheduler, Worker

__all__ = ["LEDGER_NAME", "LISTENER_NAME", "STOP_TOPIC", "Book", "CancelListener", "Channel",
           "LedgerExtension", "Tally", "hear", "install"]

LEDGER_NAME = "nbbudget-ledger"
LISTENER_NAME = "nbbudget-cancel"
STOP_TOPIC = "nbb-stop-"  # + the run's key: the event topic a kernel hears the run's stops on
_INF = math.inf

#: ``[[kind name, amount], ...]`` as sent over the wire, in the attribution order
Wire = Sequence[Sequence[Any]]
#: what the scheduler's extension answers an operation, by field (the ledger of
#: `nbbudget.backends.dask.ledger` reads the counts, the stop and the level in it)
Reply = dict[str, Any]


class Tally:
    """One run or grant on the ledger: its limits, what it has reserved (unused permits of open
    leases included) and whether it is stopped."""

    __slots__ = ("bulk", "counts", "leased", "limits", "name", "parent", "stopped")

    def __init__(self, name: str, parent: Tally | None, limits: dict[str, float]) -> None:
        self.name = name
        self.parent = parent
        self.limits = dict(limits)
        self.counts: dict[str, float] = {}
        self.bulk: dict[str, float] = {}  # amounts beyond one per reservation
        self.leased: dict[str, float] = {}  # what open leases hold, not known to be used
        self.stopped: dict[str, str] | None = None

    def chain(self) -> list[Tally]:
        """The scopes a reservation here counts on: this one, and the run when this is a grant.
        A grant's grant has its own allowance; its steps are not its parent grant's (S2-2)."""
        root = self
        while root.parent is not None:
            root = root.parent
        return [self] if root is self else [self, root]

    def free(self, kind: str) -> float:
        return self.limits.get(kind, _INF) - self.counts.get(kind, 0)

    def add(self, kind: str, n: float, bulk: float) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n
        self.bulk[kind] = self.bulk.get(kind, 0) + bulk

    def figures(self) -> dict[str, Any]:
        return {"limits": dict(self.limits), "counts": dict(self.counts),
                "bulk": dict(self.bulk), "leased": dict(self.leased),
                "stopped": self.stopped, "parent": self.parent and self.parent.name}


class Lease:
    """Permits of one kind given to one holder on a scope, until that holder settles them."""

    __slots__ = ("amount", "holder", "kind", "scope")

    def __init__(self, scope: Tally, kind: str, amount: float, holder: str) -> None:
        self.scope, self.kind, self.amount, self.holder = scope, kind, amount, holder


class Book:
    """One run on the ledger: its scopes, its open leases, the answers already given (by
    reservation id) and its journal."""

    def __init__(self, run: str, notices: Sequence[float] | None) -> None:
        self.run = run
        self.scopes: dict[str, Tally] = {}
        self.leases: dict[str, Lease] = {}
        self.replies: dict[str, Reply] = {}
        self.journal: list[dict[str, Any]] = []
        self.notices = tuple(notices or ())
        self.notice_level = 0
        self.settled = asyncio.Event()  # set (and replaced) whenever a lease is settled
        self.timer: asyncio.TimerHandle | None = None

    @property
    def root(self) -> Tally:
        return next(iter(self.scopes.values()))

    def log(self, event: str, **payload: Any) -> None:
        self.journal.append({"seq": len(self.journal) + 1, "t": time.time(), "event": event,
                             **payload})

    def settle(self, lease_id: str, unused: float) -> None:
        """Give back *unused* permits of an open lease (once: a lease settled is forgotten)."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        unused = max(0, min(unused, lease.amount))
        for scope in lease.scope.chain():
            scope.counts[lease.kind] -= unused
            scope.leased[lease.kind] -= lease.amount
        self.settled.set()
        self.settled = asyncio.Event()

    def open_leases(self, chain: Iterable[Tally], kind: str, holder: str) -> bool:
        """Whether another holder has a lease of *kind* open on any scope of *chain*."""
        scopes = {id(s) for s in chain}
        return any(lease.kind == kind and lease.holder != holder
                   and id(lease.scope) in scopes for lease in self.leases.values())

    def holders(self, kind: str, but: str) -> int:
        """How many holders other than *but* have a lease of *kind* open."""
        return len({lease.holder for lease in self.leases.values()
                    if lease.kind == kind and lease.holder != but})

    def notice_room(self, kind: str) -> float:
        """How many more of *kind* the run may reserve before its next approach notice is due."""
        limit = self.root.limits.get(kind)
        if limit is None or self.notice_level >= len(self.notices):
            return _INF
        return math.ceil(limit * self.notices[self.notice_level]) - 1 - (
            self.root.counts.get(kind, 0))

    def give_notices(self) -> None:
        """Record each approach notice now due, at the run's highest ratio (S3-5)."""
        root = self.root
        ratios = [(root.counts.get(k, 0) / v, k) for k, v in root.limits.items()
                  if v and k != "run_ms"]
        if not ratios:
            return
        ratio, kind = max(ratios)
        while self.notice_level < len(self.notices) and ratio >= self.notices[self.notice_level]:
            self.notice_level += 1
            self.log("approach_notice", level=self.notice_level, budget_kind=kind,
                     threshold=self.notices[self.notice_level - 1], ratio=round(ratio, 6))


class LedgerExtension(SchedulerPlugin):
    """The ledger of every nbbudget run on this cluster, in the scheduler's memory."""

    name = LEDGER_NAME
    idempotent = True  # a second registration must not replace the counters

    def __init__(self) -> None:
        self.books: dict[str, Book] = {}
        self.listeners: set[str] = set()
        self.scheduler: Scheduler | None = None

    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers.update({
            "nbb_open": self.open, "nbb_reserve": self.reserve, "nbb_spend": self.spend,
            "nbb_settle": self.settle, "nbb_cancel": self.cancel, "nbb_snapshot": self.snapshot,
            "nbb_journal": self.read_journal, "nbb_close": self.forget,
            "nbb_listen": self.listen, "nbb_attempt": self.attempt, "nbb_ping": self.ping,
        })

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        """A worker left: it no longer listens, and the permits it held stay spent."""
        self.listeners.discard(worker)
        for book in self.books.values():
            lost = [(lid, lease) for lid, lease in book.leases.items()
                    if lease.holder.startswith(worker + "#")]
            for lease_id, lease in lost:
                book.log("lease_lost", lease=lease_id, scope=lease.scope.name,
                         kind=lease.kind, amount=lease.amount, worker=worker)

    # -- runs and grants ---------------------------------------------------------------------
    def open(self, run: str, scope: str, limits: dict[str, float], parent: str | None = None,
             notices: Sequence[float] | None = None, counts: dict[str, float] | None = None,
             timeout_ms: float | None = None, how: dict[str, Any] | None = None) -> Reply:
        """Open *run* (``parent`` None) or a grant *scope* under *parent*; opening again only
        narrows the limits. A run's *counts* are what a checkpoint carried; *timeout_ms* (a
        duration, never a deadline: clocks differ between machines) stops the whole run on the
        scheduler's clock, with *how* as the stop's description (see `cancel`), the first time
        the run is given one."""
        book = self.books.get(run)
        if book is None:
            book = self.books[run] = Book(run, notices)
        tally = book.scopes.get(scope)
        if tally is None:
            above = book.scopes[parent] if parent is not None else None
            tally = book.scopes[scope] = Tally(scope, above, limits)
            for kind, n in (counts or {}).items():
                tally.add(kind, n, n)
            book.log("grant" if above else "run", scope=scope, limits=dict(limits),
                     parent=parent)
        else:
            for kind, value in limits.items():
                tally.limits[kind] = min(value, tally.limits.get(kind, _INF))
        if timeout_ms is not None and book.timer is None and tally.parent is None:
            book.timer = asyncio.get_running_loop().call_later(
                max(0.0, timeout_ms) / 1000, self.cancel, run, scope, None, "timeout", how)
        return {"ok": True, "notice_level": book.notice_level, "stopped": tally.stopped}

    def forget(self, run: str) -> Reply:
        """Forget *run* (its answers, leases and counters); its journal's last part returned."""
        book = self.books.pop(run, None)
        if book is None:
            return {"ok": True, "journal": []}
        if book.timer is not None:
            book.timer.cancel()
        return {"ok": True, "journal": book.journal}

    # -- check and reserve -------------------------------------------------------------------
    async def reserve(self, run: str, scope: str, items: Wire, rid: str, holder: str = "",
                      lease: bool = False, settle: Sequence[Sequence[Any]] = (),
                      wait_s: float = 0.0) -> Reply:
        """Reserve *items* on *scope* and every scope above it, all or nothing, after settling
        the leases in *settle* (``[[lease id, unused], ...]``). With *lease*, each item is how
        many permits are wanted, and fewer may be given. A refusal while another holder's lease
        of the kind is open waits up to *wait_s* for a settle, then looks again."""
        book = self.books.get(run)
        if book is None:
            return {"ok": False, "unknown": run}
        deadline = time.monotonic() + wait_s
        for lease_id, unused in settle:
            book.settle(lease_id, unused)
        while True:
            reply = self.reserve_now(book, scope, items, rid, holder, lease)
            left = deadline - time.monotonic()
            if reply["ok"] or not reply.pop("waitable", False) or left <= 0:
                book.replies[rid] = reply
                return reply
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(book.settled.wait(), left)

    def reserve_now(self, book: Book, scope: str, items: Wire, rid: str, holder: str,
                    lease: bool) -> Reply:
        """One atomic attempt of `reserve`: the first answer to *rid*, or a new one."""
        known = book.replies.get(rid)
        if known is not None:
            return known
        chain = book.scopes[scope].chain()
        stopped = next((s for s in chain if s.stopped is not None), None)
        if stopped is not None:
            return {"ok": False, "stopped": stopped.stopped, "scope": stopped.name}
        wanted = [(str(k), float(n)) for k, n in items]
        granted = self.lease_sizes(book, chain, wanted, holder) if lease else wanted
        for (kind, n), (_, want) in zip(granted, wanted, strict=True):
            if (n < 1) if lease else any(s.free(kind) < n for s in chain):
                return self.refusal(book, chain, kind, 1 if lease else want, holder)
        for kind, n in granted:
            for s in chain:
                s.add(kind, n, 0 if lease else n - 1)
                if lease:
                    s.leased[kind] = s.leased.get(kind, 0) + n
            if lease:
                book.leases[f"{rid}/{kind}"] = Lease(chain[0], kind, n, holder)
        book.give_notices()
        return {"ok": True, "granted": [[k, plain(n)] for k, n in granted],
                "notice_level": book.notice_level}

    @staticmethod
    def lease_sizes(book: Book, chain: list[Tally], wanted: list[tuple[str, float]],
                    holder: str) -> list[tuple[str, float]]:
        """How many permits of each kind to lease: what is wanted, no more than what is free,
        a fair share of it among the holders, and never past the next approach notice."""
        out = []
        for kind, want in wanted:
            free = min(s.free(kind) for s in chain)
            # a kind with no limit is leased one permit at a time, for now (see the docs page)
            share = 1 if free == _INF else max(1, free // (2 * (book.holders(kind, holder) + 1)))
            room = book.notice_room(kind)
            out.append((kind, max(0, min(want, free, share, room if room >= 1 else 1))))
        return out

    def refusal(self, book: Book, chain: list[Tally], kind: str, n: float,
                holder: str) -> Reply:
        """The refusal of *n* of *kind* by the first scope of *chain* that has not that much
        left; ``waitable`` when another holder's lease might still give some back."""
        scope = next((s for s in chain if s.free(kind) < n), chain[-1])
        reply = {"ok": False, "scope": scope.name, "grant": scope.parent is not None,
                 "kind": kind, "limit": plain(scope.limits.get(kind, _INF)),
                 "consumed": plain(scope.counts.get(kind, 0)), "amount": plain(n),
                 "leased": plain(scope.leased.get(kind, 0))}
        if book.open_leases(chain, kind, holder):
            reply["waitable"] = True
        else:  # nothing can come back: no other lease of the kind is open
            reply["final"] = True
            book.log("refused", **{k: v for k, v in reply.items() if k not in ("ok", "final")})
        return reply

    def settle(self, run: str, settle: Sequence[Sequence[Any]]) -> Reply:
        """Give back the unused permits of leases (``[[lease id, unused], ...]``): at the end of
        a branch, on a stop, or when a holder has no more use for them."""
        book = self.books.get(run)
        if book is not None:
            for lease_id, unused in settle:
                book.settle(lease_id, unused)
        return {"ok": True}

    # -- after the fact ----------------------------------------------------------------------
    def spend(self, run: str, scope: str, items: Wire, rid: str) -> Reply:
        """Count spending that already happened on *scope* and above it, even past a limit
        (S4-10); for each scope, the first kind whose limit it passed, in the order given."""
        book = self.books.get(run)
        if book is None:
            return {"ok": False, "unknown": run}
        known = book.replies.get(rid)
        if known is not None:
            return known
        chain = book.scopes[scope].chain()
        for kind, n in items:
            for s in chain:
                s.add(kind, n, n - 1)
        passed = []
        for s in chain:
            kind = next((k for k, _ in items if s.free(k) < 0), None)
            if kind is not None:
                passed.append([s.name, kind, plain(s.limits[kind]), plain(s.counts[kind])])
                book.log("passed", scope=s.name, kind=kind, limit=passed[-1][2],
                         consumed=passed[-1][3])
        book.give_notices()
        reply = book.replies[rid] = {"ok": True, "passed": passed,
                                     "notice_level": book.notice_level}
        return reply

    # -- stops -------------------------------------------------------------------------------
    def cancel(self, run: str, scope: str, reason: Any = None, cause: str = "cancel",
               how: dict[str, Any] | None = None) -> Reply:
        """Stop *scope* and every scope under it: each later reservation there is refused, and
        the workers that listen are told (idempotent: the first stop is kept). *how* is the
        stop as the holder that made it knows it (status, message, by, code), passed on."""
        book = self.books.get(run)
        if book is None or scope not in book.scopes:
            return {"ok": False}
        target = book.scopes[scope]
        stop: dict[str, Any] = {"cause": cause, "reason": None if reason is None else str(reason),
                                "how": how}
        fresh = [s for s in book.scopes.values() if target in s.chain() and s.stopped is None]
        for s in fresh:
            s.stopped = dict(stop, scope=scope)
        if fresh:
            book.log("stopped", scope=scope, **stop)
            self.push({"op": "nbb_cancelled", "run": run, "scope": scope, **stop})
        return {"ok": True, "stopped": target.stopped}

    def push(self, msg: dict[str, Any]) -> None:
        """Send *msg* to every worker whose listener announced itself (none other knows it),
        and as an event to the kernels that subscribed to the run's stops."""
        assert self.scheduler is not None
        self.scheduler.log_event(STOP_TOPIC + msg["run"], dict(msg))
        for address in list(self.listeners):
            if address in self.scheduler.workers:
                self.scheduler.worker_send(address, dict(msg))

    def listen(self, address: str) -> Reply:
        """A worker's `CancelListener` is ready for ``nbb_cancelled`` messages."""
        self.listeners.add(address)
        return {"ok": True}

    # -- reading -----------------------------------------------------------------------------
    def snapshot(self, run: str) -> Reply:
        """Every scope of *run*: limits, counts, leased, stop; the notice level; the journal's
        length."""
        book = self.books.get(run)
        if book is None:
            return {"ok": False}
        return {"ok": True, "scopes": {n: s.figures() for n, s in book.scopes.items()},
                "notice_level": book.notice_level, "seq": len(book.journal),
                "leases": len(book.leases)}

    def read_journal(self, run: str, since: int = 0) -> Reply:
        """The journal entries of *run* numbered after *since*."""
        book = self.books.get(run)
        return {"ok": book is not None, "events": book.journal[since:] if book else []}

    def attempt(self, key: str) -> Reply:
        """How many times the task *key* was already lost with a worker (its attempt number)."""
        assert self.scheduler is not None
        task = self.scheduler.tasks.get(key)
        return {"ok": True, "attempt": task.suspicious if task is not None else 0}

    def ping(self) -> Reply:
        return {"ok": True}


class CancelListener(WorkerPlugin):
    """On each worker: receives the ledger's ``nbb_cancelled`` pushes and calls the stop
    functions that runs on this worker registered with `watch`."""

    name = LISTENER_NAME
    idempotent = True

    def __init__(self) -> None:
        self.watchers: dict[str, list[Callable[[str, dict[str, Any]], None]]] = {}

    async def setup(self, worker: Worker) -> None:
        worker.stream_handlers["nbb_cancelled"] = self.cancelled
        await worker.scheduler.nbb_listen(address=worker.address)

    def teardown(self, worker: Worker) -> None:
        worker.stream_handlers.pop("nbb_cancelled", None)

    def watch(self, run: str, fn: Callable[[str, dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``fn(scope, stop)`` when a stop of *run* arrives; returns the unwatch."""
        self.watchers.setdefault(run, []).append(fn)

        def unwatch() -> None:
            fns = self.watchers.get(run, [])
            if fn in fns:
                fns.remove(fn)
            if not fns:
                self.watchers.pop(run, None)

        return unwatch

    def cancelled(self, run: str, scope: str, cause: str, reason: str | None,
                  how: dict[str, Any] | None) -> None:
        for fn in list(self.watchers.get(run, ())):
            fn(scope, {"cause": cause, "reason": reason, "how": how})


class Channel:
    """Calls the ledger's handlers, from a kernel through its client or from a task through its
    worker's connection to the scheduler; each call is one round trip, answered in order."""

    def __init__(self, loop: Any, scheduler: Any, address: str, *, client: Client | None = None,
                 worker: Worker | None = None) -> None:
        self.loop = loop
        self.scheduler = scheduler
        self.address = address  # the worker's address, or the client's id
        self.client = client
        self.worker = worker

    @classmethod
    def of(cls, client: Client) -> Channel:
        return cls(client.loop, client.scheduler, str(client.id), client=client)

    @classmethod
    def here(cls) -> Channel:
        """The channel of the worker this task runs on."""
        from distributed import get_worker

        worker = get_worker()
        return cls(worker.loop, worker.scheduler, str(worker.address), worker=worker)

    def call(self, op: str, **kwargs: Any) -> Reply:
        reply: Reply = sync(self.loop, getattr(self.scheduler, op), **kwargs)
        return reply

    def on_stop(self, run: str,
                fn: Callable[[str, dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``fn(scope, stop)`` (on the event loop) when the ledger stops *run* or one of
        its grants; returns the function that stops listening."""
        if self.worker is not None:
            listener = self.worker.plugins[LISTENER_NAME]
            assert isinstance(listener, CancelListener)
            return listener.watch(run, fn)
        assert self.client is not None

        def heard(event: tuple[float, dict[str, Any]]) -> None:
            msg = event[1]
            fn(msg["scope"], {"cause": msg["cause"], "reason": msg["reason"], "how": msg["how"]})

        return hear(self.client, STOP_TOPIC + run, heard)


Event = tuple[float, dict[str, Any]]
#: by client and topic, what hears its events: a client keeps one handler per topic, and two
#: parts of one process may hear one topic (two runs of one task's run, in one kernel)
_hearing: weakref.WeakKeyDictionary[Client, dict[str, list[Callable[[Event], None]]]] = (
    weakref.WeakKeyDictionary())
_hearing_lock = threading.Lock()


def hear(client: Client, topic: str, fn: Callable[[Event], None]) -> Callable[[], None]:
    """Call ``fn(event)`` (on *client*'s event loop) for each event of *topic* from now on,
    beside whatever else of this process hears it; returns the function that stops it."""
    with _hearing_lock:
        topics = _hearing.setdefault(client, {})
        fns = topics.get(topic)
        if fns is None:
            fns = topics[topic] = []

            def heard(event: Event, fns: list[Callable[[Event], None]] = fns) -> None:
                for each in list(fns):
                    each(event)

            client.subscribe_topic(topic, heard)  # type: ignore[no-untyped-call]  # untyped
        fns.append(fn)

    def unheard() -> None:
        with _hearing_lock:
            topics = _hearing.get(client, {})
            listening = topics.get(topic)
            if listening is None or fn not in listening:
                return
            listening.remove(fn)
            if not listening:
                del topics[topic]
                client.unsubscribe_topic(topic)  # type: ignore[no-untyped-call]  # untyped

    return unheard


def install(client: Client) -> None:
    """Install the ledger on *client*'s scheduler and the listener on its workers; again, it
    changes nothing (the counters are kept)."""
    client.register_plugin(LedgerExtension())
    client.register_plugin(CancelListener())

