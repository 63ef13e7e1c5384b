"""The trace: every budget event of a run, stored compactly (S4-8, S4-9).

By default a successful charge is only counted; ``trace="full"`` stores each one as an event so
the trace can be replayed under other limits. Refusals, notices, progress, cuts and outcomes are
always stored. An event is one row of four doubles (32 bytes: time, amount, payload reference,
kind and run) appended with a single ``array.extend``, which is atomic under the GIL, so events
can be recorded without holding the run's lock.
"""

from __future__ import annotations

import html
import json
import math
import os
import struct
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, SupportsIndex

from .clock import Clock, MonotonicClock
from .errors import ConfigError
from .files import atomic_write, file_path, read_json
from .kinds import KIND_INDEX, KINDS, RUN_MS

if TYPE_CHECKING:
    import pandas as pd

    from .limits import Limits
    from .whatif import Explorer

__all__ = ["TRACE_FORMAT", "Event", "Recorder", "Replay", "Trace"]

TRACE_FORMAT = "nbbudget-trace-v1"
CONSUMED = "consumed"
REFUSED = "dispatch_refused_budget_exceeded"
#: event kinds, by code; charge events use the code 0 (``consumed``)
EVENT_KINDS: tuple[str, ...] = (
    CONSUMED, REFUSED, "approach_notice", "progress", "watchdog_cut", "tool_abandoned",
    "cancelled", "cut", "suspended", "resumed", "detached", "checkpoint_saved", "outcome",
    "grant", "pause", "unpause", "degraded", "cancel_requested", "cancel_observed", "ledger",
    "unmetered",
)
_CODE = {k: i for i, k in enumerate(EVENT_KINDS)}
_STAT_NAMES = ("checks", "consumptions", "consumed", "refusals")
_REFUSED_CODE = _CODE[REFUSED]
_GIL = getattr(sys, "_is_gil_enabled", lambda: True)()
_ROW = struct.Struct("=4d")


class Event(NamedTuple):
    """One trace event: its ``kind``, its ``payload`` (a dict) and ``t_ms`` since the run began."""

    kind: str
    payload: dict[str, Any]
    t_ms: float


class _Started(Protocol):
    started_ms: float | None


class Recorder:
    """Writes the events of one run or grant into its run's trace; safe from any thread."""

    __slots__ = ("run_id", "trace")

    def __init__(self, trace: Trace, name: str) -> None:
        self.trace = trace
        self.run_id = trace.run_index(name)

    def add(self, kind: str, t_ms: float, payload: dict[str, Any]) -> None:
        self.trace.add(kind, t_ms, self.run_id, payload)

    def charge(self, kind_index: int, amount: float, t_ms: float, target: str | None) -> None:
        self.trace.add_charge(kind_index, amount, t_ms, self.run_id, target)

    def refusal(self, kind_index: int, limit: float, consumed: float, requested: float,
                target: str | None, t_ms: float) -> None:
        """A ``dispatch_refused_budget_exceeded`` event (S4-8); an exhausted limit refuses with
        one shared payload, so repeated refusals cost a row each."""
        trace = self.trace
        key = (kind_index, limit, consumed, target)
        ref = trace._interned.get(key)
        if ref is None:
            kind = KINDS[kind_index]
            ref = trace._ref_of({
                "budget_kind": kind.name, "limit_value": _plain(limit),
                "consumed_value": _plain(consumed), "target_ref": target,
                "runtime_error_code": kind.code,
            }, key)
        trace._extend((t_ms, requested, ref, _REFUSED_CODE + 256 * self.run_id))

    def pool(self, kind_index: int, clock: Clock, run: _Started) -> list[None]:
        """The permit pool of a run with ``trace="full"``: each permit it hands out is
        recorded as a ``consumed`` event as it is taken (*run* gives the time it started)."""
        return _TracedPool(self, kind_index, clock, run)


class _TracedPool(list[None]):
    """The pool of a run with ``trace="full"``: each permit it hands out is also recorded as a
    ``consumed`` event (one atomic append), so the fast path stays free of the lock."""

    __slots__ = ("_now", "_ns", "_packed", "_ref", "_rows", "_run")

    def __init__(self, recorder: Recorder, kind: int, clock: Clock, run: _Started) -> None:
        super().__init__()
        trace = recorder.trace
        self._run = run
        self._now = clock.now_ms
        # the real clock's reading without a Python call in between (its now_ms is this / 1e6)
        self._ns = time.monotonic_ns if isinstance(clock, MonotonicClock) else None
        self._rows = trace._rows.frombytes if _GIL else trace._locked_append_bytes
        self._ref = -1 - kind
        self._packed = 256 * recorder.run_id

    def pop(self, index: SupportsIndex = -1) -> None:
        list.pop(self, index)  # IndexError when empty: the caller takes the locked path
        started = self._run.started_ms
        if started is None:
            t = 0.0
        else:
            ns = self._ns
            t = (ns() / 1e6 if ns is not None else self._now()) - started
        self._rows(_ROW.pack(t, 1.0, self._ref, self._packed))  # one atomic append


class Trace:
    """The events of one run and all its grants.

    Live traces read the run's counters for `summary()`; loaded traces keep the counters that
    were saved. Appends happen under the run's lock.
    """

    def __init__(self, *, full: bool = False, name: str | None = None,
                 limits: dict[str, float] | None = None,
                 notices: list[float] | None = None) -> None:
        self.full = full
        self.name = name
        self._rows = array("d")  # t_ms, amount, ref, code + 256 * run; four per event
        self._extend = self._append_row if _GIL else self._locked_append_row
        self._lock = threading.Lock()
        self._payloads: list[dict[str, Any]] = []
        self._interned: dict[tuple[Any, ...], int] = {}
        self._runs: list[str] = []
        self._stats_source: Any = None
        self._saved_stats: dict[str, dict[str, float]] | None = None
        self.limits: dict[str, float] = dict(limits or {})
        self.notices: list[float] = list(notices or [])  # approach-notice thresholds (fractions)
        self.outcome: dict[str, Any] | None = None

    def ended(self, outcome: dict[str, Any]) -> None:
        """The run ended with *outcome* (its payload): kept for `to_dict` and the saved trace.
        The run's `Core` tells it, when the run (not a grant) ends."""
        self.outcome = dict(outcome)

    def follow(self, stats: Callable[[], dict[str, dict[str, float]]]) -> None:
        """Read the live statistics of `summary()` from *stats* (the run's counters)."""
        self._stats_source = stats

    # -- recording (safe from any thread) ----------------------------------------------------
    def run_index(self, name: str) -> int:
        with self._lock:
            self._runs.append(name)
            return len(self._runs) - 1

    def run_count(self) -> int:
        """How many runs and grants write into this trace."""
        return len(self._runs)

    def _append_row(self, row: tuple[float, float, float, float]) -> None:
        self._rows.frombytes(_ROW.pack(*row))  # one C call: atomic under the GIL

    def _locked_append_row(self, row: tuple[float, float, float, float]) -> None:
        self._locked_append_bytes(_ROW.pack(*row))

    def _locked_append_bytes(self, packed: bytes) -> None:
        with self._lock:
            self._rows.frombytes(packed)

    def add(self, kind: str, t_ms: float, run: int,
            payload: dict[str, Any] | Callable[[], dict[str, Any]],
            key: tuple[Any, ...] | None = None) -> None:
        """Append an event. Events with the same *key* share one payload, made by calling
        *payload* the first time (so repeated refusals of an exhausted limit cost a few bytes
        each, not a dict each)."""
        self._extend((t_ms, 0.0, self._ref_of(payload, key), _CODE[kind] + 256 * run))

    def _ref_of(self, payload: dict[str, Any] | Callable[[], dict[str, Any]],
                key: tuple[Any, ...] | None) -> int:
        ref = self._interned.get(key, -1) if key is not None else -1
        if ref < 0:
            made = payload() if callable(payload) else payload
            with self._lock:
                self._payloads.append(made)
                ref = len(self._payloads) - 1
                if key is not None:
                    self._interned[key] = ref
        return ref

    def add_charge(self, kind_index: int, amount: float, t_ms: float, run: int,
                   target: str | None) -> None:
        if target is None:
            ref = -1 - kind_index
        else:
            ref = self._ref_of({"budget_kind": KINDS[kind_index].name, "target": target},
                               (CONSUMED, kind_index, target))
        self._extend((t_ms, amount, ref, 256 * run))

    # -- reading --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._rows) // 4

    def _row(self, i: int) -> tuple[float, float, int, int, int]:
        """(t_ms, amount, ref, code, run) of event *i*."""
        t, amount, ref, packed = self._rows[4 * i: 4 * i + 4]
        return t, amount, int(ref), int(packed) % 256, int(packed) // 256

    def _column(self, k: int) -> array[float]:
        return self._rows[k::4]

    def _codes(self) -> list[int]:
        return [int(p) % 256 for p in self._column(3)]

    def _event(self, i: int) -> Event:
        t, amount, ref, code, run = self._row(i)
        if code == 0:
            if ref < 0:
                payload: dict[str, Any] = {"budget_kind": KINDS[-1 - ref].name}
            else:
                payload = dict(self._payloads[ref])
            payload["amount"] = _plain(amount)
            payload["run"] = self._runs[run]
        else:
            payload = self._payloads[ref]
        return Event(EVENT_KINDS[code], payload, t)

    def latest(self, kind: str) -> Event | None:
        """The latest event of *kind*, or None (searched from the end)."""
        code = _CODE[kind]
        for i in reversed(range(len(self))):
            if self._row(i)[3] == code:
                return self._event(i)
        return None

    def __iter__(self) -> Iterator[Event]:
        return (self._event(i) for i in range(len(self)))

    @property
    def events(self) -> list[Event]:
        """Every event, oldest first."""
        return list(self)

    def stats(self) -> dict[str, dict[str, float]]:
        """Counts per budget kind: ``checks``, ``consumptions``, ``consumed`` and ``refusals``."""
        if self._stats_source is not None:
            return dict(self._stats_source())
        return self._saved_stats or {name: {} for name in _STAT_NAMES}

    def refusals_by_kind(self) -> Counter[str]:
        """How many refusals the trace holds, by budget kind."""
        refused = _CODE[REFUSED]
        refs = self._column(2)
        return Counter(self._payloads[int(refs[i])]["budget_kind"]
                       for i, c in enumerate(self._codes()) if c == refused)

    def summary(self) -> dict[str, Any]:
        """What S4-9 asks of a trace: budget checks, consumptions and refusals, by kind."""
        stats = self.stats()
        kinds = sorted(
            set().union(*(stats[n] for n in _STAT_NAMES)), key=lambda k: KIND_INDEX.get(k, 99)
        )
        events = Counter(EVENT_KINDS[c] for c in self._codes())
        return {
            "run": self.name,
            "mode": "full" if self.full else "counts",
            "checks": sum(stats["checks"].values()),
            "consumptions": sum(stats["consumptions"].values()),
            "refusals": sum(stats["refusals"].values()),
            "kinds": kinds,
            "by_kind": {k: {n: stats[n].get(k, 0) for n in _STAT_NAMES} for k in kinds},
            "limits": dict(self.limits),
            "events": dict(events),
            "outcome": self.outcome,
        }

    def to_frame(self) -> pd.DataFrame:
        """The events as a pandas DataFrame: ``t_ms``, ``kind``, ``run``, ``budget_kind``,
        ``amount`` and ``payload`` (charges carry no payload dict, so a million rows is cheap)."""
        from .frames import trace_frame

        n = len(self)
        # a copy (not a view): a live run may still be appending to the array
        return trace_frame(self._rows[: 4 * n], self._payloads, self._runs,
                           EVENT_KINDS)

    def replay(self, limits: Limits) -> Replay:
        """Where this run's charges would have been refused under *limits* (run-wide ceilings).

        Exact for a trace recorded with ``trace="full"``; from totals only otherwise, and then
        `Replay.exact` is false and no event index is given.
        """
        from .limits import Limits as _Limits

        if not isinstance(limits, _Limits):
            raise ConfigError(f"replay() takes nb.Limits, not {type(limits).__name__}")
        return _replay_full(self, limits) if self.full else _replay_totals(self, limits)

    def plot(self, **kwargs: Any) -> Any:
        """Consumption over time for each axis as a fraction of its limit, with the notice
        thresholds, the approach notices, refusals and cuts marked (needs matplotlib: the
        ``plot`` extra). Keyword arguments: ``ax``, a matplotlib Axes to draw on. Returns the
        Axes."""
        from .frames import plot_trace

        return plot_trace(self.to_frame(), self.limits, self.notices, **kwargs)

    def explore(self, *, widgets: bool = True, plot: bool = True,
                interval_ms: float = 150) -> Explorer:
        """How this run would have ended under other limits: in a notebook, one slider per axis
        the run used, the verdict (completed, or refused at event N by axis K, after how much of
        the work; what is kept and what lost) and the plot against the would-be limits; where
        widgets cannot render, the verdict as text. ``widgets=False`` gives the text alone,
        ``plot=False`` no plot (the plot needs matplotlib: the ``plot`` extra); a slider's
        drag redraws the plot at most once per *interval_ms*. Needs the ``frames`` extra.
        The explorer's ``verdict``, ``limits`` and ``set(**limits)`` work without a front end
        (`nbbudget.core.whatif`)."""
        from .whatif import Explorer as _Explorer

        return _Explorer(self, widgets=widgets, plot=plot, interval_ms=interval_ms)

    # -- files ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": TRACE_FORMAT,
            "run": self.name,
            "mode": "full" if self.full else "counts",
            "limits": self.limits,
            "notices": self.notices,
            "stats": self.stats(),
            "outcome": self.outcome,
            "runs": list(self._runs),
            "events": {
                "code": [EVENT_KINDS[c] for c in self._codes()],
                "t_ms": list(self._column(0)),
                "amount": [_plain(a) for a in self._column(1)],
                "ref": [int(r) for r in self._column(2)],
                "run": [int(p) // 256 for p in self._column(3)],
                "payloads": self._payloads,
            },
        }

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the trace as versioned JSON, atomically, with the mode the umask gives a new
        file (the user's own file, as any program writes it). An existing file is only replaced
        with ``overwrite=True``."""
        data = json.dumps(self.to_json(), separators=(",", ":"), default=str).encode()
        atomic_write(path, data, overwrite=overwrite, mode=0o666)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace written by `save`; a missing, malformed or foreign file is a
        `ConfigError` that says which and where."""
        where = file_path(path, "trace")
        data = read_json(where, "trace", "a trace is the object that Trace.save writes")
        try:
            return cls.from_json(data)
        except ConfigError as exc:
            raise ConfigError(f"trace {where!r}: {exc}") from None

    @classmethod
    def from_json(cls, data: object) -> Trace:
        if not isinstance(data, Mapping) or data.get("format") != TRACE_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(
                f"not an nbbudget trace (format {found!r}, expected {TRACE_FORMAT!r})"
            )
        try:
            trace = cls(full=data["mode"] == "full", name=data.get("run"))
            trace.limits = dict(data["limits"])
            trace.notices = [float(f) for f in data.get("notices", ())]
            trace.outcome = data.get("outcome")
            trace._saved_stats = {n: dict(data["stats"][n]) for n in _STAT_NAMES}
            trace._runs = [str(r) for r in data["runs"]]
            ev = data["events"]
            trace._payloads = list(ev["payloads"])
            columns = (ev["code"], ev["t_ms"], ev["amount"], ev["ref"], ev["run"])
            if len({len(c) for c in columns}) != 1:
                raise ConfigError("its event columns have different lengths")
            rows = trace._rows
            for code, t, amount, ref, run in zip(*columns, strict=True):
                if not (isinstance(ref, int) and isinstance(run, int) and 0 <= run < 2**16):
                    raise ConfigError(f"event {len(trace)} has a malformed ref or run")
                rows.extend((float(t), float(amount), ref, _CODE[code] + 256 * run))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"a field is missing or malformed ({exc!r})") from None
        for i in range(len(trace)):
            _, _, ref, code, run = trace._row(i)
            lowest = -len(KINDS) if code == 0 else 0  # only charges point at a kind
            if not (lowest <= ref < len(trace._payloads)) or run >= len(trace._runs):
                raise ConfigError(f"event {i} points at a payload or run that is not there")
            if code == 0 and ref >= 0 and not (
                    isinstance(payload := trace._payloads[ref], Mapping)
                    and payload.get("budget_kind") in KIND_INDEX):
                raise ConfigError(f"event {i} is a charge whose payload names no kind of "
                                  f"budget (budget_kind)")
        return trace

    def __repr__(self) -> str:
        s = self.summary()
        return (f"<Trace {self.name!r} {s['mode']}: {len(self)} events, {s['checks']} checks, "
                f"{s['consumptions']} consumptions, {s['refusals']} refusals>")


_REPLAY_COLUMNS = ("index", "t_ms", "budget_kind", "limit_value", "consumed_value", "amount",
                   "target_ref")


class Replay(NamedTuple):
    """The result of `Trace.replay`: each charge that would have been refused. It shows as a
    sentence and a table, times in ms to two decimals; `refusals` and `to_frame` keep the
    exact values."""

    refusals: list[dict[str, Any]]
    exact: bool

    def __bool__(self) -> bool:
        return bool(self.refusals)

    @property
    def first(self) -> dict[str, Any] | None:
        return self.refusals[0] if self.refusals else None

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.refusals, columns=list(_REPLAY_COLUMNS))

    def __repr__(self) -> str:
        head, rows = self._table()
        if not rows:
            return self._headline()
        widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
        lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True))
                 for row in (head, *rows)]
        return "\n".join([self._headline(), *lines])

    def _repr_html_(self) -> str:
        head, rows = self._table()
        table = "".join(
            "<tr>" + "".join(f"<{tag}>{html.escape(v)}</{tag}>" for v in row) + "</tr>"
            for tag, row in (("th", head), *(("td", row) for row in rows)))
        return f"<p>{html.escape(self._headline())}</p>" + (
            f"<table>{table}</table>" if rows else "")

    def _headline(self) -> str:
        n = len(self.refusals)
        what = ("charge", "would have been refused") if self.exact else (
            "limit", "would have been exceeded")
        how = ("replayed charge by charge" if self.exact else
               "from the run's totals: record with trace=\"full\" to replay charge by charge")
        if not n:
            return f"No {what[0]} {what[1]} under these limits ({how})."
        return f"{n} {what[0]}{'s' if n != 1 else ''} {what[1]} under these limits ({how}):"

    def _table(self) -> tuple[list[str], list[list[str]]]:
        """The columns that hold something, and each refusal's values as text."""
        head = [c for c in _REPLAY_COLUMNS if any(r[c] is not None for r in self.refusals)]
        return head, [[_shown(r, c) for c in head] for r in self.refusals]


def _shown(refusal: dict[str, Any], column: str) -> str:
    """One value of a refusal as a person reads it: times to two decimals, no ``None``."""
    value = refusal[column]
    if value is None:
        return ""
    timed = column == "t_ms" or (refusal["budget_kind"] == KINDS[RUN_MS].name
                                 and column in ("limit_value", "consumed_value"))
    if isinstance(value, float):
        return f"{value:.2f}" if timed else f"{value:g}"
    return str(value)


def _replay_full(trace: Trace, limits: Limits) -> Replay:
    """Each charge in order: refused when it would take its kind past its limit, or comes after
    the time grant; a refused charge is not counted against later ones. With numpy (which the
    frames extra brings) in one vectorised pass, else in one pass of Python: the same answers."""
    lim: list[float] = [math.inf] * len(KINDS)
    for name, value in limits.to_dict().items():
        lim[KIND_INDEX[name]] = value
    n = len(trace)
    rows = trace._rows[: 4 * n]  # a copy: a live run may still be appending to the array
    # the kind of each charge payload (a charge with a target points at one; -1: not a charge's)
    ref_kind = [KIND_INDEX.get(str(p.get("budget_kind")), -1) if isinstance(p, dict) else -1
                for p in trace._payloads]
    try:
        import numpy as np
    except ImportError:
        refused = _refused_in_python(rows, lim, ref_kind)
    else:
        refused = _refused_with_numpy(np, rows, lim, ref_kind)
    names = [k.name for k in KINDS]
    targets = [p.get("target") if isinstance(p, dict) else None for p in trace._payloads]
    out = [{
        "index": i, "t_ms": t, "budget_kind": names[kind], "limit_value": lim[kind],
        "consumed_value": t if kind == RUN_MS else int(consumed) if consumed.is_integer()
        else consumed, "amount": int(amount) if amount.is_integer() else amount,  # as _plain
        "target_ref": targets[ref] if ref >= 0 else None,
    } for i, kind, consumed, t, amount, ref in refused]
    return Replay(out, True)


def _refused_in_python(rows: array[float], lim: list[float],
                       ref_kind: list[int]) -> list[tuple[int, int, float, float, float, int]]:
    """Each refused charge, in order: its index, the kind it is refused by, what its own kind
    had consumed before it, and its time, amount and payload reference."""
    used = [0.0] * len(KINDS)
    lim_ms = lim[RUN_MS]
    out = []
    columns = zip(rows[0::4], rows[1::4], rows[2::4], rows[3::4], strict=True)
    for i, (t, amount, ref, packed) in enumerate(columns):
        if packed % 256:  # not a charge
            continue
        k = -1 - int(ref) if ref < 0 else ref_kind[int(ref)]
        time_over = t > lim_ms
        if used[k] + amount > lim[k] or time_over:
            kind = RUN_MS if time_over and used[k] + amount <= lim[k] else k
            out.append((i, kind, used[k], t, amount, int(ref)))
        else:
            used[k] += amount
    return out


def _refused_with_numpy(np: Any, rows: array[float], lim: list[float], ref_kind: list[int],
                        ) -> list[tuple[int, int, float, float, float, int]]:
    """What `_refused_in_python` gives, kind by kind with numpy: the charges of a kind up to the
    first that passes its limit are a cumulative sum (summed in order, as Python adds them);
    after it, only charges that fit the headroom left then can still pass, and those few are
    walked in order."""
    table = np.frombuffer(rows, dtype=np.float64).reshape(-1, 4)
    t, amount, ref = table[:, 0], table[:, 1], table[:, 2]
    charges = np.flatnonzero((table[:, 3].astype(np.int64) & 255) == 0)
    refs = ref[charges].astype(np.int64)
    kind_of_ref = np.asarray([*ref_kind, -1], dtype=np.int64)
    kinds = np.where(refs < 0, -1 - refs, kind_of_ref[np.maximum(refs, 0)])
    timed = lim[RUN_MS] < math.inf
    found = []
    for k in np.flatnonzero(np.bincount(kinds, minlength=len(KINDS))).tolist():
        if not timed and lim[k] == math.inf:
            continue  # nothing of this kind can be refused
        at = charges[kinds == k]
        a = amount[at]
        over = t[at] > lim[RUN_MS] if timed else np.zeros(len(at), dtype=bool)
        accepted = ~over
        if lim[k] < math.inf:
            timely = np.flatnonzero(accepted) if timed else np.arange(len(at))
            summed = np.cumsum(a[timely] if timed else a)
            passed = summed > lim[k]
            if passed.any():
                j = int(passed.argmax())
                used = float(summed[j - 1]) if j else 0.0
                accepted[timely[j:]] = False
                later = timely[j + 1:]
                for p in later[a[later] + used <= lim[k]].tolist():
                    if used + float(a[p]) <= lim[k]:
                        accepted[p] = True
                        used += float(a[p])
        refused = np.flatnonzero(~accepted)
        if not len(refused):
            continue
        counted = np.cumsum(np.where(accepted, a, 0.0))
        before = np.concatenate(([0.0], counted[:-1]))
        by_time = over[refused] & (before[refused] + a[refused] <= lim[k])
        found.append((at[refused], np.where(by_time, RUN_MS, k), before[refused]))
    if not found:
        return []
    index, kind, consumed = (np.concatenate(c) for c in zip(*found, strict=True))
    order = np.argsort(index, kind="stable")
    index, kind, consumed = index[order], kind[order], consumed[order]
    return list(zip(index.tolist(), kind.tolist(), consumed.tolist(), t[index].tolist(),
                    amount[index].tolist(), ref[index].astype(np.int64).tolist(), strict=True))


def _replay_totals(trace: Trace, limits: Limits) -> Replay:
    consumed = trace.stats()["consumed"]
    out = []
    for name, value in limits.to_dict().items():
        used = consumed.get(name, 0)
        if used > value:
            out.append({"index": None, "t_ms": None, "budget_kind": name, "limit_value": value,
                        "consumed_value": used, "amount": None, "target_ref": None})
    return Replay(out, False)


def _plain(x: float) -> float:
    return int(x) if float(x).is_integer() else x
