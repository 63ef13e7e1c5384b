"""pandas views of runs and traces; pandas is imported only here, when a frame is asked for."""

from __future__ import annotations

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

from .endings import by_in_words
from .kinds import KIND_INDEX, KINDS, RUN_MS

if TYPE_CHECKING:
    from .snapshot import ModelUsage, Snapshot

__all__ = ["MODEL_COLUMNS", "models_frame", "plot_trace", "trace_frame", "usage_frame"]

#: the columns of `models_frame`, in their order
MODEL_COLUMNS = ["calls", "input_tokens", "output_tokens", "cost_usd"]


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


def models_frame(models: Sequence[ModelUsage]) -> pd.DataFrame:
    """One row per model a run called (its snapshot's ``models``), indexed by ``provider`` and
    ``model``: calls, input and output tokens (whole numbers) and the cost in dollars (NaN where
    no price was known); no rows, with the same index and columns, when it called none."""
    index = pd.MultiIndex.from_tuples([(m.provider, m.model) for m in models],
                                      names=["provider", "model"])
    return pd.DataFrame({
        "calls": np.array([m.calls for m in models], dtype=np.int64),
        "input_tokens": np.array([m.input_tokens for m in models], dtype=np.int64),
        "output_tokens": np.array([m.output_tokens for m in models], dtype=np.int64),
        "cost_usd": np.array([np.nan if m.cost_usd is None else m.cost_usd for m in models],
                             dtype=np.float64),
    }, index=index, columns=MODEL_COLUMNS)


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
    timed = KINDS[RUN_MS].name  # drawn from the clock
    run_ms = limits.get(timed)
    if run_ms and end:
        ax.plot([0.0, end], [0.0, end / run_ms], label=f"{timed} (limit {run_ms:g})")
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
        by = (payload or {}).get("by")
        ax.axvline(t_ms, color="red", linestyle="--", linewidth=1,
                   label=f"cut ({by_in_words(by) if by else 'stop'})")
    ended = frame[frame["kind"] == "outcome"]
    for t_ms, payload in zip(ended["t_ms"], ended["payload"], strict=True):
        if payload and payload.get("status") in ("failed", "stopped", "cancelled"):
            by = payload.get("by")
            what = by_in_words(by) if by else payload.get("cause") or payload["status"]
            ax.axvline(t_ms, color="red", linestyle="--", linewidth=1,
                       label=f"{payload['status']} ({what})")


def _marks(ax: Any, rows: pd.DataFrame, height: Any, **style: Any) -> None:
    if len(rows):
        ax.scatter(rows["t_ms"], [height(p or {}) for p in rows["payload"]], zorder=3, **style)
