"""What goes on in the background, as it is listed and cancelled from outside the code that
started it: the store's job records (calls and cells that outlived their caller's budget, in
any kernel that shares the store) and the notebook runs of ``nbbudget run``, as plain rows; and
the cancel of each, with what became of it.

``nbbudget jobs`` and ``nbbudget cancel`` (`nbbudget.cli.run`), ``%budget cancel``
(`nbbudget.jupyter.magics`) and the REST endpoints of the Jupyter server extension
(`nbbudget.jupyter.server`) list and cancel through here, so each says the same thing.

A cancel ends in one of four `Cancel.outcome` values:

- ``ended``: the job or run had already ended; nothing was changed.
- ``stopped``: it stopped for the cancel (a job at its next bytecode or budget check, a
  notebook run's running cell interrupted by its runner).
- ``finished``: it ended anyway before the cancel reached it (the cancel was not honoured); its
  result or error is kept.
- ``requested``: the cancel is asked and it has not stopped yet: a job stops at its next budget
  check or finishes anyway; a run's runner stops it at once, or it finishes.

Who carries a cancel: a notebook run's runner process reads it from the run's row
(`Runs.request_cancel`); a job is cancelled in the process that runs it (`cancel_here`, which
the kernel runs when the server asks it; its work on a cluster is cancelled from there).
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from .jobs import Job, JobState
from .run_store import RunRecord, Runs
from .runner import jobs as _jobs
from .store import SQLiteStore

__all__ = ["CANCEL_WAIT_S", "JOB_ID", "JOB_WAIT_S", "RUN_ID", "Cancel", "await_end",
           "cancel_here", "cancel_job", "cancel_run", "check_id", "find", "job_ended", "rows",
           "run_cancelled", "run_ended", "run_row"]

#: a job's id (``nb.jobs[id]``: its process's pid in hex, a dash, a count), and a notebook
#: run's; the server extension refuses an id that is neither (`check_id`)
JOB_ID = re.compile(r"[0-9a-f]{1,16}-[0-9]{1,12}")
RUN_ID = re.compile(r"run-[0-9a-f]{8}")
#: how long a cancel waits for a notebook run to stop (its runner interrupts the running cell):
#: ``nbbudget cancel``, Ctrl-C on ``nbbudget run`` and the server extension's cancel
CANCEL_WAIT_S = 15.0
_POLL_S = 0.05
#: how long a cancel of a job waits to see whether it stops at a budget check (``%budget
#: cancel`` and the server's cancel, which the kernel answers)
JOB_WAIT_S = 0.5


@dataclass(frozen=True)
class Cancel:
    """What a cancel did: the *outcome* (``ended``, ``stopped``, ``finished``, ``requested``;
    the module's docstring says what each means), the *state* of the job or run after it, and
    one sentence for a person (*message*). Used by ``nbbudget cancel``, ``%budget cancel`` and
    the server extension, which answers it as JSON (`to_dict`)."""

    id: str
    kind: str  # "job" or "run"
    outcome: str
    state: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """The cancel as a JSON object (what ``POST /nbbudget/jobs/ID/cancel`` answers)."""
        return asdict(self)


def check_id(text: str) -> str | None:
    """Why *text* is not the id of a job or of a notebook run, or None when it is one. The
    server extension answers 400 with it."""
    if JOB_ID.fullmatch(text) or RUN_ID.fullmatch(text):
        return None
    shown = text if len(text) <= 40 else text[:37] + "..."
    return (f"{shown!r} is not the id of a job (such as 1a2b-3) or of a notebook run (such as "
            f"run-1a2b3c4d); GET /nbbudget/jobs lists them")


# -- rows -------------------------------------------------------------------------------------
def rows(store: SQLiteStore) -> list[dict[str, Any]]:
    """Every job record and notebook run of *store*, newest first, as the server extension
    answers them (``GET /nbbudget/jobs``). A running job whose process died, or a run whose
    runner died, is marked ``lost`` first."""
    store.mark_lost_jobs()
    found = [_job_row(record, now=time.time()) for record in store.jobs()]
    found += [_run_entry(record, now=time.time()) for record in Runs(store).all()]
    return sorted(found, key=lambda row: row["started"], reverse=True)  # ISO 8601 in UTC


def find(store: SQLiteStore, item_id: str) -> dict[str, Any] | None:
    """The row of the job or notebook run *item_id* (as `rows` gives it), or None."""
    if RUN_ID.fullmatch(item_id):
        runs = Runs(store)
        record = runs.get(item_id)
        return None if record is None else _run_entry(runs.check(record), now=time.time())
    store.mark_lost_jobs()
    found = [record for record in store.jobs() if record["id"] == item_id]
    return _job_row(found[0], now=time.time()) if found else None


def run_row(record: RunRecord) -> dict[str, Any]:
    """One notebook run as ``nbbudget jobs --json`` prints it (its time started is local; an
    ended run's ``error`` is its code, and ``message`` says why it ended)."""
    error = (record.result or {}).get("error") or {}
    return {"id": record.id, "state": record.state.value, "notebook": record.spec["notebook"],
            "output": record.output, "mode": record.spec["mode"], "cell": record.cell,
            "executed": record.executed, "cells": record.cells, "pid": record.pid,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created)),
            "delivered": record.delivered, "error": error.get("code"),
            "message": error.get("message")}


def _job_row(record: dict[str, Any], now: float) -> dict[str, Any]:
    state = JobState(record["state"])
    # a settled record was last written when its job ended; a lost one, when found lost
    ended = record["updated"] if state.final and state is not JobState.LOST else None
    return _row(record["id"], "job", state, record["label"], record["created"], ended, now,
                heartbeat=record.get("heartbeat"), pid=record["pid"],
                error=_last_line(record["error"]), output=None)


def _run_entry(record: RunRecord, now: float) -> dict[str, Any]:
    ended = record.updated if record.state.final and record.state is not JobState.LOST \
        else None
    error = (record.result or {}).get("error") or {}
    row = _row(record.id, "run", record.state, record.spec["notebook"], record.created, ended,
               now, heartbeat=None if record.state.final else record.updated, pid=record.pid,
               error=error.get("code"), output=record.output)
    row.update(mode=record.spec["mode"], cell=record.cell, executed=record.executed,
               cells=record.cells)
    return row


def _row(item_id: str, kind: str, state: JobState, name: str, created: float,
         ended: float | None, now: float, *, heartbeat: float | None, pid: int | None,
         error: str | None, output: str | None) -> dict[str, Any]:
    elapsed = None if state is JobState.LOST else (ended if ended is not None else now) - created
    return {"id": item_id, "kind": kind, "state": state.value, "name": name,
            "started": _iso(created), "ended": _iso(ended),
            "elapsed_s": None if elapsed is None else round(elapsed, 3),
            "heartbeat": _iso(heartbeat), "pid": pid, "error": error, "output": output,
            "cancellable": not state.final}


def _iso(t: float | None) -> str | None:
    """*t* (seconds since the epoch) as ISO 8601 in UTC, to the millisecond, as Jupyter's own
    REST API gives its times (``2026-12-04T09:44:23.120Z``)."""
    if t is None:
        return None
    moment = datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _last_line(text: str | None) -> str | None:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


# -- cancels ----------------------------------------------------------------------------------
def cancel_run(runs: Runs, record: RunRecord, wait_s: float = CANCEL_WAIT_S) -> Cancel:
    """Stop the notebook run *record* (``nbbudget cancel``): its runner interrupts the running
    cell; wait at most *wait_s* for it to end, and say how it ended. A run that had already
    ended is left as it is."""
    ended = run_ended(runs, record)
    if ended is not None:
        return ended
    runs.request_cancel(record.id)
    return run_cancelled(await_end(runs, record, wait_s))


def run_ended(runs: Runs, record: RunRecord) -> Cancel | None:
    """The answer to a cancel of *record* when the run has already ended (a run whose runner
    died is found ``lost`` here), else None: it can be asked to stop."""
    record = runs.check(record)
    if not record.state.final:
        return None
    return Cancel(record.id, "run", "ended", record.state.value,
                  f"run {record.id} has already ended: {record.state}")


def run_cancelled(record: RunRecord) -> Cancel:
    """What became of a cancel of the run *record*, asked and waited for: stopped, finished
    anyway, or not stopped yet. The server extension waits for it on its event loop."""
    if not record.state.final:
        return Cancel(record.id, "run", "requested", record.state.value,
                      f"run {record.id} was asked to stop and has not stopped yet "
                      f"({record.state}); nbbudget jobs shows when it does")
    outcome = "stopped" if record.state is JobState.CANCELLED else "finished"
    return Cancel(record.id, "run", outcome, record.state.value,
                  f"run {record.id} {record.state} at {record.where}; the notebook as far "
                  f"as it got is in {record.output}")


def await_end(runs: Runs, record: RunRecord, wait_s: float = CANCEL_WAIT_S) -> RunRecord:
    """Wait at most *wait_s* for the run *record*, asked to stop, to end; its record then (Ctrl-C
    on ``nbbudget run`` waits with it too)."""
    until = time.monotonic() + wait_s
    while not record.state.final and time.monotonic() < until:
        time.sleep(_POLL_S)
        record = runs.check(runs.get(record.id) or record)
    return record


def cancel_job(job: Job, reason: str, wait_s: float = JOB_WAIT_S) -> Cancel:
    """Cancel *job*, a job of this process (``%budget cancel``), and say what that did: it had
    already ended, or it stopped, or it ended anyway, or it has not stopped yet."""
    if job.done():
        return job_ended(job.id, job.state.value)
    status = job.cancel(reason, wait=wait_s)
    if status == "stopped":
        return Cancel(job.id, "job", "stopped", job.state.value,
                      f"job {job.id} stopped")
    if status == "not honoured":
        kept = "error" if job.state is JobState.FAILED else "result"
        return Cancel(job.id, "job", "finished", job.state.value,
                      f"job {job.id} ended ({job.state}) before the cancel reached it: the "
                      f"cancel was not honoured, and its {kept} is kept (nb.jobs[{job.id!r}])")
    return Cancel(job.id, "job", "requested", job.state.value,
                  f"cancel requested for job {job.id}; it has not stopped yet: it stops at its "
                  f"next bytecode once out of a call Python cannot interrupt (a sleep or a read "
                  f"on its thread, C code), or at its next budget check if it is cooperative, "
                  f"or finishes anyway (see %budget jobs)")


def job_ended(job_id: str, state: str) -> Cancel:
    """The answer to a cancel of the job *job_id*, which had already ended in *state*."""
    return Cancel(job_id, "job", "ended", state,
                  f"job {job_id} had already ended ({state}); there was nothing to cancel")


def cancel_here(job_id: str, reason: str = "cancelled from JupyterLab") -> dict[str, str]:
    """Cancel the job *job_id* of this process, as `cancel_job` does, and answer the `Cancel`
    as a dict. The server extension asks a kernel to run this (a silent request whose user
    expression calls it) to carry a cancel to the kernel that owns the job. A job this process
    does not hold (its result went out and nothing keeps it) answers ``ended`` with its
    state unknown."""
    try:
        job = _jobs[job_id]
    except KeyError:
        return Cancel(job_id, "job", "ended", "unknown",
                      f"job {job_id} is no longer held by its kernel (its result went out); "
                      f"there was nothing to cancel").to_dict()
    return cancel_job(job, reason).to_dict()
