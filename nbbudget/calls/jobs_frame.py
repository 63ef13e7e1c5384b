"""pandas views of background jobs: `nb.jobs.to_frame()` for programs, ``%budget jobs`` for a
person; pandas is imported only here, when a frame is asked for."""

from __future__ import annotations

import html
import os
import time
from typing import Any

try:
    import pandas as pd
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "nbbudget's DataFrames need pandas; install it with: pip install 'nbbudget[frames]'"
    ) from exc

from ..core.duration import spoken
from ..core.errors import ConfigError

__all__ = ["JobsTable", "jobs_frame", "jobs_table"]

_JOB_COLUMNS = ["id", "label", "state", "cancel", "pid", "created", "ended", "error", "output",
                "heartbeat"]


def _job_rows(jobs: Any, *, elsewhere: bool = True) -> list[dict[str, Any]]:
    """The jobs of this process, then (unless not *elsewhere*) the records of jobs elsewhere (a
    cluster's published jobs, then the store's records of other processes), as plain rows
    (times in seconds since the epoch)."""
    rows = [{"id": j.id, "label": j.label, "state": j.state.value, "cancel": j.cancel_status,
             "pid": os.getpid(), "created": j.created, "ended": j.ended,
             "error": _last_line(j.traceback), "output": j.output_text,
             "heartbeat": j.last_heartbeat}
            for j in jobs]
    seen = {r["id"] for r in rows}
    for rec in jobs.all_records() if elsewhere else ():
        if rec["id"] not in seen:
            # a settled record was last written when its job ended; a lost one, when found lost
            ended = rec["updated"] if rec["state"] in ("done", "failed", "cancelled") else None
            rows.append({"id": rec["id"], "label": rec["label"], "state": rec["state"],
                         "cancel": None, "pid": rec["pid"], "created": rec["created"],
                         "ended": ended, "error": _last_line(rec["error"]), "output": None,
                         "heartbeat": rec.get("heartbeat")})
    return rows


def jobs_frame(jobs: Any) -> pd.DataFrame:
    """The jobs of this process, then the store's records of other processes (``lost`` among
    them), one row each, with ``created``, ``ended`` and ``heartbeat`` as datetimes (UTC).
    ``cancel`` is what became of a cancel (``requested``, ``stopped``, ``not honoured``), known
    for this process's jobs; ``heartbeat`` is when a job on a cluster last said it is alive
    (a running one whose heartbeat is old has lost its worker)."""
    frame = pd.DataFrame(_job_rows(jobs), columns=_JOB_COLUMNS)
    for col in ("created", "ended", "heartbeat"):
        frame[col] = pd.to_datetime(frame[col], unit="s", utc=True)
    return frame.set_index("id")


NO_JOBS = "no background jobs in this kernel or its store"
NO_JOBS_HERE = "no background jobs in this kernel"
_TABLE_COLUMNS = ["id", "label", "state", "cancel", "started", "took", "kernel", "error",
                  "output"]


class JobsTable:
    """What ``%budget jobs`` shows a person: one row per job, with the time it started (local,
    short), how long it took (or has run so far), which kernel runs it, the last line of its
    error and of its output, and blanks where there is nothing to say; a sentence when there is
    no job. ``frame`` holds the same text as a DataFrame indexed by job id; programs read
    ``nb.jobs.to_frame()``, whose times are datetimes. ``note``, when the store's records could
    not be read, says why, under the kernel's own jobs."""

    def __init__(self, frame: pd.DataFrame, note: str | None = None) -> None:
        self.frame = frame
        self.note = note

    def __repr__(self) -> str:
        if self.frame.empty:
            return NO_JOBS if self.note is None else f"{NO_JOBS_HERE}\n{self.note}"
        table = self.frame.reset_index()
        cells = [list(table.columns), *table.values.tolist()]
        widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                 for row in cells]
        return "\n".join(lines if self.note is None else [*lines, self.note])

    def _repr_html_(self) -> str:
        note = "" if self.note is None else f"<p>{html.escape(self.note)}</p>"
        if self.frame.empty:
            return f"<p>{NO_JOBS if self.note is None else NO_JOBS_HERE}</p>{note}"
        return str(self.frame.reset_index().to_html(index=False)) + note


def jobs_table(jobs: Any) -> JobsTable:
    """The jobs of `jobs_frame`, for a person to read (``%budget jobs``). When the store's
    records cannot be read (a store damaged, busy, or read-only with none in its folder), the
    kernel's own jobs are listed all the same, with a note that says why the others are not."""
    now = time.time()
    try:
        found, note = _job_rows(jobs), None
    except ConfigError as exc:
        found, note = _job_rows(jobs, elsewhere=False), f"(the store's jobs are not listed: {exc})"
    rows = [_readable(row, now) for row in found]
    return JobsTable(pd.DataFrame(rows, columns=_TABLE_COLUMNS, dtype=str).set_index("id"), note)


def _readable(row: dict[str, Any], now: float) -> dict[str, str]:
    ended = row["ended"]
    took = spoken(((ended if ended is not None else now) - row["created"]) * 1000)
    if ended is None:
        took = f"{took} so far" if row["state"] == "running" else ""
    return {"id": row["id"], "label": _clip(row["label"], 50), "state": row["state"],
            "cancel": row["cancel"] or "", "started": _clock_time(row["created"], now),
            "took": took, "kernel": "this" if row["pid"] == os.getpid() else f"pid {row['pid']}",
            "error": _clip(row["error"], 60), "output": _clip(_last_line(row["output"]), 40)}


def _clock_time(t: float, now: float) -> str:
    """A local time: ``14:02:31`` today, ``Nov 30 08:13`` another day."""
    same_day = time.localtime(t)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M:%S" if same_day else "%b %d %H:%M", time.localtime(t))


def _clip(text: str | None, width: int) -> str:
    """*text* on at most *width* characters (blank for None)."""
    if not text:
        return ""
    return text if len(text) <= width else text[: width - 3] + "..."


def _last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None
