"""The records of ``nbbudget run``: one row per notebook run, in the store's database.

The command that starts a run and the runner process that executes it talk through this row:
the command claims the work (one write transaction, so two identical commands never start it
twice), tells the runner how long its caller waits and whether to stop, and delivers the result
once; the runner reports its progress, its pauses and its end. Every write is a ``BEGIN
IMMEDIATE`` transaction of the store.

A run's state is a `JobState`, in the words of ``nb.jobs``: ``starting``, ``running`` or
``paused`` while it lives, then ``done``, ``failed``, ``cancelled`` (``nbbudget cancel`` or its
``--timeout``; its ``result`` tells which) or ``lost`` (its runner died without a word). Once a
command has delivered the end of a run, the next identical command starts the work anew
(S0-11). A paused run nobody continues within its idle time (``--idle-timeout``) is ended by
its runner: ``cancelled``, with the error ``idle_timeout``.

Text that names a cell counts from 1 in the executed notebook (``cell 2 of 6``, `cell_named`);
the ``cell`` of a row, like ``cell_index`` in JSON, counts from 0.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .jobs import JobState
from .store import SQLiteStore

__all__ = ["Claim", "RunRecord", "Runs", "cell_named", "runner_alive"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS notebook_runs (
        id          TEXT PRIMARY KEY,
        identity    TEXT NOT NULL,
        spec        TEXT NOT NULL,
        state       TEXT NOT NULL,
        pid         INTEGER,
        created     REAL NOT NULL,
        updated     REAL NOT NULL,
        cell        INTEGER,
        executed    INTEGER NOT NULL DEFAULT 0,
        cells       INTEGER,
        source      TEXT,
        deadline    REAL,
        timeout_ms  INTEGER,
        turn        INTEGER NOT NULL DEFAULT 1,
        paused_turn INTEGER NOT NULL DEFAULT 0,
        cancel      INTEGER NOT NULL DEFAULT 0,
        result      TEXT,
        delivered   INTEGER NOT NULL DEFAULT 0,
        warnings    TEXT,
        notebook_cells INTEGER,
        idle_ms     INTEGER,
        cancel_by   TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS notebook_runs_work ON notebook_runs (identity, delivered)",
)
#: the columns a table of an earlier version lacks, added as it opens: the runner's warnings,
#: the number of cells of the executed notebook (for ``cell 2 of 6``), how long a paused run
#: waits for its caller, and who asked a run to stop
_ADDED = (("warnings", "TEXT"), ("notebook_cells", "INTEGER"), ("idle_ms", "INTEGER"),
          ("cancel_by", "TEXT"))
#: a table from before ``warnings`` names a run stopped by ``nbbudget cancel`` ``stopped``: in
#: the words of ``nb.jobs``, it is ``cancelled``
_RENAME_STOPPED = "UPDATE notebook_runs SET state = 'cancelled' WHERE state = 'stopped'"
_LIVE = "('starting', 'running', 'paused')"  # the states of a run that has not ended
_KEEP_DAYS = 7  # delivered runs are forgotten after a week
_SPAWN_GRACE_S = 60.0  # a run claimed this long ago whose runner never started is lost
#: the module ``nbbudget run`` starts its runner process as (``python -m``, `nbbudget.cli.run`),
#: and that this module looks for in a process's command line to tell whether a run's runner lives
RUNNER_MODULE = "nbbudget.cli.runner"


@dataclass(frozen=True)
class RunRecord:
    """One row: what to run (``spec``), where it is, how it ended (``result``), and what the
    runner found to warn about in the notebook (``warnings``)."""

    id: str
    identity: str
    spec: dict[str, Any]
    state: JobState
    pid: int | None
    created: float
    updated: float
    cell: int | None
    executed: int
    cells: int | None
    source: str | None
    deadline: float | None
    timeout_ms: int | None
    turn: int
    paused_turn: int
    cancel: bool
    result: dict[str, Any] | None
    delivered: bool
    warnings: list[str]
    notebook_cells: int | None  # the cells of the executed notebook, every type, once read
    idle_ms: int | None  # how long a paused run waits for the identical command (None: ever)
    cancel_by: str | None  # who asked the run to stop: "nbbudget cancel", "Ctrl-C"

    @classmethod
    def from_row(cls, values: dict[str, Any]) -> RunRecord:
        values["spec"] = json.loads(values["spec"])
        values["state"] = JobState(values["state"])
        values["result"] = json.loads(values["result"]) if values["result"] else None
        values["cancel"] = bool(values["cancel"])
        values["delivered"] = bool(values["delivered"])
        values["warnings"] = json.loads(values["warnings"]) if values["warnings"] else []
        return cls(**values)

    @property
    def output(self) -> str:
        return str(self.spec["output"])

    def dead(self, now: float) -> bool:
        """Whether the run is unfinished but nothing executes it any more."""
        if self.state.final:
            return False
        if self.pid is None:
            return now - self.created > _SPAWN_GRACE_S
        return not runner_alive(self.pid)

    @property
    def where(self) -> str:
        """The cell the run is at (running, next, or where it ended), as text names it:
        ``cell 2 of 6``; ``its first cell`` before the runner has read the notebook."""
        if self.cell is None:
            return "its first cell"
        return cell_named(self.cell, self.notebook_cells)

    def lost_result(self) -> dict[str, Any]:
        return {"exit_code": 1, "state": JobState.LOST.value, "data": {},
                "error": {"code": "lost", "message": (
                    f"run {self.id} was lost: its runner (pid {self.pid}) ended without "
                    f"finishing, at {self.where}; the notebook as far as it got is in "
                    f"{self.output}; run the identical command again to start anew")}}


def cell_named(index: int, total: int | None) -> str:
    """The cell *index* (counted from 0 in the executed notebook, as ``cell_index`` counts) as
    every text names it, counted from 1: ``cell 3 of 7`` (``cell 3`` when *total* is not known).
    The runner's errors, ``nbbudget run``'s progress line and summary, ``nbbudget jobs`` and
    the cancels of `nbbudget.calls.background` use it."""
    return f"cell {index + 1}" if total is None else f"cell {index + 1} of {total}"


@dataclass(frozen=True)
class Claim:
    """What a command got when it claimed its work: the run, whether this command started it,
    and the turn it waits for (a continuation of a paused run is a new turn)."""

    record: RunRecord
    new: bool
    turn: int


class Runs:
    """The notebook runs of one store."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.logs = store.folder / "runs"
        self._absent = False  # a read-only store without the table: no run was ever made
        if store.read_only:  # read as it is: the table is not made or brought up to date
            with store.read_transaction() as db:
                self._absent = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                          "AND name = 'notebook_runs'").fetchone() is None
            return
        with store.transaction() as db:
            for statement in _SCHEMA:
                db.execute(statement)
            columns = {row[1] for row in db.execute("PRAGMA table_info(notebook_runs)")}
            if "warnings" not in columns:
                db.execute(_RENAME_STOPPED)
            for name, kind in _ADDED:
                if name not in columns:
                    db.execute(f"ALTER TABLE notebook_runs ADD COLUMN {name} {kind}")

    def _select(self, where: str, params: tuple[Any, ...],
                db: sqlite3.Connection | None = None) -> list[RunRecord]:
        """The runs *where* says, read in the transaction of *db*, else in one of their own. A
        column the table lacks (that of a read-only store, made by an earlier release) is
        None."""
        if self._absent:
            return []
        if db is None:
            with self.store.read_transaction() as db:
                return self._select(where, params, db)
        cursor = db.execute(f"SELECT * FROM notebook_runs WHERE {where}", params)
        names = [d[0] for d in cursor.description]
        return [RunRecord.from_row({**_BLANK, **dict(zip(names, row, strict=True))})
                for row in cursor.fetchall()]

    def get(self, run_id: str) -> RunRecord | None:
        found = self._select("id = ?", (run_id,))
        return found[0] if found else None

    def all(self) -> list[RunRecord]:
        """Every run, newest first; unfinished runs whose runner died are marked ``lost`` (on a
        read-only store, shown so: the next command that can write marks them)."""
        if self.store.read_only:
            return [self.check(record) for record in self._select("1 ORDER BY created DESC", ())]
        for record in self._select(f"state IN {_LIVE}", ()):
            self.check(record)
        return self._select("1 ORDER BY created DESC", ())

    def claim(self, identity: str, spec: dict[str, Any], deadline: float | None,
              timeout_ms: int | None, idle_ms: int | None = None) -> Claim:
        """The undelivered run of *identity*, or a new one (in one write transaction, so two
        identical commands never start the same work twice). A paused run gets a new turn
        with this caller's *deadline*; a run still starting whose caller's budget has run out
        (that caller has answered ``starting``) takes this caller's; any other caller that joins
        a turn may not wait longer than the turn's. Every caller sets the wall-clock limit and
        the idle time (*idle_ms*: how long the run may wait paused; None, for ever) in force."""
        now = time.time()
        with self.store.transaction() as db:
            found = self._select("identity = ? AND delivered = 0 ORDER BY created DESC LIMIT 1",
                                 (identity,), db)
            record = found[0] if found else None
            if record is not None and record.dead(now):
                self._end(db, record.id, JobState.LOST, record.lost_result())
            if record is None:
                run_id = f"run-{secrets.token_hex(4)}"
                db.execute("INSERT INTO notebook_runs (id, identity, spec, state, created, "
                           "updated, deadline, timeout_ms, idle_ms) VALUES (?, ?, ?, ?, ?, ?, "
                           "?, ?, ?)",
                           (run_id, identity, json.dumps(spec), JobState.STARTING.value, now,
                            now, deadline, timeout_ms, idle_ms))
                self._forget_old(db, now)
                new, turn = True, 1
            else:
                run_id, new, turn = record.id, False, record.turn
                if record.state is JobState.PAUSED:
                    turn += 1
                    db.execute("UPDATE notebook_runs SET turn = ?, deadline = ? WHERE id = ?",
                               (turn, deadline, run_id))
                elif record.state is JobState.STARTING and record.deadline is not None and \
                        record.deadline <= now:
                    db.execute("UPDATE notebook_runs SET deadline = ? WHERE id = ?",
                               (deadline, run_id))
                elif deadline is not None:
                    db.execute("UPDATE notebook_runs SET deadline = MIN(deadline, ?) WHERE "
                               "id = ? AND deadline IS NOT NULL", (deadline, run_id))
                db.execute("UPDATE notebook_runs SET timeout_ms = ?, idle_ms = ? WHERE id = ?",
                           (timeout_ms, idle_ms, run_id))
            claimed = self._select("id = ?", (run_id,), db)[0]
        return Claim(claimed, new, turn)

    def _forget_old(self, db: sqlite3.Connection, now: float) -> None:
        """Runs delivered more than `_KEEP_DAYS` ago go, with their logs."""
        old = [run_id for (run_id,) in db.execute(
            "SELECT id FROM notebook_runs WHERE delivered = 1 AND updated < ?",
            (now - _KEEP_DAYS * 86400,))]
        for run_id in old:
            db.execute("DELETE FROM notebook_runs WHERE id = ?", (run_id,))
            (self.logs / f"{run_id}.log").unlink(missing_ok=True)

    def check(self, record: RunRecord) -> RunRecord:
        """*record* as it is now; ``lost`` if it was unfinished and its runner has died."""
        if not record.dead(time.time()):
            return record
        if self.store.read_only:
            return replace(record, state=JobState.LOST, result=record.lost_result())
        with self.store.transaction() as db:
            fresh = self._select("id = ?", (record.id,), db)[0]
            if fresh.dead(time.time()):
                self._end(db, record.id, JobState.LOST, fresh.lost_result())
        return self.get(record.id) or record

    # -- written by the runner --------------------------------------------------------------
    def update(self, run_id: str, **fields: Any) -> None:
        """Set *fields* of an unfinished run (the runner's progress)."""
        names = ", ".join(f"{name} = ?" for name in fields)
        with self.store.transaction() as db:
            db.execute(f"UPDATE notebook_runs SET {names}, updated = ? WHERE id = ? AND state "
                       f"IN {_LIVE}",
                       (*fields.values(), time.time(), run_id))

    def finish(self, run_id: str, state: JobState, result: dict[str, Any]) -> None:
        """Record how the run ended (unless it has already ended)."""
        with self.store.transaction() as db:
            self._end(db, run_id, state, result)

    def finish_paused(self, run_id: str, turn: int, state: JobState,
                      result: dict[str, Any]) -> bool:
        """Record how a run paused in *turn* ended, unless a command has given it a new turn
        meanwhile (or it has already ended): whether it ended here. The runner ends a run so
        when its idle time runs out."""
        with self.store.transaction() as db:
            return self._end(db, run_id, state, result, turn=turn)

    def _end(self, db: sqlite3.Connection, run_id: str, state: JobState,
             result: dict[str, Any], turn: int | None = None) -> bool:
        same_turn = ("", ()) if turn is None else (" AND turn = ?", (turn,))
        cursor = db.execute(
            f"UPDATE notebook_runs SET state = ?, result = ?, executed = COALESCE(?, executed), "
            f"updated = ? WHERE id = ? AND state IN {_LIVE}{same_turn[0]}",
            (state.value, json.dumps(result), result["data"].get("executed"), time.time(),
             run_id, *same_turn[1]))
        return cursor.rowcount > 0

    # -- written by commands ------------------------------------------------------------------
    def deliver(self, run_id: str) -> None:
        """The end of the run has been told: the next identical command starts anew."""
        with self.store.transaction() as db:
            db.execute("UPDATE notebook_runs SET delivered = 1 WHERE id = ?", (run_id,))

    def request_cancel(self, run_id: str, by: str = "nbbudget cancel") -> None:
        """Ask the runner to stop the run (it interrupts the running cell); *by* names who
        asked, as the run's error says it (``Ctrl-C`` from ``nbbudget run``)."""
        with self.store.transaction() as db:
            db.execute("UPDATE notebook_runs SET cancel = 1, cancel_by = COALESCE(cancel_by, ?) "
                       "WHERE id = ?", (by, run_id))

    def log_path(self, run_id: str) -> Path:
        """Where the runner of *run_id* writes its log (and its kernel's)."""
        self.logs.mkdir(mode=0o700, exist_ok=True)
        return self.logs / f"{run_id}.log"


#: a row with every field None, under the columns read: what a table without a column gives
_BLANK: dict[str, Any] = {f.name: None for f in fields(RunRecord)}


def runner_alive(pid: int) -> bool:
    """Whether *pid* is a live runner of notebook runs: a process that exists, is no zombie
    and (where ``/proc`` tells) runs `nbbudget.cli.runner`, so a reused pid is not mistaken."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: not our runner
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return True  # no /proc here: the process exists, trust it
    state = stat.rpartition(")")[2].split()[0]
    return state != "Z" and RUNNER_MODULE.encode() in cmdline
