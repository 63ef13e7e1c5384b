"""The history of runs: the last runs of a store, each with when it ran, what it was, how it
ended, its limits, what it consumed and its trace, for ``nbbudget history``, ``%budget
history`` and `suggest_limits`.

What is recorded: every run that ends (a ``with nb.budget()`` block, the work of ``nb.call``,
a ``%%budget`` cell) and every notebook run of ``nbbudget run``, in the table ``history`` of the
store of ``NBBUDGET_HOME`` (`nbbudget.calls.store`). The run layer tells `set_on_end`'s hook
when a run ends (`nbbudget.run.budget._leave`: the one place every ``with`` block, every call's
run and every cell's run leaves through); the hook installed here only queues the run, so a run
never waits for the store: one background thread, ``nbbudget-history``, owned by the module's
`Writer`, writes what is queued in one transaction at a time, and ends once nothing has been
queued for `IDLE_S` (an idle process holds no thread); `flush` writes what is queued at once,
and runs at exit. ``nbbudget run`` records a notebook's run from its runner process
(`record_notebook`).

When it is kept: ``NBBUDGET_HISTORY=1`` keeps it, ``0`` never; unset, it is kept in IPython
once ``%load_ext nbbudget`` has run (the setting ``NBBudget.history``, True unless set) and by
``nbbudget run``, and not in plain Python. It is read when nbbudget is imported and when the
IPython layer loads or its setting changes (`refresh`); with it off no hook is installed, and a
run that ends pays one test of a global.

The bound: the last `KEEP_RUNS` runs of at most `KEEP_DAYS` days; the oldest are dropped as
rows are added. The queue holds at most `KEEP_RUNS` runs too (a program that ends runs faster
than the store takes them loses the oldest of them). A trace is kept whole up to
`TRACE_EVENTS` events; a longer one (``trace="full"``) keeps its counters and every event but
its charges, and replays from its totals. Each is JSON, zlib-compressed.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import math
import os
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError
from ..core.kinds import KIND_INDEX, KINDS
from ..core.limits import Limits
from ..core.suggest import Suggestion, suggest
from ..core.trace import Trace
from ..run.budget import Budget, Deferred, set_on_end
from .store import SQLiteStore, StoreBusy, StoreDamaged, store

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["IDLE_S", "KEEP_DAYS", "KEEP_RUNS", "TRACE_EVENTS", "Entry", "Writer", "entries",
           "flush", "forget", "keeping", "mark", "record_notebook", "set_default", "traces",
           "writer"]

#: the history keeps the last 1,000 runs (``nbbudget history`` and the docs say so)
KEEP_RUNS = 1000
#: and none that ended more than 30 days ago
KEEP_DAYS = 30
#: a trace with more events is kept without its charges
TRACE_EVENTS = 10_000
#: the writer thread ends once nothing was queued for this long, in seconds
IDLE_S = 0.25
_POLL_S = 0.02  # how often the writer looks for runs queued
_COLUMNS = ("id", "kind", "name", "started", "ended", "status", "cause", "by", "limits",
            "consumed", "trace")


@dataclass(frozen=True)
class Entry:
    """One run of the history: its ``id`` in the store (newest is highest), ``kind`` (``run``,
    ``call``, ``cell`` or ``notebook``), ``name`` (a run's name, a call's function or key, a
    cell's first line, a notebook's path), ``started`` and ``ended`` (``time.time()``),
    ``status``, ``cause`` and ``by`` (its outcome), its ``limits`` and ``consumed`` (by kind),
    and its trace as saved (`trace` reads it)."""

    id: int
    kind: str
    name: str
    started: float
    ended: float
    status: str
    cause: str | None
    by: str | None
    limits: dict[str, float]
    consumed: dict[str, float]
    saved_trace: bytes | None

    def trace(self) -> Trace:
        """The run's trace: as recorded, or (for a run that spent nothing but time, or a
        notebook run) one from its totals."""
        if self.saved_trace is None:
            return _totals_trace(self.name, self.limits, self.consumed,
                                 {"status": self.status, "cause": self.cause, "by": self.by})
        return Trace.from_json(json.loads(zlib.decompress(self.saved_trace)))

    def row(self) -> dict[str, Any]:
        """The entry as ``nbbudget history --json`` prints it (times as ISO 8601, UTC)."""
        return {"id": self.id, "kind": self.kind, "name": self.name,
                "started": _iso(self.started), "ended": _iso(self.ended),
                "status": self.status, "cause": self.cause, "by": self.by,
                "limits": self.limits, "consumed": self.consumed}


# -- whether it is kept -----------------------------------------------------------------------
_default: Callable[[], bool] | None = None


def set_default(provider: Callable[[], bool] | None) -> None:
    """Install (or remove) whether the history is kept when ``NBBUDGET_HISTORY`` is unset: the
    IPython layer installs its ``NBBudget.history`` setting (and calls `refresh` when it
    changes)."""
    global _default
    _default = provider
    refresh()


def refresh() -> None:
    """Read again whether the history is kept (`keeping`), and install the run layer's hook
    only if it is: with the history off, a run that ends tests one global and calls nothing.
    Done when nbbudget is imported, when the IPython layer loads or unloads, and when its
    setting changes."""
    set_on_end(_writer.add if keeping() else None)


def keeping() -> bool:
    """Whether runs that end now are recorded: ``NBBUDGET_HISTORY`` (``1`` or ``0``), else the
    IPython layer's setting once it is loaded, else not."""
    told = _told()
    if told is not None:
        return told
    return _default is not None and _default()


def _told() -> bool | None:
    """What ``NBBUDGET_HISTORY`` says: off for ``0``, ``false``, ``no``, ``off`` or empty, on
    for anything else, None when it is unset."""
    setting = os.environ.get("NBBUDGET_HISTORY")
    return None if setting is None else setting.strip().lower() not in (
        "0", "false", "no", "off", "")


# -- recording ---------------------------------------------------------------------------------
#: the kind of a run, where its host says (a cell's run is the magic's); read by the writer
_marks: weakref.WeakKeyDictionary[Budget, str] = weakref.WeakKeyDictionary()


def mark(run: Budget, kind: str) -> None:
    """Record *run* as a run of *kind* (``cell``) rather than as its block or call says. The
    IPython layer marks each ``%%budget`` cell's run."""
    _marks[run] = kind


class Writer:
    """The queue of runs ended and not yet written, and the thread that writes them
    (``nbbudget-history``): started by the first run queued, ended once the queue stayed empty
    for `IDLE_S`, started again by the next. `flush` writes what is queued from the caller's
    thread; one lock keeps two writes apart, so each run is written once."""

    def __init__(self) -> None:
        self.queue: collections.deque[
            tuple[Budget | Deferred, str, Trace | None, float, str | None]] = collections.deque(
                maxlen=KEEP_RUNS)
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()  # starting and ending the thread
        self.writing = threading.Lock()  # one batch written at a time
        self.dropped = 0  # runs that could not be written (the store busy or damaged)

    def add(self, run: Budget | Deferred, how: str, trace: Trace | None) -> None:
        """Queue *run*, which ended now (the hook `set_on_end` calls, on the run's thread), for
        the store of ``NBBUDGET_HOME`` as it is now."""
        self.queue.append((run, how, trace, time.time(), os.environ.get("NBBUDGET_HOME")))
        if self.thread is None:
            with self.lock:
                if self.thread is None:
                    self.thread = threading.Thread(target=self._loop, name="nbbudget-history",
                                                   daemon=True)
                    self.thread.start()

    def _loop(self) -> None:
        idle_since = time.monotonic()
        try:
            while True:
                if self.flush():
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= IDLE_S:
                    with self.lock:
                        if not self.queue:
                            self.thread = None
                            return
                time.sleep(_POLL_S)
        finally:
            _close_connection()
            with self.lock:
                if self.thread is threading.current_thread():  # ended by an error: the
                    self.thread = None                           # next run starts another

    def forget_thread(self) -> None:
        """In a child made by ``os.fork``: the parent's thread does not exist here."""
        self.thread = None
        self.lock = threading.Lock()
        self.writing = threading.Lock()

    def flush(self) -> int:
        """Write every run queued, in one transaction per store; how many were written."""
        with self.writing:
            batches: dict[str | None, list[tuple[Any, ...]]] = {}
            while self.queue:
                run, how, trace, ended, home = self.queue.popleft()
                try:
                    row = _row(run, how, trace, ended)
                except Exception:  # noqa: BLE001 - a run that cannot be read (its cluster
                    self.dropped += 1  # gone, say) is left out; the others are written
                    continue
                batches.setdefault(home, []).append(row)
            written = 0
            for home, rows in batches.items():
                try:
                    _insert(_store_of(home), rows)
                except (StoreBusy, StoreDamaged, ConfigError, OSError):
                    self.dropped += len(rows)  # the store cannot take them: the runs went on
                else:
                    written += len(rows)
            return written


def _store_of(home: str | None) -> SQLiteStore:
    """The store of the ``NBBUDGET_HOME`` *home* was when a run ended (None: unset)."""
    if home == os.environ.get("NBBUDGET_HOME") or not home or not os.path.isabs(home):
        return store()
    found = _others.get(home)
    if found is None:
        found = _others[home] = SQLiteStore(home)
    return found


#: the stores of runs that ended under another ``NBBUDGET_HOME`` than the one set now
_others: dict[str, SQLiteStore] = {}


_writer = Writer()


def writer() -> Writer:
    """The process's `Writer` (its thread, its queue)."""
    return _writer


def flush() -> int:
    """Write what is queued now (at exit, and before the history is read in this process)."""
    return _writer.flush()


refresh()
atexit.register(flush)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_writer.forget_thread)


def _close_connection() -> None:
    """The writer thread is ending: its connections to the stores are closed."""
    with contextlib.suppress(ConfigError, OSError):
        store().close()
    for other in _others.values():
        other.close()


def _row(run: Budget | Deferred, how: str, trace: Trace | None,
         ended: float) -> tuple[Any, ...]:
    """The row of a run that ended at *ended* (``time.time()``)."""
    budget = run.run if isinstance(run, Deferred) else run  # made now, not built: its times
    kind = _marks.pop(budget, how)
    outcome = budget.outcome
    consumed = budget.consumed  # time included, in whole milliseconds
    saved = None if trace is None else zlib.compress(json.dumps(
        _compact(trace), separators=(",", ":"), default=str).encode())
    return (kind, budget.name, ended - consumed.get("run_ms", 0) / 1000, ended,
            outcome.status.value if outcome is not None else "ended",
            outcome.cause if outcome is not None else None,
            outcome.by if outcome is not None else None,
            _amounts_json(budget.limits.to_dict()), _amounts_json(consumed), saved)


def _amounts_json(amounts: dict[str, float]) -> str:
    """``json.dumps(amounts)`` of a run's limits or consumption, by kind: written here where
    each key is a kind's name (no character to escape) and each value a finite int or float,
    whose JSON is its repr; else by `json.dumps`. (json.dumps took a quarter of the time the
    writer spends on a cell's run, bench_magic.py.)"""
    if not amounts:
        return "{}"
    parts = []
    for kind, value in amounts.items():
        if not (kind in KIND_INDEX and (type(value) is int or (
                type(value) is float and math.isfinite(value)))):
            return json.dumps(amounts)
        parts.append(f'"{kind}": {value!r}')
    return "{" + ", ".join(parts) + "}"


def _compact(trace: Trace) -> dict[str, Any]:
    """*trace* as saved in the history: whole up to `TRACE_EVENTS` events, else its counters
    and every event but its charges (it then replays from its totals)."""
    data = trace.to_json()
    events = data["events"]
    if len(events["code"]) <= TRACE_EVENTS:
        return data
    keep = [i for i, code in enumerate(events["code"]) if code != "consumed"][:TRACE_EVENTS]
    data["mode"] = "counts"
    data["events"] = {column: [events[column][i] for i in keep]
                      for column in ("code", "t_ms", "amount", "ref", "run")}
    data["events"]["payloads"] = events["payloads"]
    return data


def record_notebook(db: SQLiteStore, path: str, started: float, status: str,
                    error: dict[str, Any] | None, limits: dict[str, float],
                    consumed: dict[str, float] | None) -> None:
    """Record a notebook run of ``nbbudget run`` that ended now (its runner calls it, unless
    ``NBBUDGET_HISTORY=0``): its totals, no trace; its cause is the code of the error that
    ended it, and its ``by`` what that code says stopped it (`_notebook_by`). *limits* are as
    ``--run-limits-json`` gives them. A store that cannot take it leaves it out: the run's end
    is recorded all the same."""
    if _told() is False:
        return
    code = (error or {}).get("code")
    row = ("notebook", path, started, time.time(), status, code, _notebook_by(status, code),
           json.dumps(Limits.from_json(limits).to_dict()), json.dumps(consumed or {}), None)
    with contextlib.suppress(StoreBusy, StoreDamaged, ConfigError, OSError):
        _insert(db, [row])  # the run's end is written already: its history may be left out


#: the ``by`` of a notebook run ended by a limit, from its error's code: the limit's kind, or
#: ``timeout`` for the time grant, as a run of any other kind says it (S2-4)
_BY_CODE = {kind.code: "timeout" if kind.clock else kind.name for kind in KINDS}


def _notebook_by(status: str, code: str | None) -> str | None:
    """What stopped a notebook run, from the *code* of the error that ended it: a limit's kind
    (``steps``), ``timeout``, what cut it (``budget_cut_watchdog``: ``watchdog``), or
    ``wall-clock`` for a run cancelled by its ``--timeout``; None when nothing of a budget did
    (an error in a cell, a person's stop)."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code is not None and code.startswith("budget_cut_"):
        return code.removeprefix("budget_cut_").replace("_", "-")
    return "wall-clock" if status == "cancelled" else None


def _insert(db: SQLiteStore, rows: list[tuple[Any, ...]]) -> None:
    """Add *rows* and drop what the bound no longer keeps, in one transaction."""
    with db.transaction() as conn:
        conn.executemany("INSERT INTO history (kind, name, started, ended, status, cause, by, "
                         "limits, consumed, trace) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("DELETE FROM history WHERE ended < ?", (time.time() - KEEP_DAYS * 86400,))
        conn.execute("DELETE FROM history WHERE id <= (SELECT id FROM history ORDER BY id DESC "
                     "LIMIT 1 OFFSET ?)", (KEEP_RUNS,))


# -- reading -----------------------------------------------------------------------------------
def entries(limit: int | None = None, db: SQLiteStore | None = None) -> list[Entry]:
    """The runs of the history, newest first (at most *limit*); what this process has queued
    is written first. A row that cannot be read is a `ConfigError` naming it and the fix."""
    flush()
    db = db if db is not None else store()
    with db.read_transaction() as conn:
        rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM history ORDER BY id DESC "
                            f"LIMIT ?", (-1 if limit is None else limit,)).fetchall()
    return [_entry(row, db) for row in rows]


def _entry(row: tuple[Any, ...], db: SQLiteStore) -> Entry:
    values = dict(zip(_COLUMNS, row, strict=True))
    try:
        limits, consumed = json.loads(values["limits"]), json.loads(values["consumed"])
        if not (isinstance(limits, dict) and isinstance(consumed, dict)):
            raise ValueError("its limits or consumption is not an object")
        trace = values["trace"]
        if trace is not None and not isinstance(trace, bytes):
            raise ValueError("its trace is not compressed JSON")
        by = values["by"]
        if by is None and values["kind"] == "notebook":  # recorded before it kept its by
            by = _notebook_by(str(values["status"]), values["cause"])
        return Entry(int(values["id"]), str(values["kind"]), str(values["name"]),
                     float(values["started"]), float(values["ended"]), str(values["status"]),
                     values["cause"], by, limits, consumed, trace)
    except (TypeError, ValueError) as exc:
        raise _damaged(values["id"], db, str(exc)) from None


def _damaged(row_id: Any, db: SQLiteStore, why: str) -> ConfigError:
    return ConfigError(f"run {row_id} of the history in {db.location!r} cannot be read ({why}); "
                       f"it was left as it is. Remove it with: nbbudget history --forget "
                       f"{row_id}")


def traces(limit: int | None = None, db: SQLiteStore | None = None) -> list[Trace]:
    """The traces of the history's runs, newest first: what `suggest_limits` reads."""
    db = db if db is not None else store()
    out = []
    for entry in entries(limit, db):
        try:
            out.append(entry.trace())
        except (zlib.error, ValueError, ConfigError) as exc:
            raise _damaged(entry.id, db, f"its trace: {exc}") from None
    return out


def forget(row_id: int, db: SQLiteStore | None = None) -> bool:
    """Remove run *row_id* from the history; whether it was there."""
    db = db if db is not None else store()
    with db.transaction() as conn:
        return conn.execute("DELETE FROM history WHERE id = ?", (row_id,)).rowcount > 0


def frame(items: Iterable[Entry]) -> pd.DataFrame:
    """The entries as a DataFrame, one row each: ``kind``, ``name``, ``started``, ``status``,
    ``by``, then one column per kind consumed (``consumed.<kind>``), by ``id``."""
    import pandas as pd

    rows = []
    for entry in items:
        row: dict[str, Any] = {"id": entry.id, "kind": entry.kind, "name": entry.name,
                               "started": pd.Timestamp(entry.started, unit="s", tz="UTC"),
                               "status": entry.status, "by": entry.by}
        row.update({f"consumed.{k}": v for k, v in entry.consumed.items()})
        rows.append(row)
    columns = ["id", "kind", "name", "started", "status", "by"]
    table = pd.DataFrame(rows, columns=columns + sorted(
        {c for row in rows for c in row} - set(columns)))
    return table.set_index("id")


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _totals_trace(name: str, limits: dict[str, float], consumed: dict[str, float],
                  outcome: dict[str, Any]) -> Trace:
    """A trace that knows only a run's totals: what it replays from."""
    data = Trace(name=name, limits=limits).to_json()  # no events, the format of a saved trace
    data["stats"] = {"checks": {}, "consumptions": {}, "consumed": dict(consumed),
                     "refusals": {}}
    data["outcome"] = {k: v for k, v in outcome.items() if v is not None}
    return Trace.from_json(data)


def suggest_limits(traces_given: Iterable[Trace] | None = None, *, margin: float = 0.2,
                   quantile: float = 0.95) -> Suggestion:
    """Limits from a history of runs (`nbbudget.suggest_limits`; ``%budget history
    --suggest``): `nbbudget.core.suggest.suggest` of *traces_given*, passed on as given, or of
    the traces of the store's history when None."""
    return suggest(traces() if traces_given is None else traces_given, margin=margin,
                   quantile=quantile)

