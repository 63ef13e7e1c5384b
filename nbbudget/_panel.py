"""The live panel of a ``%%budget`` cell (N-3): one bar per armed axis, the clocks, the state, a
Stop and a Pause button; a text summary where widgets cannot render.

The core owns the state; the panel is a view. It is displayed once, on the main thread, then only
its traits change, from one updater thread that reads the run's frozen `Snapshot` at most ten
times a second and writes every change inside ``hold_sync()``. Workers never touch a widget, and
the buttons only set events. A widget that fails to build or update never breaks the cell: the
panel falls back to text.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import threading
import time
from typing import Any

from ._budget import Budget, Snapshot
from ._limits import Limits

__all__ = ["Panel", "summary"]

_names = itertools.count(1)
_STYLE = {0: "info", 1: "warning", 2: "danger"}
_OUTCOME_STYLE = {"completed": "success", "incomplete": "info", "suspended": "info"}


def summary(snap: Snapshot) -> str:
    """The panel in one line of text (its ``text/plain``)."""
    axes = ", ".join(f"{a.kind} {_num(a.consumed)}/{_num(a.limit)}" for a in snap.axes)
    state = snap.outcome.status.value if snap.outcome is not None else snap.status
    if snap.outcome is not None and snap.outcome.by:
        state += f" (by {snap.outcome.by})"
    clock = f", {snap.elapsed_ms / 1000:.1f} s"
    return f"nbbudget {snap.name}: {state}{clock}" + (f"; {axes}" if axes else "")


class Panel:
    """The view of one cell's run. `attach` gives it the run once the work starts."""

    def __init__(self, limits: Limits, *, widgets: bool, interval_ms: int = 100,
                 pausable: bool = False) -> None:
        self.limits = limits
        self.interval = max(interval_ms, 100) / 1000  # at most ten redraws a second
        self.run: Budget | None = None
        self.call: Any = None
        self.cpu_seconds: float | None = None
        self.stop_requested = threading.Event()
        self.pause_requested = threading.Event()
        self._attached = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None
        self._view: Any = None
        if widgets:
            try:
                self._view = _View(limits, self, pausable)
            except Exception:  # no widgets here (or broken): the text stands in
                self._view = None

    @property
    def live(self) -> bool:
        """Whether there are widgets to show and keep up to date."""
        return self._view is not None

    # -- the main thread ------------------------------------------------------------------------
    def show(self) -> None:
        """Display the panel once, under the cell that is running."""
        from IPython.display import display

        self._handle = display(self._bundle(None), raw=True, display_id=True)

    def start(self) -> None:
        """Start the updater thread; it ends once the run has ended and the panel shows it."""
        self._thread = threading.Thread(target=self._update_loop, daemon=True,
                                        name=f"nbbudget-panel-{next(_names)}")
        self._thread.start()

    def attach(self, run: Budget, call: Any = None) -> None:
        """Called by the work as it starts (on whichever thread runs it), with its run and, for
        a call, the call (so that Pause can ask it to stop at its next checkpoint)."""
        self.run = run
        self.call = call
        self._attached.set()

    def close(self) -> None:
        """The cell is done with the panel: stop waiting for a run that never started."""
        self._attached.set()
        self._done.set()

    # -- the updater thread -----------------------------------------------------------------------
    def _update_loop(self) -> None:
        self._attached.wait()
        run = self.run
        if run is None:
            return
        while True:
            if self.stop_requested.is_set():
                run.cancel("stopped from the panel")
                self.stop_requested.clear()
            if self.pause_requested.is_set() and self.call is not None:
                self.call.budget_out = True  # a resumable cell pauses at its next checkpoint
                self.pause_requested.clear()
            finished = run.outcome is not None
            self._draw(run.snapshot())
            if finished:
                self._final(run.snapshot())
                self.cpu_seconds = time.thread_time()  # what the updater cost, for benchmarks
                return
            self._done.wait(self.interval)

    def _draw(self, snap: Snapshot) -> None:
        if self._view is not None:
            try:
                self._view.update(snap)
            except Exception:  # a widget failure never breaks the cell
                self._view = None

    def _final(self, snap: Snapshot) -> None:
        job = getattr(self.call, "job", None)
        if self._view is not None and job is not None and job.detached:
            try:  # a front end that renders the widget does not show the text below
                self._view.show_late(_late_result(job))
            except Exception:  # a widget failure never breaks the cell
                self._view = None
        if self._handle is not None:
            with contextlib.suppress(Exception):  # the kernel may have gone: no one to show
                self._handle.update(self._bundle(snap), raw=True)

    def _bundle(self, snap: Snapshot | None) -> dict[str, Any]:
        text = summary(snap) if snap is not None else (
            "nbbudget: starting; limits " + (repr(self.limits) if self.limits else "none"))
        job = getattr(self.call, "job", None)
        if snap is not None and job is not None and job.detached:
            text += _late_result(job)  # the cell's caller has gone: its result shows here
        bundle: dict[str, Any] = {"text/plain": text}
        if self._view is not None:
            bundle.update(self._view.mimebundle())
        return bundle

    @property
    def text(self) -> str:
        """The panel as text, now."""
        snap = self.run.snapshot() if self.run is not None else None
        return str(self._bundle(snap)["text/plain"])


class _View:
    """The stock ipywidgets the panel is built from."""

    def __init__(self, limits: Limits, panel: Panel, pausable: bool) -> None:
        import ipywidgets as w

        self.bars: dict[str, Any] = {}
        self.labels: dict[str, Any] = {}
        rows = []
        for kind, limit in limits.to_dict().items():
            bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, description=kind,
                                  bar_style="info")
            label = w.Label(value=f"0 / {_num(limit)}")
            self.bars[kind], self.labels[kind] = bar, label
            rows.append(w.HBox([bar, label]))
        self.status = w.HTML(value="<b>starting</b>")
        self.stop = w.Button(description="Stop", button_style="danger", icon="stop")
        self.stop.on_click(lambda _: panel.stop_requested.set())
        buttons = [self.stop]
        if pausable:
            self.pause = w.Button(description="Pause", icon="pause")
            self.pause.on_click(lambda _: panel.pause_requested.set())
            buttons.append(self.pause)
        self.box = w.VBox([*rows, w.HBox([self.status, *buttons])])

    def update(self, snap: Snapshot) -> None:
        with self.box.hold_sync():
            style = _STYLE[snap.notice_level]
            for axis in snap.axes:
                bar = self.bars.get(axis.kind)
                if bar is None:
                    continue
                bar.value = min(1.0, axis.fraction)
                bar.bar_style = style
                self.labels[axis.kind].value = f"{_num(axis.consumed)} / {_num(axis.limit)}"
            if snap.outcome is not None:
                end = _OUTCOME_STYLE.get(snap.outcome.status.value, "danger")
                for bar in self.bars.values():
                    bar.bar_style = end
                self.stop.disabled = True
            self.status.value = f"<b>{summary(snap)}</b>"

    def show_late(self, text: str) -> None:
        """What a detached cell ended with (its result or error), under its final state."""
        if text.strip():
            lines = (html.escape(line) for line in text.strip().splitlines())
            self.status.value += "<br>" + "<br>".join(lines)

    def mimebundle(self) -> dict[str, Any]:
        bundle = self.box._repr_mimebundle_()
        bundle.pop("text/plain", None)
        return dict(bundle)


def _late_result(job: Any) -> str:
    """What a detached cell ended with, for its panel (the job may still be settling)."""
    if not job.wait_done(1.0):
        return ""
    error = job.exception()
    if error is not None:
        return f"\n{type(error).__name__}: {error}"
    value = job.result()
    if value is None:
        return ""
    text = repr(value)
    return f"\nresult: {text if len(text) <= 200 else text[:197] + '...'}"


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)
