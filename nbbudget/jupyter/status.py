"""The kernel's side of a status bar: a comm that pushes the figures of the ``%%budget`` cell
running now, and the number of this kernel's background jobs, to a front end (JupyterLab's
status-bar item).

``%load_ext nbbudget`` registers the comm target ``nbbudget.status`` on the kernel;
``%unload_ext nbbudget`` closes every such comm and removes the target. A front end opens a comm
to it (``comm_open``, optional data ``{"interval_ms": 500}``); a kernel without nbbudget closes
that comm at once, so the front end knows to show nothing. Once a comm is open, one thread,
``nbbudget-status``, sends on it: a first message at once, then a message whenever what it says
has changed, at most one per interval. While a ``%%budget`` cell runs that is one per interval
(its time left moves); when the cell ends, one saying so; when the number of background jobs
changes, one. Nothing is sent while nothing changes, and the front end never asks: it polls
nothing, least of all a kernel busy with a cell.

The figures are read from the run's frozen `Snapshot`, as the cell's panel reads them, and sent
from the thread while the cell holds the main thread (IOPub takes messages from any thread). On
a kernel with subshells they are sent as part of the comm's opening request addressed to
nbbudget's own subshell (`nbbudget.jupyter.clicks`): ipykernel 7.4 hands what the front end
sends back on the comm, its close included, to that subshell, so a close is handled at once,
even while a cell runs. With no comm open there is no thread and nothing is sent; the thread
ends when the last comm closes or the extension is unloaded.

A request handled beside the main shell (on a subshell, or on the control channel: a front
end making the subshell it sends a panel's widget messages to, a click on Stop, this comm's
opening) ends with an ``idle`` status on IOPub, as every request does. JupyterLab 4 and the
Jupyter server read any ``idle`` as the whole kernel's, and would show a kernel whose main
shell still runs a cell as idle. While nbbudget is loaded, every such ``idle`` that comes while
the main shell handles a request is followed at once by a ``busy`` of that request
(`KeepBusy`): what a front end shows is the main shell's state again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..calls.runner import jobs
from ..core.duration import spoken
from ..core.kinds import KIND_INDEX, KINDS
from ..core.snapshot import Snapshot
from .cells import comms_sent_as
from .clicks import Route

if TYPE_CHECKING:
    from ..run.budget import Budget

__all__ = ["TARGET", "KeepBusy", "Status", "message"]

#: the comm target a front end opens
TARGET = "nbbudget.status"
#: the bounds of the interval a front end may ask for, in ms
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 60_000
#: how long unloading waits for the thread to end
_JOIN_S = 5.0


def message(snap: Snapshot | None, job_count: int) -> dict[str, Any]:
    """What the comm says: the run of the cell running now (*snap*, None: no budgeted cell
    runs) and the number of this kernel's background jobs that have not ended. The time left
    is the run's time grant's (``--time``); the axis is the most used of the others, or the
    time grant when it is the only one."""
    said: dict[str, Any] = {"running": False, "name": None, "time_left_s": None, "axis": None,
                            "fraction": None, "label": "", "jobs": job_count}
    if snap is None or snap.outcome is not None:
        return said
    parts = []
    if snap.remaining_ms is not None:
        said["time_left_s"] = left = round(max(snap.remaining_ms, 0.0) / 1000, 1)
        parts.append(f"{spoken(left * 1000)} left")
    axes = [a for a in snap.axes if not KINDS[KIND_INDEX[a.kind]].clock] or list(snap.axes)
    if axes:
        top = max(axes, key=lambda a: a.fraction)
        said["axis"], said["fraction"] = _axis(top.kind), round(top.fraction, 3)
        parts.append(f"{said['axis']} {top.fraction * 100:.0f}%")
    said.update(running=True, name=snap.name, label=", ".join(parts) or "running")
    return said


def _axis(kind: str) -> str:
    """An axis as the panel names it: the time grant (``run_ms``) ``time``, others their kind."""
    row = KINDS[KIND_INDEX[kind]]
    return row.flag.removeprefix("--") if row.clock else kind


def _interval_ms(asked: Any, default: int) -> int:
    """The interval a front end asked for in its open data (None: *default*), checked."""
    value = default if asked is None else asked
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not MIN_INTERVAL_MS <= value <= MAX_INTERVAL_MS:
        raise ValueError(f"nbbudget.status: interval_ms {asked!r} is not a number of ms from "
                         f"{MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}; open the comm with e.g. "
                         f'{{"interval_ms": 500}}, or with no data for NBBudget.'
                         f"status_interval_ms")
    return int(value)


class _Open:
    """One open comm: where to send, how often at most, and what it was sent last."""

    def __init__(self, comm: Any, interval_s: float) -> None:
        self.comm = comm
        self.interval_s = interval_s
        self.last: dict[str, Any] | None = None


class KeepBusy:
    """Keeps the kernel's IOPub status the main shell's while it handles a request (a cell):
    an ``idle`` published for a request handled elsewhere (a subshell's thread, the control
    thread) is followed, in the same order on IOPub, by a ``busy`` of the main shell's request.
    Every request still gets its own ``busy`` and ``idle`` (a front end's future waits for its
    ``idle``). Installed on the kernel by `Status.register`, removed by `Status.unregister`."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._lock = threading.Lock()  # one status at a time: the order IOPub sends them in
        self._publish: Callable[..., None] | None = None
        self._running: dict[str, Any] | None = None  # the main shell's request, while busy
        #: the ``busy`` statuses sent again after another request's ``idle``
        self.restored = 0

    def install(self) -> bool:
        """Wrap the kernel's status publisher; False where it has none (not an ipykernel)."""
        original = getattr(self.kernel, "_publish_status", None)
        if original is None or self._publish is not None:
            return False
        self._publish = original
        self.kernel._publish_status = self._published
        return True

    def uninstall(self) -> None:
        """Give the kernel its own status publisher back."""
        if self._publish is None:
            return
        if vars(self.kernel).get("_publish_status") == self._published:
            del self.kernel._publish_status
        self._publish = None
        self._running = None

    def _published(self, status: str, channel: str, parent: Any = None) -> None:
        publish = self._publish
        assert publish is not None  # installed
        main = threading.current_thread() is threading.main_thread()
        with self._lock:
            publish(status, channel, parent)
            if main:  # the main shell: its own request starts or ends
                if channel == "shell" and status == "busy":
                    self._running = parent or self.kernel.get_parent("shell")
                elif channel == "shell" and status == "idle":
                    self._running = None
            elif status == "idle" and self._running is not None:
                publish("busy", "shell", self._running)
                self.restored += 1


class Status:
    """The status comms of one kernel. Made by ``%load_ext nbbudget`` (`nbbudget.jupyter.
    magics`), which registers it (`register`), tells it when a ``%%budget`` cell's run starts
    (`watch`) and ends (`cell_ended`), wakes it after every cell (`wake`: a job may have
    started or ended), and unregisters it at ``%unload_ext``."""

    def __init__(self, shell: Any, interval_ms: Callable[[], int],
                 route: Callable[[], Route]) -> None:
        """*interval_ms* gives the default interval (``NBBudget.status_interval_ms``); *route*
        where the comm's messages go (`nbbudget.jupyter.clicks.Clicks.route`)."""
        self.shell = shell
        self._default_ms = interval_ms
        self._route = route
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._run: Budget | None = None
        self._parent: dict[str, Any] | None = None
        self._manager: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._busy: KeepBusy | None = None
        #: messages sent, over every comm (what the status bar costs the kernel)
        self.sent = 0

    # -- the extension ---------------------------------------------------------------------------
    def register(self) -> bool:
        """Register the comm target on the shell's kernel, and keep its status the main
        shell's (`KeepBusy`); False outside a kernel (nothing to register: a terminal has no
        front end to push to)."""
        kernel = getattr(self.shell, "kernel", None)
        manager = getattr(kernel, "comm_manager", None)
        if manager is None:
            return False
        manager.register_target(TARGET, self._opened)
        self._manager = manager
        busy = KeepBusy(kernel)
        if busy.install():
            self._busy = busy
        return True

    def unregister(self) -> None:
        """Remove the target, close every open comm (the front end shows nothing again), end
        the thread and give the kernel its own status publisher back."""
        busy, self._busy = self._busy, None
        if busy is not None:
            busy.uninstall()
        manager, self._manager = self._manager, None
        if manager is not None:
            with contextlib.suppress(Exception):  # a target already gone: nothing to remove
                manager.unregister_target(TARGET, self._opened)
        with self._lock:
            opened = list(self._open.values())
            self._open.clear()
        for one in opened:
            with contextlib.suppress(Exception):  # the kernel may be going: no one to tell
                one.comm.close()
        self._end_thread()

    # -- the magics ------------------------------------------------------------------------------
    def watch(self, run: Budget) -> None:
        """A ``%%budget`` cell's run has started (on whichever thread runs its work)."""
        self._run = run
        self._nudge()

    def cell_ended(self) -> None:
        """The ``%%budget`` cell is about to reply: its run no longer holds the kernel (a
        detached job goes on, counted among the jobs)."""
        self._run = None
        self._nudge()

    def wake(self, *_: Any) -> None:
        """Look again now (after any cell: a job may have started or ended)."""
        self._nudge()

    def _nudge(self) -> None:
        """Wake the thread, which clears the event before it reads what it shows: an event
        still set has not been seen yet, and setting it again would only take its lock. With
        no status bar open nothing clears it, and each cell's start and end skips that (about
        1.5 us of the magic's cost each, bench_magic.py)."""
        if not self._wake.is_set():
            self._wake.set()

    # -- the comms (on the thread that handles the front end's message) -------------------------
    def _opened(self, comm: Any, msg: dict[str, Any]) -> None:
        data = (msg.get("content") or {}).get("data") or {}
        try:
            interval = _interval_ms(data.get("interval_ms"), self._default_ms())
        except ValueError as exc:
            comm.close(data={"error": str(exc)})
            return
        comm_id = comm.comm_id
        comm.on_close(lambda _msg: self._closed(comm_id))
        parent = self._route().parent  # the comm's opening request, to nbbudget's subshell
        with self._lock:
            self._open[comm_id] = _Open(comm, interval / 1000)
            self._parent = parent
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._loop, args=(self._stop,),
                                                name="nbbudget-status", daemon=True)
                self._thread.start()
        self._wake.set()

    def _closed(self, comm_id: str) -> None:
        with self._lock:
            self._open.pop(comm_id, None)
            last = not self._open
        if last:
            self._end_thread()

    def _end_thread(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_S)

    # -- the thread ------------------------------------------------------------------------------
    def _loop(self, stop: threading.Event) -> None:
        with comms_sent_as(self.shell, self._parent):
            while not stop.is_set():
                self._wake.clear()  # a wake-up from now on is seen at the next wait
                try:
                    said = self._now()
                except Exception:  # noqa: BLE001  (never break the kernel: try again later)
                    stop.wait(1.0)
                    continue
                with self._lock:
                    if stop.is_set():
                        return
                    due = [one for one in self._open.values() if one.last != said]
                    interval = min((one.interval_s for one in self._open.values()),
                                   default=MIN_INTERVAL_MS / 1000)
                for one in due:
                    with contextlib.suppress(Exception):  # a comm closing under us
                        one.comm.send(said)
                        one.last = said
                        self.sent += 1
                if due:
                    stop.wait(interval)  # at most one message per interval
                    continue
                if said["running"] or said["jobs"]:
                    self._wake.wait(interval)  # the run moves; a job may end
                else:
                    self._wake.wait()  # idle: until a cell starts, ends or a comm changes

    def _now(self) -> dict[str, Any]:
        run = self._run
        count = sum(1 for job in jobs if not job.state.final)
        return message(run.snapshot() if run is not None else None, count)
