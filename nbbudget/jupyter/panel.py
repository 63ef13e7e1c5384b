"""The live panel of a ``%%budget`` cell (N-3): one bar per armed axis, the clocks, the state, a
Stop and a Pause button; a text summary where widgets cannot render.

The core owns the state; the panel is a view. Under its cell it names neither the cell nor the
figures its bars show: its line says the state and the time (``running, 1.8 s``); the text that
stands in for it says all of that (`summary`). Under the bars, once the run has called a model,
are its details: a row per provider and model, with the calls, tokens and cost
(``run.usage(by="model")``), the first `MODELS_SHOWN` of them; the text says them a line each.
It is displayed once, on the main thread, then only its traits change, from one updater thread
that reads the run's frozen `Snapshot` at most ten times a second and writes every change inside
``hold_sync()``. Workers never touch a widget, and the buttons only set events: a click may be
handled on a kernel subshell's thread, which is how it reaches the run while the cell holds the
main thread (`nbbudget.jupyter.clicks`, whose route the panel's widget messages are sent by).
Where a click would wait for the cell, Stop says to interrupt the kernel until then. A widget
that fails to build or update never breaks the cell: the panel falls back to text.

The state a cell ends in is drawn by the cell itself, on the main thread, before it replies: a
program that saves the notebook (nbclient, papermill) saves what the envelope beside it says.
From then on the updater sends nothing but the later states of a run that goes on (a detached
job), tied to the cell that showed the panel: a front end routes them to that panel, and a
program that has moved on to another cell drops them instead of pasting them over that cell's
output. Where a kernel cannot tie them (ipykernel before 7.1), the panel stays as the cell left
it; its Stop button still works.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.duration import spoken
from ..core.endings import by_in_words
from ..core.errors import Cancelled
from ..core.kinds import KIND_INDEX, KINDS
from ..core.limits import Limits
from ..core.snapshot import ModelUsage, Snapshot
from ..run.budget import Budget, time_only
from .cells import comms_sent_as, pin_output, pins_all_output
from .clicks import OUTSIDE_A_KERNEL, Route

if TYPE_CHECKING:
    from ..calls.jobs import Job

__all__ = ["MODELS_SHOWN", "Panel", "line", "run_summary", "summary"]

_names = itertools.count(1)
_STYLE = {0: "info", 1: "warning", 2: "danger"}
#: the bars of an ended run: red only for a failure; a stop a person asked for is no error
_OUTCOME_STYLE = {"completed": "success", "incomplete": "info", "suspended": "info",
                  "stopped": ""}
NOTHING_RAN = "nbbudget: nothing ran"
#: what Stop says while its cell holds a kernel that would handle the click only after the cell
STOP_WAITS = "interrupt the kernel to stop now"
#: the models the panel's details show at most (``run.usage(by="model")`` has them all)
MODELS_SHOWN = 5
#: the details' columns (`_models_html`)
_MODEL_HEADS = ("provider", "model", "calls", "input tokens", "output tokens", "cost")


def summary(snap: Snapshot, state: str | None = None) -> str:
    """The panel in text (its ``text/plain``): a line with the run's name, its `line` and each
    axis, then its details, a line per model it called (`_model_lines`); *state* in place of
    the run's own (how an INCOMPLETE cell left it: ``running in the background as job
    1a2b-3``)."""
    text = f"nbbudget {snap.name}: {line(snap, state)}"
    if snap.axes:  # none: a run with no limits (what the magic prints after such a cell)
        text += "; " + ", ".join(
            f"{_axis(a.kind)} {_amount(a.kind, a.consumed)}/{_amount(a.kind, a.limit)}"
            for a in snap.axes)
    return "\n".join([text, *_model_lines(snap.models)])


def _model_lines(models: tuple[ModelUsage, ...]) -> list[str]:
    """A run's models as the panel's text says them, the first `MODELS_SHOWN`, a line each
    (``  openai gpt-4o: 2 calls, 1,240 tokens in, 310 out, $0.0062``), then how many more;
    ``%budget status`` shows the whole table."""
    lines = [f"  {m.provider} {m.model}: {m.calls:,} call{'s' if m.calls != 1 else ''}, "
             f"{m.input_tokens:,} tokens in, {m.output_tokens:,} out, {_cost(m.cost_usd)}"
             for m in models[:MODELS_SHOWN]]
    more = len(models) - MODELS_SHOWN
    if more > 0:
        lines.append(f"  and {more} more model{'s' if more != 1 else ''}: "
                     f"run.usage(by='model') has them all")
    return lines


def _cost(cost: float | None) -> str:
    """Dollars as the panel's details say them: ``$0.0062``; ``no price`` when none is known."""
    return "no price" if cost is None else f"${cost:.4g}"


def run_summary(run: Budget) -> str:
    """`summary` of *run*'s snapshot now, as the magic prints it under a cell shown without a
    panel: a run that spent nothing but time and has no limits (`time_only`) is said from its
    status and time, without a snapshot (which cost a fifth of what the magic added to a cell
    that does nothing, bench_magic.py)."""
    shown = time_only(run)
    if shown is None:
        return summary(run.snapshot())
    status, elapsed_ms = shown
    return f"nbbudget {run.name}: {_line(status, elapsed_ms)}"


def line(snap: Snapshot, state: str | None = None) -> str:
    """The panel's own line, under its cell and beside its bars: the state and the time
    (``failed (out of time), 0.5 s``); *state* as in `summary`."""
    return _line(state or _state(snap), snap.elapsed_ms)


def _line(state: str, elapsed_ms: float) -> str:
    return f"{state}, {elapsed_ms / 1000:.1f} s"


def _state(snap: Snapshot) -> str:
    """The run's state as a person reads it: its status, and what cut it where a limit did
    (``failed (out of time)`` for its time grant, ``failed (by steps)``)."""
    state = snap.status  # the outcome's, once there is one
    if snap.outcome is not None and snap.outcome.by:
        state += f" ({by_in_words(snap.outcome.by)})"
    return state


class Panel:
    """The view of one cell's run. `attach` gives it the run once the work starts; `end_cell`
    draws the state the cell ends in."""

    def __init__(self, limits: Limits, *, widgets: bool, interval_ms: int = 100,
                 pausable: bool = False, shell: Any = None,
                 route: Route = OUTSIDE_A_KERNEL) -> None:
        self.limits = limits
        self.interval = max(interval_ms, 100) / 1000  # at most ten redraws a second
        self.shell = shell
        self.run: Budget | None = None
        self.call: Any = None
        self.cpu_seconds: float | None = None
        self.stop_requested = threading.Event()
        self.pause_requested = threading.Event()
        self._attached = threading.Event()
        self._done = threading.Event()  # the final state is shown: nothing more to send
        self._lock = threading.Lock()  # one writer at a time: the updater or the cell
        self._cell_over = False
        self._late_from = 0.0  # when a detached job's panel may send again (time.monotonic)
        self._state: str | None = None  # how the cell left a run that is not over
        self._job: Job | None = None
        self._job_ended: Callable[[Job], None] | None = None
        self._late_sends = shell is None or pins_all_output(shell)
        self._thread: threading.Thread | None = None
        self._handle: Any = None
        self._text = "nbbudget: starting; limits " + (repr(limits) if limits else "none")
        self._route = route  # where the widgets' clicks are handled (`clicks`)
        self._view: Any = None
        if widgets:
            try:
                with comms_sent_as(shell, route.parent):
                    self._view = _View(limits, self, pausable, clicks_wait=not route.during_cell)
            except Exception:  # noqa: BLE001  (no widgets here, or broken: the text stands in)
                self._view = None

    @property
    def live(self) -> bool:
        """Whether there are widgets to show and keep up to date."""
        return self._view is not None

    @property
    def text(self) -> str:
        """The panel's ``text/plain``, as last shown."""
        return self._text

    # -- the main thread ------------------------------------------------------------------------
    def show(self) -> None:
        """Display the panel once, under the cell that is running."""
        from IPython.display import display

        self._handle = display(self._bundle(), raw=True, display_id=True)

    def start(self) -> None:
        """Start the updater thread, its output tied to the cell running now; it ends once the
        run has ended and the panel shows it."""
        loop = self._update_loop if self.shell is None else pin_output(self.shell,
                                                                       self._update_loop)
        self._thread = threading.Thread(target=loop, daemon=True,
                                        name=f"nbbudget-panel-{next(_names)}")
        self._thread.start()

    def attach(self, run: Budget, call: Any = None) -> None:
        """Called by the work as it starts (on whichever thread runs it), with its run and, for
        a call, the call (so that Pause can ask it to stop at its next checkpoint)."""
        with self._lock:
            self.run = run
            self.call = call
        self._attached.set()

    def end_cell(self, run: Budget | None = None, *, job: Job | None = None,
                 state: str | None = None) -> None:
        """The cell is about to reply: draw the state it ends in, here, before the reply. *run*
        (or *job*'s run) is the cell's run when the work never attached it (a call that
        reattached to a running job); *state* names how an INCOMPLETE cell left it. A run that
        goes on (a detached job) is left to the updater. Only the first call counts."""
        with self._lock:
            if self._cell_over:
                return
            self._cell_over = True
            # a driver listens to the cell until its idle status, just after the reply: the
            # job's next state waits one redraw, so that no driver saves it as the cell's own
            self._late_from = time.monotonic() + self.interval
            self.run = self.run or run or (job.run if job is not None else None)
            self._job, self._state = job, state
            ran = self.run
            if ran is None or ran.outcome is not None:
                self._done.set()
            self._show(ran.snapshot() if ran is not None else None, state)
        self._attached.set()

    def when_job_ends(self, then: Callable[[Job], None]) -> None:
        """Call *then* with the cell's detached job once the panel shows how it ended: on the
        updater thread, as late output tied to the cell (at once if it has shown it already;
        never where the kernel cannot tie late output to its cell)."""
        with self._lock:
            job = self._job
            if not self._late_sends or job is None:
                return
            if not (self._done.is_set() and job.done()):
                self._job_ended = then
                return
        then(job)

    # -- the updater thread -----------------------------------------------------------------------
    def _update_loop(self) -> None:
        self._attached.wait()
        run = self.run
        if run is None:
            return
        while self._tick(run):
            self._done.wait(self.interval)
        self.cpu_seconds = time.thread_time()  # what the updater cost, for benchmarks

    def _tick(self, run: Budget) -> bool:
        """Act on the buttons, then redraw; whether there is more to draw."""
        self._obey_buttons(run)
        with self._lock:
            if self._done.is_set():
                return False
            if not self._cell_over:  # the cell holds its caller: the panel follows the run
                snap = run.snapshot()
                self._draw(snap, line(snap) + _waiting(run))
                return True
            if time.monotonic() < self._late_from:  # its driver may still be listening
                return True
            if run.outcome is None:  # a detached job goes on after its cell
                if self._late_sends:
                    snap = run.snapshot()
                    self._draw(snap, line(snap, self._state))
                return True
            self._done.set()
            if self._late_sends:
                late = _late_result(self._job)  # waits for the job to settle
                snap = run.snapshot()
                self._show(snap, _settled(self._job, snap), late)
                if self._job_ended is not None and self._job is not None:
                    self._job_ended(self._job)
            return False

    def _obey_buttons(self, run: Budget) -> None:
        if self.stop_requested.is_set():
            run.cancel("stopped from the panel")
            self.stop_requested.clear()
        if self.pause_requested.is_set() and self.call is not None:
            self.call.job.pause()  # a resumable cell pauses at its next checkpoint
            self.pause_requested.clear()

    # -- drawing (under the lock) ---------------------------------------------------------------
    def _draw(self, snap: Snapshot | None, text: str) -> None:
        """The widgets only (the live view): *snap* (none: nothing ran), its line *text*."""
        if self._view is not None:
            try:
                with comms_sent_as(self.shell, self._route.parent):
                    self._view.update(snap, text, cell_over=self._cell_over)
            except Exception:  # noqa: BLE001  (a widget failure never breaks the cell)
                self._view = None

    def _show(self, snap: Snapshot | None, state: str | None, late: str = "") -> None:
        """The widgets and the text: the state a cell ends in, or a detached job's last."""
        self._text = (summary(snap, state) if snap is not None else NOTHING_RAN) + late
        self._draw(snap, (line(snap, state) if snap is not None else NOTHING_RAN) + late)
        if self._handle is not None:
            with contextlib.suppress(Exception):  # the kernel may have gone: no one to show
                self._handle.update(self._bundle(), raw=True)

    def _bundle(self) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": self._text}
        if self._view is not None:
            bundle.update(self._view.mimebundle())
        return bundle


class _View:
    """The stock ipywidgets the panel is built from."""

    def __init__(self, limits: Limits, panel: Panel, pausable: bool, clicks_wait: bool) -> None:
        """*clicks_wait*: the kernel handles a click only after the cell: while the cell holds
        it, Stop says to interrupt the kernel instead, and there is no Pause."""
        import ipywidgets as w

        self.bars: dict[str, Any] = {}
        self.labels: dict[str, Any] = {}
        rows = []
        armed = limits.to_dict()
        # every axis's name whole, the bars aligned: the names' column as wide as the longest
        named = {"description_width": f"{max(map(len, map(_axis, armed)), default=0) + 2}ch"}
        for kind, limit in armed.items():
            bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, description=_axis(kind),
                                  bar_style="info", style=named)
            label = w.Label(value=_used_of(kind, 0, limit))
            self.bars[kind], self.labels[kind] = bar, label
            rows.append(w.HBox([bar, label]))
        self.status = w.HTML(value="<b>starting</b>")
        if clicks_wait:  # a click would be handled after the cell: say what stops it now
            self.stop = w.Button(description=STOP_WAITS, disabled=True, button_style="danger",
                                 icon="stop", layout=w.Layout(width="auto"))
        else:
            self.stop = w.Button(description="Stop", button_style="danger", icon="stop")
        self.stop.on_click(lambda _: panel.stop_requested.set())  # on any thread: only a flag
        self.waiting = clicks_wait
        self.buttons = [self.stop]
        if pausable and not clicks_wait:
            self.pause = w.Button(description="Pause", icon="pause")
            self.pause.on_click(lambda _: panel.pause_requested.set())
            self.buttons.append(self.pause)
        self.row = w.HBox([self.status, *self.buttons])
        # the details: the models the run called (`_models_html`), hidden until it calls one
        # (an empty HTML widget still takes a line)
        self.models = w.HTML(value="", layout=w.Layout(display="none"))
        self.shown_models: tuple[ModelUsage, ...] = ()
        self.box = w.VBox([*rows, self.row, self.models])  # the details under the status

    def update(self, snap: Snapshot | None, text: str, *, cell_over: bool) -> None:
        """Show *snap* (none: nothing ran) under the text *text*; an ended run has nothing left
        to stop or pause, so its buttons go. Once the cell is over, a click reaches the panel
        on every kernel: Stop stops a run that goes on (a detached job)."""
        with self.box.hold_sync():
            if cell_over and self.waiting:
                self.waiting = False
                self.stop.description = "Stop"
                self.stop.disabled = False
            if snap is not None:
                self._bars(snap)
                if snap.models != self.shown_models:
                    self.shown_models = snap.models
                    self.models.value = _models_html(snap.models)
                    self.models.layout.display = None  # shown
            first, *rest = text.splitlines()
            self.status.value = "<br>".join([f"<b>{html.escape(first)}</b>",
                                             *map(html.escape, rest)])
            if snap is None or snap.outcome is not None:
                for button in self.buttons:
                    button.disabled = True
                self.row.children = (self.status,)

    def _bars(self, snap: Snapshot) -> None:
        style = _STYLE[snap.notice_level]
        if snap.outcome is not None:
            style = _OUTCOME_STYLE.get(snap.outcome.status.value, "danger")
        for axis in snap.axes:
            bar = self.bars.get(axis.kind)
            if bar is not None:
                bar.value = min(1.0, axis.fraction)
                bar.bar_style = style
                self.labels[axis.kind].value = _used_of(axis.kind, axis.consumed, axis.limit)

    def mimebundle(self) -> dict[str, Any]:
        bundle = self.box._repr_mimebundle_()
        bundle.pop("text/plain", None)
        return dict(bundle)


def _models_html(models: tuple[ModelUsage, ...]) -> str:
    """The panel's details: a small table of the first `MODELS_SHOWN` *models*, then how many
    more (empty: no model was called)."""
    if not models:
        return ""
    cell = "<td style='padding: 0 0.6em; text-align: {}'>{}</td>".format
    head = "".join(f"<th style='padding: 0 0.6em'>{h}</th>" for h in _MODEL_HEADS)
    rows = "".join(
        "<tr>" + cell("left", html.escape(m.provider)) + cell("left", html.escape(m.model))
        + "".join(cell("right", f"{n:,}") for n in (m.calls, m.input_tokens, m.output_tokens))
        + cell("right", _cost(m.cost_usd)) + "</tr>"
        for m in models[:MODELS_SHOWN])
    more = len(models) - MODELS_SHOWN
    tail = (f"<div>and {more} more: run.usage(by='model') has them all</div>"
            if more > 0 else "")
    return f"<table><tr>{head}</tr>{rows}</table>{tail}"


def _waiting(run: Budget) -> str:
    """N-5, N-7: what a stopped cell waits for when its stop has not landed."""
    waits = run.stop_waits_ms()
    if waits is None:
        return ""
    return (f"; stopping: waiting {waits / 1000:.1f} s for a call into C code to return; "
            f"interrupt the kernel to stop it now")


def _settled(job: Job | None, snap: Snapshot) -> str | None:
    """How a detached job ended, naming the job (``job 1a2b-3 completed``); where its run's
    own status would not say it, that the work finished anyway after a cancel it never
    reached a check to honour."""
    if job is None:
        return None
    if job.cancel_status == "not honoured":
        return f"job {job.id} {job.state.value} (finished anyway: the cancel was not honoured)"
    return f"job {job.id} {_state(snap)}"


def _late_result(job: Job | None) -> str:
    """What a detached cell ended with, for its panel (the job may still be settling): its
    result, its error, or for a stop a person asked for, why it was stopped (no error)."""
    if job is None or not job.wait_done(1.0):
        return ""
    error = job.exception()
    if isinstance(error, Cancelled) and job.run.outcome is not None \
            and job.run.outcome.status.value == "stopped":
        return f"\n{error.reason}" if error.reason else ""
    if error is not None:
        return f"\n{type(error).__name__}: {error}"
    value = job.result()
    if value is None:
        return ""
    text = repr(value)
    return f"\nresult: {text if len(text) <= 200 else text[:197] + '...'}"


def _axis(kind: str) -> str:
    """An axis as the panel names it: the run's time grant (``run_ms``) by its flag, ``time``;
    every other by its kind."""
    row = KINDS[KIND_INDEX[kind]]
    return row.flag.removeprefix("--") if row.clock else kind


def _used_of(kind: str, consumed: float, limit: float) -> str:
    """An axis's label on the panel: ``6.4 s / 1 min``, ``3 / 10``."""
    return f"{_amount(kind, consumed)} / {_amount(kind, limit)}"


def _amount(kind: str, x: float) -> str:
    """An amount of *kind*: time as a person says it (``6.4 s``, ``1 min``), else the number."""
    if KINDS[KIND_INDEX[kind]].clock:
        return spoken(x)
    return f"{x:g}" if isinstance(x, float) else str(x)
