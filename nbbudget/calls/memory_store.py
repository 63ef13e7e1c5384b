"""A `Store` in this process's memory: the second implementation of the store's interface, for
tests and for programs that want no file at all (``nbbudget.testing.MemoryStore``).

It keeps the rules of the SQLite store: each checkpoint of a work is numbered one past the last
one saved for it, deleted or not; an older checkpoint put back, or one saved and gone, is
refused and left as it was (S4-5); the state is pickled when it is saved and the ledger state
kept as JSON, so the work may go on changing its objects and a resume gets them as they were;
a quota of starts is counted exactly under any number of threads, and counts older than
`KEEP_RUN_DAYS` days are dropped (S4-12).

What it does not do: outlive its process, or share anything with another one. Nothing is
signed, since nothing leaves the process; and no job record is ever ``lost``, since every
record is of a job of this process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import threading
import time
from typing import Any

from .store import Checkpoint, oldest_kept_day, refuse_unless_last

__all__ = ["MemoryStore"]


class MemoryStore:
    """Checkpoints, runs per day and job records in memory, under one lock.

    ``checkpoints`` holds, by work identity, what a save kept: the checkpoint (its state left
    out) and the state pickled. A test may take one out and put it back later, as a backup of
    the SQLite store would be put back: it is refused, as there.
    """

    location = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.checkpoints: dict[str, tuple[Checkpoint, bytes]] = {}
        self._last: dict[str, tuple[int, bool]] = {}  # a work's last number, and whether live
        self._runs: dict[tuple[str, str], int] = {}
        self._jobs: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore: {len(self.checkpoints)} checkpoints, {len(self._jobs)} jobs>"

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, identity: str, state: Any, *, ledger: dict[str, Any],
                        first_start: float, label: str) -> Checkpoint:
        """Keep *state* for *identity* in place of its previous checkpoint, numbered one past
        the last number saved for it."""
        payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            last = self._last.get(identity)
            seq = last[0] + 1 if last is not None else 1
            saved = Checkpoint(identity, seq, None, json.loads(json.dumps(ledger)), first_start,
                               time.time(), label)
            self.checkpoints[identity] = (saved, payload)
            self._last[identity] = (seq, True)
        return dataclasses.replace(saved, state=state, ledger=ledger)

    def load_checkpoint(self, identity: str) -> Checkpoint | None:
        """The last checkpoint saved for *identity*, `None` when there is none; raises
        `CheckpointRefused` (and changes nothing) for one that is not the last saved, or when
        that one is gone."""
        with self._lock:
            held = self.checkpoints.get(identity)
            last = self._last.get(identity)
        refuse_unless_last(identity, self.location, held[0].seq if held else None, last)
        if held is None:
            return None
        saved, payload = held  # the ledger goes out as a copy, as the SQLite store reads it
        state = pickle.loads(payload)  # noqa: S301  (what this store pickled, in this process)
        return dataclasses.replace(saved, state=state, ledger=json.loads(json.dumps(saved.ledger)))

    def delete_checkpoint(self, identity: str) -> bool:
        """Remove the checkpoint of *identity*; whether there was one. Its number is kept, so
        that checkpoint put back later is refused."""
        with self._lock:
            last = self._last.get(identity)
            if last is not None:
                self._last[identity] = (last[0], False)
            return self.checkpoints.pop(identity, None) is not None

    # -- runs per day (S4-12) -----------------------------------------------------------------
    def take_run(self, identity: str, day: str, quota: int) -> int | None:
        """Count one start of *identity* on *day* (``YYYY-MM-DD``, UTC) if fewer than *quota*
        have started that day: the number of this start, or `None` when the quota is spent."""
        with self._lock:
            count = self._runs.get((identity, day), 0)
            if count >= quota:
                return None
            self._runs[identity, day] = count + 1
            oldest = oldest_kept_day(day)
            for old in [k for k in self._runs if k[1] < oldest]:
                del self._runs[old]
            return count + 1

    def runs_on(self, identity: str, day: str) -> int:
        """How many times *identity* started on *day* (UTC)."""
        with self._lock:
            return self._runs.get((identity, day), 0)

    # -- job records --------------------------------------------------------------------------
    def record_job(self, job_id: str, identity: str, label: str, state: str,
                   error: str | None = None, *, created: float | None = None,
                   ended: float | None = None) -> None:
        """Insert or update the record of a job of this process, with the job's own times (its
        end kept as ``updated``)."""
        now = time.time()
        created = now if created is None else created
        updated = now if ended is None else ended
        with self._lock:
            held = self._jobs.get(job_id)
            if held is None:
                self._jobs[job_id] = {"id": job_id, "identity": identity, "label": label,
                                      "state": state, "pid": os.getpid(), "created": created,
                                      "updated": updated, "error": error}
            else:
                held.update(state=state, updated=updated, error=error)

    def jobs(self) -> list[dict[str, Any]]:
        """Every job record, newest first (copies: changing one changes nothing here)."""
        with self._lock:
            rows = [dict(row) for row in self._jobs.values()]
        return sorted(rows, key=lambda row: row["created"], reverse=True)

    def mark_lost_jobs(self) -> int:
        """None is lost: every record is of a job of this process, which is alive."""
        return 0
