"""pandas views of runs and traces; pandas is imported only here, when a frame is asked for."""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

try:
    import numpy as np
    import pandas as pd
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "nbbudget's DataFrames need pandas; install it with: pip install 'nbbudget[frames]'"
    ) from exc

from ._duration import spoken
from ._kinds import KIND_INDEX, KINDS

if TYPE_CHECKING:
    from ._snapshot import Snapshot

__all__ = ["JobsTable", "jobs_frame", "jobs_table", "plot_trace", "trace_frame",
           "usage_frame"]


def usage_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per armed axis, indexed by kind: limit, consumed, remaining, fraction. Counts
    and milliseconds are whole numbers and dollars are not: beside a cost row the first three
    columns hold both (dtype ``object``), so that ``10`` steps never reads ``10.0``."""
    rows = [(a.kind, *(_amount(a.kind, x) for x in (a.limit, a.consumed, a.remaining)),
             a.fraction) for a in snap.axes]
    columns = ["kind", "limit", "consumed", "remaining", "fraction"]
    mixed = len({KINDS[KIND_INDEX[a.kind]].integral for a in snap.axes}) > 1
    frame = pd.DataFrame(rows, columns=columns, dtype=object if mixed else None)
    return frame.astype({"fraction": float}).set_index("kind")


def _amount(kind: str, value: float) -> float:
    """*value* as a number of *kind*: whole for counts and milliseconds, dollars as they are."""
    if KINDS[KIND_INDEX[kind]].integral and float(value).is_integer():
        return int(value)
    return value


def trace_frame(packed_rows: array[float], payloads: Sequence[dict[str, Any]],
                run_names: Sequence[str], event_kinds: Sequence[str]) -> pd.DataFrame:
    """The events of a trace, built column-wise from its rows (four doubles each: time, amount,
    payload reference, kind and run), its payloads, its run names and its event kinds by
    code (fast for millions of rows)."""
    n = len(packed_rows) // 4
    rows = np.frombuffer(packed_rows, dtype=np.float64).reshape(n, 4)
    packed = rows[:, 3].astype(np.int64)
    codes = packed % 256
    runs = packed // 256
    refs = rows[:, 2].astype(np.int64)
    charge = codes == 0
    kind_codes = np.full(n, -1, dtype=np.int16)
    bare = charge & (refs < 0)
    kind_codes[bare] = -1 - refs[bare]
    payload = np.full(n, None, dtype=object)
    names = [k.name for k in KINDS]
    for i in np.flatnonzero(~bare):
        p = payloads[refs[i]]
        if charge[i]:
            kind_codes[i] = names.index(p["budget_kind"])
        else:
            payload[i] = p
            if "budget_kind" in p and p["budget_kind"] in names:
                kind_codes[i] = names.index(p["budget_kind"])
    names_of_runs = _unique(list(run_names))
    return pd.DataFrame({
        "t_ms": rows[:, 0],
        "kind": pd.Categorical.from_codes(codes.astype(np.int16), categories=list(event_kinds)),
        "run": pd.Categorical.from_codes(runs.astype(np.int32), categories=names_of_runs),
        "budget_kind": pd.Categorical.from_codes(kind_codes, categories=names),
        "amount": rows[:, 1],
        "payload": payload,
    })


def _unique(names: list[str]) -> list[str]:
    # run names may repeat (two grants with one name); keep categories unique by suffixing
    seen: dict[str, int] = {}
    out = []
    for name in names:
        k = seen.get(name, 0)
        seen[name] = k + 1
        out.append(name if k == 0 else f"{name}#{k}")
    return out


def plot_trace(frame: pd.DataFrame, limits: Mapping[str, float], notices: Sequence[float],
               ax: Any = None) -> Any:
    """Consumption over time of each limited axis, as a fraction of its limit (1.0 is the
    limit), with the notice thresholds, the approach notices, refusals and cuts marked.

    Charges are drawn from a full trace (``trace="full"``); time (``run_ms``) is drawn from the
    clock, so it shows in a counts trace too. Axes without a limit are left out.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
    end = float(frame["t_ms"].max()) if len(frame) else 0.0
    charges = frame[frame["kind"] == "consumed"]
    for kind, rows in charges.groupby("budget_kind", observed=True):
        limit = limits.get(str(kind))
        if not limit:
            continue
        t = [0.0, *rows["t_ms"], end]
        used = [0.0, *(rows["amount"].cumsum() / limit)]
        ax.step(t, [*used, used[-1]], where="post", label=f"{kind} (limit {limit:g})")
    run_ms = limits.get("run_ms")
    if run_ms and end:
        ax.plot([0.0, end], [0.0, end / run_ms], label=f"run_ms (limit {run_ms:g})")
    ax.axhline(1.0, color="black", linewidth=0.8)
    for fraction in notices:
        ax.axhline(fraction, color="orange", linewidth=0.8, linestyle=":")
    _mark_events(ax, frame)
    ax.set_xlabel("t (ms)")
    ax.set_ylabel("consumed / limit")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one legend entry per label
    ax.legend(unique.values(), unique.keys(), loc="best", fontsize="small")
    return ax


def _mark_events(ax: Any, frame: pd.DataFrame) -> None:
    """The approach notices, refusals, cuts and stopping outcomes of *frame*, on *ax*."""
    _marks(ax, frame[frame["kind"] == "approach_notice"],
           lambda p: p.get("threshold", 1.0), marker="^", color="orange",
           label="approach notice")
    _marks(ax, frame[frame["kind"] == "dispatch_refused_budget_exceeded"],
           lambda p: 1.0, marker="x", color="red", label="refused")
    stops = frame[frame["kind"].isin(["cut", "watchdog_cut", "cancel_requested", "cancelled"])]
    for t_ms, payload in zip(stops["t_ms"], stops["payload"], strict=True):
        by = (payload or {}).get("by") or "stop"
        ax.axvline(t_ms, color="red", linestyle="--", linewidth=1, label=f"cut ({by})")
    ended = frame[frame["kind"] == "outcome"]
    for t_ms, payload in zip(ended["t_ms"], ended["payload"], strict=True):
        if payload and payload.get("status") in ("failed", "stopped", "cancelled"):
            what = payload.get("by") or payload.get("cause") or payload["status"]
            ax.axvline(t_ms, color="red", linestyle="--", linewidth=1,
                       label=f"{payload['status']} ({what})")


def _marks(ax: Any, rows: pd.DataFrame, height: Any, **style: Any) -> None:
    if len(rows):
        ax.scatter(rows["t_ms"], [height(p or {}) for p in rows["payload"]], zorder=3, **style)


_JOB_COLUMNS = ["id", "label", "state", "cancel", "pid", "created", "ended", "error", "output"]


def _job_rows(jobs: Any) -> list[dict[str, Any]]:
    """The jobs of this process, then the store's records of other processes, as plain rows
    (times in seconds since the epoch)."""
    from ._store import store

    rows = [{"id": j.id, "label": j.label, "state": j.state.value, "cancel": j.cancel_status,
             "pid": os.getpid(), "created": j.created, "ended": j.ended,
             "error": _last_line(j.traceback), "output": j.output_text}
            for j in jobs]
    seen = {r["id"] for r in rows}
    for rec in store().jobs():
        if rec["id"] not in seen:
            # a settled record was last written when its job ended; a lost one, when found lost
            ended = rec["updated"] if rec["state"] in ("done", "failed", "cancelled") else None
            rows.append({"id": rec["id"], "label": rec["label"], "state": rec["state"],
                         "cancel": None, "pid": rec["pid"], "created": rec["created"],
                         "ended": ended, "error": _last_line(rec["error"]), "output": None})
    return rows


def jobs_frame(jobs: Any) -> pd.DataFrame:
    """The jobs of this process, then the store's records of other processes (``lost`` among
    them), one row each, with ``created`` and ``ended`` as datetimes (UTC). ``cancel`` is what
    became of a cancel (``requested``, ``stopped``, ``not honoured``), known for this process's
    jobs."""
    frame = pd.DataFrame(_job_rows(jobs), columns=_JOB_COLUMNS)
    for col in ("created", "ended"):
        frame[col] = pd.to_datetime(frame[col], unit="s", utc=True)
    return frame.set_index("id")


NO_JOBS = "no background jobs in this kernel or its store"
_TABLE_COLUMNS = ["id", "label", "state", "cancel", "started", "took", "kernel", "error",
                  "output"]


class JobsTable:
    """What ``%budget jobs`` shows a person: one row per job, with the time it started (local,
    short), how long it took (or has run so far), which kernel runs it, the last line of its
    error and of its output, and blanks where there is nothing to say; a sentence when there is
    no job. ``frame`` holds the same text as a DataFrame indexed by job id; programs read
    ``nb.jobs.to_frame()``, whose times are datetimes."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def __repr__(self) -> str:
        if self.frame.empty:
            return NO_JOBS
        table = self.frame.reset_index()
        cells = [list(table.columns), *table.values.tolist()]
        widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
        lines = ("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                 for row in cells)
        return "\n".join(line.rstrip() for line in lines)

    def _repr_html_(self) -> str:
        if self.frame.empty:
            return f"<p>{NO_JOBS}</p>"
        return str(self.frame.reset_index().to_html(index=False))


def jobs_table(jobs: Any) -> JobsTable:
    """The jobs of `jobs_frame`, for a person to read (``%budget jobs``)."""
    now = time.time()
    rows = [_readable(row, now) for row in _job_rows(jobs)]
    return JobsTable(pd.DataFrame(rows, columns=_TABLE_COLUMNS, dtype=str).set_index("id"))


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
