"""What a recorded run would have done under other limits: the model and the view of
`Trace.explore`.

`WhatIf` is the model. It reads a trace once (its events as a frame, the cumulative use of each
axis charge by charge) and then answers `WhatIf.verdict` for any limits: how the run would have
ended (completed, refused at event N by axis K, cut by its time grant, or past the point where
the recording ends) and what would have been kept and lost. A refusal ends a run (S3-2), so only
the first refusal of `Trace.replay` matters: it is found by a binary search of each axis's
cumulative use (made once), which gives the same event and axis as ``trace.replay(limits).first``
in a few microseconds whatever the trace's length. The limits are whole-run ceilings, as
replay's; a resumed run's trace starts from the counters and active time its checkpoint carried
(S3-1, S4-4), so a ceiling counts what earlier slices spent. What was done before the cut is
kept (S4-10): the checkpoints saved and the tools' outputs (their ``progress`` events).

`Explorer` is the view: one slider per axis the run used (ipywidgets), the verdict as a line of
text, and the run's consumption drawn against the would-be limits with the cut marked
(matplotlib, drawn on its own `Figure` and sent as a PNG to an ``Image`` widget, so no pyplot
state or backend is touched). It is built from stock widgets, displayed once, and then only its
traits change: a slider move recomputes the verdict at once (cheap) and redraws the plot at most
once per ``interval_ms``, the last move of a drag always drawn (a timer on the kernel's event
loop; where no loop runs, each move draws). Where widgets cannot render, its ``text/plain`` is
the verdict. Its state is readable without a front end: ``explorer.verdict``, ``explorer.limits``,
``explorer.sliders``, ``explorer.draws``.

Why the view is in the core: `Trace` lives here and hands out the explorer, and the core may not
import the Jupyter layer (``docs/architecture.md``). ipywidgets and matplotlib are third-party
libraries, imported here only when an explorer is made and shown, as `nbbudget.core.frames`
imports pandas and matplotlib only when a frame or a plot is asked for; ``import nbbudget`` pulls
in neither. The view uses no IPython, no kernel and no comm of nbbudget's own. A registry that the
Jupyter layer filled at ``%load_ext`` would make ``explore()`` depend on the extension being
loaded, and be the kind of global mutable registry the package avoids.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import io
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the what-if explorer needs numpy and pandas; install them with: "
        "pip install 'nbbudget[frames]'") from exc

from .duration import spoken
from .errors import ConfigError
from .kinds import KIND_INDEX, KINDS, RUN_MS
from .limits import Limits

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Explorer", "Range", "Recorded", "Verdict", "WhatIf"]

_TIME = KINDS[RUN_MS].name
_REFUSED = "dispatch_refused_budget_exceeded"
#: the events that end a run which did not complete, just before its ``outcome``
_ENDING = frozenset({_REFUSED, "cut", "watchdog_cut", "cancelled", "cancel_requested",
                     "cancel_observed", "suspended", "tool_abandoned"})
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"  # ipywidgets' protocol, version 2
_MAX_POINTS = 2000  # points drawn per axis: a plot is a few hundred pixels wide


class Recorded(Protocol):
    """What the model reads of a trace (`nbbudget.core.trace.Trace` is one): `Trace.explore`
    hands itself over as this, so that this module need not import the trace's."""

    full: bool
    name: str | None
    limits: dict[str, float]
    notices: list[float]
    outcome: dict[str, Any] | None

    def stats(self) -> dict[str, dict[str, float]]: ...

    def to_frame(self) -> pd.DataFrame: ...


class Range(NamedTuple):
    """A slider's range for one axis: ``low`` to ``high`` by ``step``, starting at ``start``
    (the limit the run had, or ``high`` for an axis it had none on)."""

    low: float
    high: float
    step: float
    start: float


class Verdict(NamedTuple):
    """How the recorded run would have ended under ``limits``; ``str()`` gives it as text.

    ``status``: ``completed``; ``refused`` (a charge refused, at event ``event`` by axis
    ``kind``); ``cut`` (the time grant spent at ``t_ms``, before event ``event``); ``beyond``
    (the run gets past the point where its recording ends, event ``event``: what it would have
    done next is not known); ``stopped`` (it ended as recorded, by ``kind``: a stop, a cancel or
    the watchdog, which limits do not change). ``as_recorded``: it ends where and how the
    recorded run ended. ``event`` is an event's position in the trace (as in
    `Trace.to_frame` and `Trace.replay`), None for a completed run or a trace recorded without
    ``trace="full"``. ``done`` and ``done_time`` are the fractions of the events and of the time
    recorded before the cut. ``kept`` and ``lost`` map what was recorded before and after the
    cut (checkpoints, tool outputs, charges) to how many.
    """

    status: str
    limits: Limits
    event: int | None
    kind: str | None
    t_ms: float | None
    as_recorded: bool
    done: float
    done_time: float
    kept: dict[str, float]
    lost: dict[str, float]
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        """The verdict in a few lines: how the run ends, then what is kept and what lost."""
        return "\n".join(self.lines)

    def __str__(self) -> str:
        return self.text


class WhatIf:
    """How a recorded run would have ended under other limits (see the module docstring).

    Used by `Explorer`, which asks it a verdict for each move of a slider; it reads the trace
    once, here.
    """

    def __init__(self, trace: Recorded) -> None:
        self.trace = trace
        self.exact = bool(trace.full)
        frame = trace.to_frame()
        self.n = n = len(frame)
        self.t = t = frame["t_ms"].to_numpy(dtype=np.float64)
        self.events = np.asarray(frame["kind"].astype(str).to_numpy(dtype=object))
        self.payloads = frame["payload"].to_numpy(dtype=object)
        self.runs = frame["run"].astype(str).to_numpy(dtype=object)
        kind_codes = frame["budget_kind"].cat.codes.to_numpy()
        amount = frame["amount"].to_numpy(dtype=np.float64)
        consumed = trace.stats()["consumed"]
        resumed = self.payloads[0] if n and self.events[0] == "resumed" else None
        base = dict((resumed or {}).get("counts", {}))
        self.time_base = float((resumed or {}).get("active_ms", 0.0))
        self.end_ms = float(t.max()) if n else 0.0
        charges = self.events == "consumed"
        self.latest = np.maximum.accumulate(t) if n else t
        # per charged axis: the events that charge it, and its use after each (with the base)
        self.at: dict[str, Any] = {}
        self.used_after: dict[str, Any] = {}
        self.amount = amount
        for i, kind in enumerate(KINDS):
            at = np.flatnonzero(charges & (kind_codes == i))
            if len(at):
                self.at[kind.name] = at
                self.used_after[kind.name] = float(base.get(kind.name, 0)) + np.cumsum(amount[at])
        self.used = {k.name: float(consumed.get(k.name, 0) or 0) for k in KINDS}
        if self.exact:  # a full trace: what its charges add up to (a resumed one: plus its base)
            for name, after in self.used_after.items():
                self.used[name] = max(self.used[name], float(after[-1]))
        self.axes = [k.name for k in KINDS if self.used[k.name] > 0]
        #: where the checkpoints were saved and the tools reported their outputs
        self.marks = {what: np.flatnonzero(self.events == event) for what, event in
                      (("checkpoints", "checkpoint_saved"), ("tool outputs", "progress"))}
        self.recorded = dict(trace.outcome or {})
        self.end_index = self._recorded_end()

    # -- the recording ------------------------------------------------------------------------
    def _recorded_end(self) -> int:
        """The first event of how the recorded run ended: the refusal, cut or stop just before
        its ``outcome`` (the ``outcome`` event itself for a completed run; the number of events
        for a trace without one)."""
        outcomes = np.flatnonzero(self.events == "outcome")
        if not len(outcomes):
            return self.n
        end = int(outcomes[-1])
        if self.recorded.get("status") == "completed":
            return end
        while end > 0 and self.events[end - 1] in _ENDING:
            end -= 1
        return end

    def ranges(self) -> dict[str, Range]:
        """Each axis the run used, with its slider's range: from the least limit to half again
        the more of what it used and the limit it had."""
        out = {}
        for name in self.axes:
            had = self.trace.limits.get(name)
            top = max(self.used[name], float(had or 0)) * 1.5
            if KINDS[KIND_INDEX[name]].integral:
                high = float(max(2, math.ceil(top)))
                low, step = 1.0, 1.0
            else:  # dollars: a thousand steps
                step = _round_step(top / 1000)
                high = math.ceil(top / step) * step
                low = step
            start = min(float(had), high) if had is not None else high
            out[name] = Range(low, high, step, start)
        return out

    def start(self) -> Limits:
        """The limits the sliders start at: the run's own where it had them, else the top of
        each slider (the run as it went)."""
        return _limits({name: r.start for name, r in self.ranges().items()})

    # -- the answer ------------------------------------------------------------------------------
    def verdict(self, limits: Limits) -> Verdict:
        """How the run would have ended under *limits* (run-wide ceilings)."""
        if not isinstance(limits, Limits):
            raise ConfigError(f"verdict() takes nb.Limits, not {type(limits).__name__}")
        if not self.exact:
            return self._from_totals(limits)
        cut = self._first_cut(limits.to_dict())
        if cut is not None and cut[0] <= self.end_index:
            index, kind, t_ms = cut
            status = "cut" if kind == _TIME else "refused"
            return self._ended(status, limits, index, kind, t_ms, as_recorded=False)
        return self._as_recorded(limits)

    def _first_cut(self, lim: Mapping[str, float]) -> tuple[int, str, float] | None:
        """The first event the run would not have got past: (its index, the axis, the time)."""
        found: list[tuple[int, int, str, float]] = []
        for name, after in self.used_after.items():
            limit = lim.get(name)
            if limit is not None:
                j = int(np.searchsorted(after, limit, side="right"))  # first use over it
                if j < len(after):
                    i = int(self.at[name][j])
                    found.append((i, 0, name, float(self.t[i])))
        limit_ms = lim.get(_TIME)
        if limit_ms is not None:
            grant = limit_ms - self.time_base  # on this trace's clock
            i = int(np.searchsorted(self.latest, grant, side="right"))  # first event after it
            if i < self.n or self.used[_TIME] > limit_ms:
                found.append((i, 1, _TIME, max(grant, 0.0)))
        if not found:
            return None
        index, _, kind, t_ms = min(found)  # at one charge, its own axis before time (S3-3)
        return index, kind, t_ms

    def _as_recorded(self, limits: Limits) -> Verdict:
        """No cut before the recorded end: the run ends as recorded, unless the limits would let
        it past the refusal or time cut that ended it."""
        status = str(self.recorded.get("status") or "running")
        end = self.end_index
        if status == "completed" or not self.recorded:
            return self._ended("completed", limits, None, None, None, as_recorded=True)
        event = self.events[end] if end < self.n else None
        payload = (self.payloads[end] or {}) if end < self.n else {}
        kind = payload.get("budget_kind")
        if event == _REFUSED and kind in KIND_INDEX:
            limit = getattr(limits, kind)
            wanted = float(payload.get("consumed_value", 0)) + float(self.amount[end])
            if limit is None or wanted <= limit:
                return self._ended("beyond", limits, end, kind, float(self.t[end]),
                                   as_recorded=False)
            return self._ended("refused", limits, end, kind, float(self.t[end]),
                               as_recorded=True)
        if event == "cut" and kind == _TIME:
            limit = limits.run_ms
            if limit is None or limit > float(payload.get("limit_value", 0)):
                return self._ended("beyond", limits, end, _TIME, float(self.t[end]),
                                   as_recorded=False)
            return self._ended("cut", limits, end, _TIME, float(self.t[end]), as_recorded=True)
        by = str(self.recorded.get("by") or self.recorded.get("cause") or payload.get("by")
                 or status)
        return self._ended("stopped", limits, end, by, float(self.t[end]) if end < self.n
                           else self.end_ms, as_recorded=True)

    def _ended(self, status: str, limits: Limits, index: int | None, kind: str | None,
               t_ms: float | None, *, as_recorded: bool) -> Verdict:
        cut = self.n if index is None else index
        kept, lost = self._split(cut)
        done = cut / self.n if self.n else 1.0
        done_time = 1.0 if t_ms is None or not self.end_ms else min(1.0, t_ms / self.end_ms)
        v = Verdict(status, limits, index, kind, t_ms, as_recorded, done, done_time, kept, lost,
                    ())
        return v._replace(lines=tuple(self._lines(v)))

    def _split(self, cut: int) -> tuple[dict[str, float], dict[str, float]]:
        """What was recorded before event *cut* and from it on: how many checkpoints and tool
        outputs, and how much of each charged axis."""
        kept: dict[str, float] = {}
        lost: dict[str, float] = {}
        for what, at in self.marks.items():
            kept[what] = int(np.count_nonzero(at < cut))
            lost[what] = len(at) - kept[what]
        for name, at in self.at.items():
            before = int(np.searchsorted(at, cut))
            kept[name] = _plain(float(self.amount[at[:before]].sum()))
            lost[name] = _plain(float(self.amount[at[before:]].sum()))
        return kept, lost

    def _from_totals(self, limits: Limits) -> Verdict:
        """A trace recorded without ``trace="full"``: which limits its totals pass, not where."""
        over = [(name, value) for name, value in limits.to_dict().items()
                if self.used.get(name, 0) > value]
        empty: dict[str, float] = {}
        if not over:
            done = self._as_recorded(limits)
            note = "(from the run's totals: record with trace=\"full\" to replay charge by charge)"
            return done._replace(lines=(*done.lines[:1], note))
        name, value = min(over, key=lambda nv: KINDS[KIND_INDEX[nv[0]]].rank)
        lines = (f"Refused by {_axis(name)}: the run used {_amount(name, self.used[name])}, "
                 f"over the limit of {_amount(name, value)}; where, a trace of counts cannot "
                 f"say (record with trace=\"full\" to see the event).",)
        return Verdict("refused", limits, None, name, None, False, math.nan, math.nan, empty,
                       empty, lines)

    # -- the text --------------------------------------------------------------------------------
    def _lines(self, v: Verdict) -> list[str]:
        of = f"{self.n:,}"
        where = "" if v.event is None else self._in_grant(v.event)
        share = (f"after {v.done:.0%} of the recorded events and {v.done_time:.0%} of its time"
                 if v.event is not None else "")
        limits = v.limits
        if v.status == "completed":
            margins = ", ".join(f"{_axis(a)} {_amount(a, self.used[a])} of "
                                f"{_amount(a, getattr(limits, a))}"
                                for a in self.axes if getattr(limits, a) is not None)
            head = "Completed, as recorded" + (f": {margins}." if margins else ".")
            return [head]
        assert v.event is not None and v.kind is not None
        if v.status == "beyond":
            return [f"Gets past where the recorded run ended (event {v.event:,} of {of}, "
                    f"{self._recorded_how()}): under these limits it goes on, and what it "
                    f"would have done next was never recorded."]
        if v.status == "refused":
            head = (f"Refused at event {v.event:,} of {of}{where} by {_axis(v.kind)} "
                    f"(limit {_amount(v.kind, getattr(limits, v.kind))}), at "
                    f"{spoken(v.t_ms or 0.0)}, {share}")
        elif v.status == "cut":
            head = (f"Cut by its time grant ({_amount(_TIME, limits.run_ms or 0)}) before event "
                    f"{v.event:,} of {of}, {share}")
        else:
            status = str(self.recorded.get("status", "stopped")).capitalize()
            head = f"{status} at event {v.event:,} of {of} (by {v.kind})"
        if v.as_recorded and self.recorded.get("status") == "suspended":
            head += (f", where the recorded run was suspended by its {_axis(v.kind)} window: "
                     f"as a whole-run ceiling, the limit ends it there (see: nbbudget explain "
                     f"S3-1).")
        else:
            head += (", as recorded: limits do not change that." if v.status == "stopped" else
                     ", as recorded." if v.as_recorded else ".")
        return [head, "Kept: " + _listed(v.kept, self.exact) + "; done work stays done (see: "
                "nbbudget explain S4-10).",
                "Lost: " + _listed(v.lost, self.exact) + "."]

    def _in_grant(self, index: int) -> str:
        run = self.runs[index] if index < self.n else None
        top = self.runs[0] if self.n else None
        return f" (in grant {run!r})" if run is not None and run != top else ""

    def _recorded_how(self) -> str:
        """How the recorded run ended, in words: ``failed by steps``; a run whose time grant
        ran out ``ran out of time`` (a timeout is ``--timeout``'s, the wall clock's)."""
        how = self.recorded
        by = how.get("by")
        if by == "timeout":
            return "ran out of time"
        return f"{how.get('status')}" + (f" by {by}" if by else "")


class Explorer:
    """The what-if explorer of a recorded run (`Trace.explore`): one slider per axis the run
    used, how the run would have ended under the sliders' limits, and the plot. See the module
    docstring; ``widgets=False`` (or a place without ipywidgets) gives the text alone,
    ``plot=False`` no plot.

    Headless: ``verdict`` (a `Verdict`; ``str()`` is its text), ``limits`` (the sliders'
    `nb.Limits`), ``sliders`` (axis to its ipywidgets slider), ``set(**limits)`` to move
    sliders from code (one redraw), ``draws`` (how many times the plot was drawn), ``drawn``
    (the limits it was last drawn for), ``png`` (that drawing) and ``widget`` (the box).
    """

    def __init__(self, trace: Recorded, *, widgets: bool = True, plot: bool = True,
                 interval_ms: float = 150) -> None:
        self.model = WhatIf(trace)
        self.interval = max(float(interval_ms), 0.0) / 1000
        self.limits = self.model.start()
        self.verdict = self.model.verdict(self.limits)
        self.sliders: dict[str, Any] = {}
        self.draws = 0
        self.drawn: Limits | None = None
        self.fallback: str | None = None  # why there are no widgets, when there are none
        self._last_draw = -math.inf
        self._pending: asyncio.TimerHandle | None = None
        self._quiet = False  # set() moves sliders without redrawing for each
        self._view: _View | None = None
        if widgets:
            try:
                self._view = _View(self, plot)
            except Exception as exc:  # noqa: BLE001  (no widgets here, or broken: text stands in)
                self.fallback = f"{type(exc).__name__}: {exc}"
        else:
            self.fallback = "widgets=False"
        if self._view is not None:
            self._draw()

    @property
    def widget(self) -> Any:
        """The ipywidgets box shown in a notebook (its sliders, its verdict, its plot), or None
        where there are no widgets."""
        return self._view.box if self._view is not None else None

    @property
    def png(self) -> bytes | None:
        """The plot as last drawn (a PNG), or None without widgets or matplotlib."""
        view = self._view
        if view is None or view.image is None or not view.image.value:
            return None
        return bytes(view.image.value)

    @property
    def text(self) -> str:
        """The verdict as text: what shows where widgets cannot render."""
        return f"What if ({_shown_limits(self.limits)}):\n{self.verdict.text}"

    def set(self, **values: float) -> Verdict:
        """Move the sliders of the axes named to *values* (e.g. ``set(steps=5)``; a slider's range
        grows to take a value past it) and redraw once; the new verdict. An axis the run did not
        use is a `ConfigError` naming it, a bad value one naming the value (S3-4)."""
        ranges = self.model.ranges()
        for name in values:
            if name not in ranges:
                raise ConfigError(f"the run used no {name!r} to explore; its axes are: "
                                  f"{', '.join(ranges) or 'none'}")
        limits = _limits({**self.limits.to_dict(), **values})  # checked as nb.Limits checks
        if self._view is not None:
            self._quiet = True
            try:
                with contextlib.ExitStack() as held:  # each slider's changes sent at once
                    for name, value in limits.to_dict().items():
                        slider = self.sliders[name]
                        held.enter_context(slider.hold_sync())
                        slider.max = max(slider.max, value)  # a slider would clamp the value
                        slider.min = min(slider.min, value)
                        slider.value = value
            finally:
                self._quiet = False
            limits = self._slider_limits()
        self._update(limits, force=True)
        return self.verdict

    # -- the view's side -------------------------------------------------------------------------
    def _slider_limits(self) -> Limits:
        return _limits({name: s.value for name, s in self.sliders.items()})

    def _moved(self, change: Any) -> None:
        """A slider moved (from the front end, or from code)."""
        if not self._quiet:
            self._update(self._slider_limits(), force=False)

    def _update(self, limits: Limits, *, force: bool) -> None:
        """New limits: the verdict at once; the plot now, or once the interval since the last
        drawing has passed (one timer for a whole drag, which draws the latest limits)."""
        self.limits = limits
        self.verdict = self.model.verdict(limits)
        if self._view is None:
            return
        self._view.show_verdict(self.verdict)
        if self._pending is not None and not force:
            return  # the timer will draw these limits
        wait = self._last_draw + self.interval - time.monotonic()
        loop = _running_loop()
        if force or wait <= 0 or loop is None:
            self._draw()
        else:
            self._pending = loop.call_later(wait, self._draw)

    def _draw(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._view is None:
            return
        self._last_draw = time.monotonic()
        try:
            self._view.draw(self.limits, self.verdict)
        except Exception as exc:  # noqa: BLE001  (a plot that fails never breaks the cell)
            self._view.show_error(exc)
        self.draws += 1
        self.drawn = self.limits

    def mimebundle(self) -> dict[str, Any]:
        """What the explorer displays: its text (``text/plain``, where widgets cannot render)
        and, with widgets, the view of its widget."""
        bundle: dict[str, Any] = {"text/plain": self.text}
        if self._view is not None:
            bundle[_WIDGET_VIEW] = {"version_major": 2, "version_minor": 0,
                                    "model_id": self._view.box.model_id}
        return bundle

    def _ipython_display_(self) -> None:
        from IPython.display import display  # only IPython calls this: it is there

        display(self.mimebundle(), raw=True)  # type: ignore[no-untyped-call]  # IPython's: untyped

    def __repr__(self) -> str:
        return self.text


class _View:
    """The stock ipywidgets the explorer is built from, and its plot."""

    def __init__(self, explorer: Explorer, plot: bool) -> None:
        import ipywidgets as w

        model = explorer.model
        for name, r in model.ranges().items():
            integral = KINDS[KIND_INDEX[name]].integral
            make = w.IntSlider if integral else w.FloatSlider
            start = getattr(explorer.limits, name)
            slider = make(value=start, min=r.low, max=r.high, step=r.step,
                          description="time (ms)" if name == _TIME else name,
                          continuous_update=True,
                          style={"description_width": "initial"},
                          layout=w.Layout(width="32em"),
                          **({} if integral else {"readout_format": ".4f"}))
            slider.observe(explorer._moved, names="value")
            explorer.sliders[name] = slider
        self.verdict = w.HTML()
        self.plot: _Plot | None = None
        self.image: Any = None
        parts = [*explorer.sliders.values(), self.verdict]
        if plot and _has_matplotlib():
            self.plot = _Plot(model)
            self.image = w.Image(format="png", layout=w.Layout(width="640px"))
            parts.append(self.image)
        self.box = w.VBox(parts)
        self.show_verdict(explorer.verdict)

    def show_verdict(self, verdict: Verdict) -> None:
        first, *rest = verdict.lines
        self.verdict.value = "<br>".join([f"<b>{html.escape(first)}</b>",
                                          *map(html.escape, rest)])

    def show_error(self, exc: Exception) -> None:
        self.verdict.value += f"<br><i>the plot failed: {html.escape(repr(exc))}</i>"

    def draw(self, limits: Limits, verdict: Verdict) -> None:
        if self.plot is not None:
            self.image.value = self.plot.render(limits, verdict)


class _Plot:
    """The run's use of each axis as a fraction of its would-be limit, drawn once; each move
    only changes the lines' heights, the cut's marks and the legend, then renders a PNG."""

    def __init__(self, model: WhatIf) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle

        self.model = model
        # fixed margins: a layout engine would lay the figure out again at each drawing
        self.figure = Figure(figsize=(8, 3.4), dpi=80)
        self.figure.subplots_adjust(left=0.08, right=0.98, bottom=0.14, top=0.92)
        FigureCanvasAgg(self.figure)
        ax = self.ax = self.figure.add_subplot()
        end = model.end_ms or 1.0
        self.series: dict[str, tuple[Any, Any]] = {}  # axis -> (its line, its use at each x)
        for name in model.axes:
            if name == _TIME:
                x = np.array([0.0, end])
                used = model.time_base + x
            elif name in model.used_after:
                at = model.at[name]
                keep = _thinned(len(at))
                x = np.concatenate(([0.0], model.t[at][keep], [end]))
                after = model.used_after[name][keep]
                used = np.concatenate(([after[0] - model.amount[at[0]]], after, [after[-1]]))
            else:  # a trace of counts: its total, at the end
                x, used = np.array([0.0, end]), np.array([0.0, model.used[name]])
            if name == _TIME:  # the clock runs on: a slope, not steps
                (line,) = ax.plot(x, used)
            else:
                (line,) = ax.step(x, used, where="post")
            self.series[name] = (line, used)
        ax.axhline(1.0, color="black", linewidth=0.8)
        for fraction in model.trace.notices:  # the approach notices' thresholds (S3-5)
            ax.axhline(fraction, color="orange", linewidth=0.8, linestyle=":")
        if model.end_index < model.n and model.recorded.get("status") != "completed":
            ax.axvline(float(model.t[model.end_index]), color="grey", linestyle=":",
                       linewidth=1, label=f"recorded end ({model._recorded_how()})")
        self.cut = ax.axvline(0.0, color="red", linestyle="--", linewidth=1, visible=False)
        (self.mark,) = ax.plot([], [], "x", color="red", markersize=9, zorder=3)
        # the time after the cut: a rectangle the full height of the axes (axvspan gives a
        # Polygon before matplotlib 3.9, which cannot be moved with set_x)
        self.lost = Rectangle((end, 0.0), 0.0, 1.0, transform=ax.get_xaxis_transform(),
                              color="grey", alpha=0.15, visible=False)
        ax.add_patch(self.lost)
        ax.set_xlim(0.0, end * 1.02)
        ax.set_xlabel("t (ms)")
        ax.set_ylabel("used / would-be limit")

    def render(self, limits: Limits, verdict: Verdict) -> bytes:
        ax, model = self.ax, self.model
        top = 1.1
        for name, (line, used) in self.series.items():
            limit = getattr(limits, name)
            if limit is None:
                line.set_visible(False)
                continue
            line.set_visible(True)
            line.set_ydata(used / limit)
            line.set_label(f"{_axis(name)} (limit {_amount(name, limit)})")
            top = max(top, float(used[-1]) / limit * 1.05)
        cut_at = verdict.t_ms if verdict.status in ("refused", "cut") else None
        self.cut.set_visible(cut_at is not None)
        self.lost.set_visible(cut_at is not None)
        if cut_at is not None and verdict.kind is not None:
            self.cut.set_xdata([cut_at, cut_at])
            self.cut.set_label(f"{verdict.status} ({_axis(verdict.kind)})")
            self.lost.set_x(cut_at)
            self.lost.set_width(max(model.end_ms - cut_at, 0.0))
            self.lost.set_label("lost")
            self.mark.set_data([cut_at], [1.0])
        else:
            self.mark.set_data([], [])
        ax.set_ylim(0.0, min(top, 3.0))
        ax.set_title(_title(verdict), fontsize="small")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize="small")
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        return buffer.getvalue()


# -- helpers ------------------------------------------------------------------------------------
def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread (a kernel's), or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _thinned(n: int) -> Any:
    """At most `_MAX_POINTS` positions of *n*, the first and last among them."""
    if n <= _MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, _MAX_POINTS).astype(np.int64))


def _limits(values: Mapping[str, float]) -> Limits:
    """`nb.Limits` of slider values: whole numbers where the axis takes them."""
    fields: dict[str, Any] = {name: round(v) if KINDS[KIND_INDEX[name]].integral else float(v)
                              for name, v in values.items()}
    return Limits(**fields)


def _plain(x: float) -> float:
    """*x* as a whole number when it is one (``3``, not ``3.0``), else to a millionth."""
    return int(x) if float(x).is_integer() else round(x, 6)


def _round_step(x: float) -> float:
    """*x* rounded up to 1, 2 or 5 times a power of ten (at least a millionth of a dollar)."""
    x = max(x, 1e-6)
    power = 10.0 ** math.floor(math.log10(x))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= x * (1 - 1e-9))


def _axis(name: str) -> str:
    """An axis as the explorer names it: the time grant as ``time``, the others by kind."""
    return "time" if name == _TIME else name


def _amount(name: str, x: float) -> str:
    if name == _TIME:
        return spoken(x)
    if name == "cost_usd":
        return f"${x:g}"
    return f"{x:g}"


def _shown_limits(limits: Limits) -> str:
    return ", ".join(f"{_axis(k)} {_amount(k, v)}" for k, v in limits.to_dict().items()) or (
        "no limits")


def _title(v: Verdict) -> str:
    """The verdict in a few words, over the plot."""
    if v.status == "completed":
        return "completed"
    assert v.kind is not None
    if v.status == "cut":
        return f"cut by time at {spoken(v.t_ms or 0.0)}, before event {v.event:,}"
    if v.status == "beyond":
        return f"past the end of the recording (event {v.event:,})"
    return f"{v.status} at event {v.event:,} by {_axis(v.kind)}"


def _counted(name: str, n: float) -> str:
    """What *n* of axis *name* are: ``1 step``, ``6 steps``, ``$0.01 of cost``."""
    if name == "cost_usd":
        return "of cost"
    return name[:-1] if n == 1 and name.endswith("s") else name


def _listed(counts: Mapping[str, float], exact: bool) -> str:
    parts = []
    for what in ("checkpoints", "tool outputs"):
        n = counts.get(what, 0)
        if n:
            parts.append(f"{n} {what[:-1] if n == 1 else what}")
    parts += [f"{_amount(k, v)} {_counted(k, v)}" for k, v in counts.items()
              if k in KIND_INDEX and v]
    return "; ".join(parts) or "nothing"
