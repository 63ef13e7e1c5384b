"""Each implementation of the store's interface, with what a test needs to reach behind its back:
read what it holds, take a checkpoint out, put it back (as a backup would be), remove them all.

The ``any_store`` fixture (conftest.py) runs a test once on each, the way anyio runs every test
on asyncio and on trio: ``sqlite`` is the store of the test's ``NBBUDGET_HOME`` (``nb.store()``,
what `nb.call` uses by default), ``memory`` a `nbbudget.testing.MemoryStore` put in force for
the calls of the test.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

from nbbudget.calls.memory_store import MemoryStore
from nbbudget.calls.store import SQLiteStore


def rows(db_path: Any) -> list[tuple[Any, ...]]:
    """Every checkpoint row of the SQLite file *db_path*, read on a connection of its own."""
    with closing(sqlite3.connect(db_path)) as db:
        return db.execute("SELECT identity, format, header, payload, tag FROM checkpoints "
                          "ORDER BY identity").fetchall()


def execute(db_path: Any, sql: str, *params: Any) -> None:
    """Run *sql* on the SQLite file *db_path*, committed, on a connection of its own."""
    with closing(sqlite3.connect(db_path)) as db, db:
        db.execute(sql, params)


class SQLiteHeld:
    """The SQLite store, reached through connections of the test's own."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def rows(self) -> list[Any]:
        """Every checkpoint held, as it is held."""
        return rows(self.store.path)

    def row(self, identity: str) -> Any:
        """The checkpoint of *identity* as `rows` lists it (a copy, kept as a backup)."""
        (found,) = [r for r in self.rows() if r[0] == identity]
        return found

    def put_back(self, row: Any) -> None:
        """Put *row* (from `row`) back in place of its work's checkpoint."""
        execute(self.store.path, "INSERT OR REPLACE INTO checkpoints "
                "(identity, format, header, payload, tag) VALUES (?, ?, ?, ?, ?)", *row)

    def remove_all(self) -> None:
        execute(self.store.path, "DELETE FROM checkpoints")

    def close_thread(self) -> None:
        """A thread that used the store is done with it: its connection is closed."""
        self.store.close()


class MemoryHeld:
    """The memory store, whose ``checkpoints`` are there to read and change."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def rows(self) -> list[Any]:
        return sorted(self.store.checkpoints.items(), key=lambda item: item[0])

    def row(self, identity: str) -> Any:
        return identity, self.store.checkpoints[identity]

    def put_back(self, row: Any) -> None:
        identity, held = row
        self.store.checkpoints[identity] = held

    def remove_all(self) -> None:
        self.store.checkpoints.clear()

    def close_thread(self) -> None:
        """Nothing is held per thread."""
