"""Limits suggested from a history of recorded runs.

For each axis the runs used, the suggestion is a quantile of what the runs that finished
(outcome ``completed``) used, plus a margin, rounded up: to a whole number on integer axes
(S4-1: at least 1), to a millionth of a dollar on ``cost_usd``. A run's use of an axis is its
whole-run total (``Trace.stats()["consumed"]``), grants and sub-agents included (S4-3); a
resumed run's totals include what earlier slices spent (S3-1, S4-4).

The quantile is the nearest rank: the ``ceil(q * n)``-th smallest of the *n* finished runs'
totals. It is always a value some run actually used, and at least ``q`` of the finished runs fit
within it, for any *n*: with twenty runs and ``q=0.95``, the 19th smallest. Linear
interpolation (numpy's and pandas' default) gives values between two runs, which for a few runs
and whole-number axes is a total no run had and may let fewer than ``q`` of the runs through.

A run that was cut (failed, stopped, suspended by a window) is counted as seen and replayed,
but what it used is only a floor on what it needed, so it is left out of the quantile; a
history where no run finished is refused with a `ConfigError`.

How many recorded runs the limits would have stopped comes from `Trace.replay` on each run:
exact, charge by charge, for a trace recorded with ``trace="full"``; from the totals otherwise,
and for a resumed run's trace (its earlier slices' charges are in another trace). A run whose
active time went past the suggested ``run_ms`` after its last charge counts as stopped by time
too: replay sees charges only, but the time grant would have cut the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .kinds import KIND_INDEX, KINDS, RUN_MS
from .limits import Limits
from .trace import Trace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Suggestion", "suggest"]

#: the columns of `Suggestion.to_frame`, one row per axis
COLUMNS = ("axis", "runs", "used_by", "finished", "quantile", "at_quantile", "margin", "limit",
           "stopped", "replay")
_PER_USD = 1_000_000  # cost limits are whole millionths of a dollar


class Suggestion:
    """Limits suggested from recorded runs (`suggest`): ``limits`` is an `nb.Limits` with a
    field for each axis the runs used; ``to_frame()`` explains each one.

    ``runs`` is how many runs were seen, ``finished`` how many completed, ``stopped`` how many
    of the runs all the suggested limits together would have stopped (a run stopped by one axis
    counts once, under the axis that stops it first).
    """

    __slots__ = ("finished", "limits", "margin", "quantile", "rows", "runs", "stopped")

    def __init__(self, limits: Limits, rows: list[dict[str, Any]], *, runs: int, finished: int,
                 stopped: int, quantile: float, margin: float) -> None:
        self.limits = limits
        self.rows = rows
        self.runs = runs
        self.finished = finished
        self.stopped = stopped
        self.quantile = quantile
        self.margin = margin

    def to_frame(self) -> pd.DataFrame:
        """One row per axis: ``axis``; ``runs`` seen; ``used_by``, how many of them used it;
        ``finished``, how many completed; ``quantile``; ``at_quantile``, what the finished runs
        used at that quantile; ``margin``; ``limit``, the suggestion; ``stopped``, how many runs
        the limits would have stopped by this axis first; ``replay``, ``exact``, ``from
        totals`` or how many runs of each."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(COLUMNS))

    def __repr__(self) -> str:
        head = (f"Limits from {self.runs} run{'s' if self.runs != 1 else ''} "
                f"({self.finished} finished): the {_percent(self.quantile)} quantile (nearest "
                f"rank) of what the finished runs used, plus {_percent(self.margin)}; they would "
                f"have stopped {self.stopped} of the {self.runs}.")
        table = [list(COLUMNS[:1] + COLUMNS[3:])] + [
            [_text(row[c]) for c in COLUMNS[:1] + COLUMNS[3:]] for row in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True))
                 for row in table]
        return "\n".join([head, f"{self.limits!r}", *lines])


def suggest(traces: Iterable[Trace], *, margin: float = 0.2,
            quantile: float = 0.95) -> Suggestion:
    """Limits from a history of recorded runs (each an `nb.Trace`): per axis the runs used, the
    *quantile* (nearest rank, in (0, 1]) of what the finished runs used, times ``1 + margin``
    (*margin* a fraction, 0 or more: 0.2 adds 20%), rounded up. See the module docstring for
    cut runs, resumed runs and how the would-have-stopped count is made.

    Used by ``nb.suggest_limits``, which gathers the store's history when given no traces.
    """
    _check_fraction("quantile", quantile, low_open=True, high=1.0)
    _check_fraction("margin", margin, low_open=False, high=None)
    given: object = traces  # one Trace (which iterates over its events) is an easy slip
    if isinstance(given, Trace):
        raise ConfigError("suggest() takes a history of runs, not one nb.Trace; pass a list, "
                          "[trace] for one run")
    runs = list(traces)
    for i, trace in enumerate(runs):
        if not isinstance(trace, Trace):
            raise ConfigError(
                f"run {i} of the history is {type(trace).__name__}, not nb.Trace; pass recorded "
                f"traces (run.trace, or nb.Trace.load(path))")
    if not runs:
        raise ConfigError("no recorded runs to suggest limits from; pass the traces of past "
                          "runs (run.trace, or nb.Trace.load(path) for a saved one)")
    totals = [_totals(trace) for trace in runs]
    done = [t for t, trace in zip(totals, runs, strict=True) if _finished(trace)]
    if not done:
        endings = sorted({_ending(trace) for trace in runs})
        raise ConfigError(
            f"none of the {len(runs)} recorded runs finished (they ended {', '.join(endings)}); "
            f"what a cut run used is only a floor on what it needed: record runs that finish "
            f"(under wider limits, or none) and suggest again")
    axes = [k.name for k in KINDS if any(t.get(k.name, 0) > 0 for t in totals)]
    at_quantile = {a: _nearest_rank(sorted(t.get(a, 0) for t in done), quantile) for a in axes}
    suggested: dict[str, Any] = {a: _rounded_up(a, at_quantile[a] * (1 + margin)) for a in axes}
    limits = Limits(**suggested)

    stopped_by = dict.fromkeys(axes, 0)
    exact = 0
    for trace, total in zip(runs, totals, strict=True):
        axis, was_exact = _stopping_axis(trace, total, limits)
        exact += was_exact
        if axis is not None:
            stopped_by[axis] += 1
    replay = ("exact" if exact == len(runs) else "from totals" if not exact else
              f"exact for {exact} run{'s' if exact != 1 else ''}, from totals for "
              f"{len(runs) - exact}")
    rows = [{
        "axis": a, "runs": len(runs), "used_by": sum(1 for t in totals if t.get(a, 0) > 0),
        "finished": len(done), "quantile": quantile, "at_quantile": at_quantile[a],
        "margin": margin, "limit": getattr(limits, a), "stopped": stopped_by[a],
        "replay": replay,
    } for a in axes]
    return Suggestion(limits, rows, runs=len(runs), finished=len(done),
                      stopped=sum(stopped_by.values()), quantile=quantile, margin=margin)


def _check_fraction(name: str, value: object, *, low_open: bool, high: float | None) -> None:
    """A bad *quantile* or *margin* is a `ConfigError` naming the value (as S3-4 asks)."""
    want = "a number in (0, 1], e.g. 0.95" if high is not None else (
        "a fraction, 0 or more, e.g. 0.2 for 20%")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}={value!r} is not a number; use {want}")
    if not math.isfinite(value) or (value <= 0 if low_open else value < 0) or (
            high is not None and value > high):
        raise ConfigError(f"{name}={value!r} is out of range; use {want}")


def _totals(trace: Trace) -> dict[str, float]:
    """What the run used of each axis, over its whole life (its saved or live counters)."""
    consumed = trace.stats()["consumed"]
    return {name: value for name, value in consumed.items() if name in KIND_INDEX}


def _finished(trace: Trace) -> bool:
    return _ending(trace) == "completed"


def _ending(trace: Trace) -> str:
    outcome = trace.outcome
    return str(outcome.get("status")) if outcome else "without an outcome (still running)"


def _nearest_rank(ordered: list[float], quantile: float) -> float:
    """The nearest-rank quantile of *ordered* (sorted, not empty): its ``ceil(q * n)``-th."""
    rank = math.ceil(round(quantile * len(ordered), 9))  # 0.7 * 10 is 7.000000000000001
    return ordered[max(rank, 1) - 1]


def _rounded_up(axis: str, value: float) -> int | float:
    """*value* rounded up to what a limit of *axis* can be: a whole number of at least 1, or
    a whole number of millionths of a dollar, at least one. Float noise (10 * 1.2 is
    12.000000000000002) is not rounded up."""
    if KINDS[KIND_INDEX[axis]].integral:
        return max(1, math.ceil(round(value, 9)))
    return max(1, math.ceil(round(value * _PER_USD, 6))) / _PER_USD


def _stopping_axis(trace: Trace, totals: dict[str, float],
                   limits: Limits) -> tuple[str | None, bool]:
    """The axis by which *limits* would have stopped the run first (None if they would not),
    and whether that came from an exact replay."""
    first = next(iter(trace), None)
    if trace.full and (first is None or first.kind != "resumed"):
        replay = trace.replay(limits)
        if replay.first is not None:
            return str(replay.first["budget_kind"]), True
        run_ms = KINDS[RUN_MS].name
        over_time = limits.run_ms is not None and totals.get(run_ms, 0) > limits.run_ms
        return (run_ms if over_time else None), True
    if trace.full:  # a resumed run: its earlier slices' charges are not in this trace
        names = [n for n, value in limits.to_dict().items() if totals.get(n, 0) > value]
    else:
        names = [r["budget_kind"] for r in trace.replay(limits).refusals]
    return min(names, key=lambda n: KINDS[KIND_INDEX[n]].rank, default=None), False


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
