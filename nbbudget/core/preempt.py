"""Preemption: a run's stop reaches the thread that entered it even when that thread's code
never calls nbbudget (N-5; seed 002: the abort frees the turn even when the work ignores its
signal).

A thread that enters a run (``with nb.budget(...)``, a ``%%budget`` cell, the work of a call)
is registered here while it is inside (`enter`, `leave`). When the run stops from elsewhere
(its deadline on the clock's timer thread, ``run.cancel()`` or the panel's Stop from another
thread, a limit passed by another thread), `Entry.fire` interrupts the thread:

- **The main thread** is sent a signal of nbbudget's own (`SIGNAL`), whose handler is
  installed on the main thread when it first enters a run. A signal interrupts what a kernel
  interrupt interrupts: a sleep, a socket read, a lock or event wait return at once, and pure
  Python stops at its next bytecode. The kernel's own SIGINT handling is left as it is. The
  handler decides, on the main thread, whether to raise: only while the entry is live, once,
  and never inside nbbudget's own leaving of a run (which reads the run's stop anyway). A
  deadline is sent by a kernel timer set shortly before it (`Entry.arm`), and the handler
  stops the run itself: the clock's timer thread would wait for the GIL first.
- **Any other thread** has the stop raised at its next bytecode
  (``PyThreadState_SetAsyncExc``, as stopit and func-timeout do): it cannot wake a thread
  blocked in a sleep or a read. It is raised once, only while the entry is live: leaving
  revokes one not raised yet, under the lock the firing takes, so none can follow.
- **A task on an event loop** (N-6: ``async with nb.budget(...)``, a ``%%budget`` cell that
  awaits, a ``with`` block entered in a coroutine) is cancelled on its loop, as
  ``asyncio.timeout`` cancels it: the block ends with the run's error, not
  ``CancelledError``. Its thread runs other tasks while it awaits, so nothing is raised into
  it there: on the main thread the signal raises only while the thread is inside the block's
  own frame (code that holds the loop without awaiting); on any other thread only the cancel.

What is raised is the run's own `Unwind`, a ``BaseException``: it unwinds past ``except
Exception:`` to the run's ``with`` block, which turns it into the public error. A stop that lands
where Python drops what is raised (a ``__del__`` or a weakref's callback the garbage collector
runs at that moment) never reached the work: Python hands it to ``sys.unraisablehook``, where
`_Dropped` gives it back to its entry, and it is raised again once the thread is out of that
callback. One call into C
code that does not look at signals (a long numpy operation, ``sum(range(10**9))``) finishes
first: when the stop has not landed after `LATE_MS`, `Entry.waiting` says so (the panel shows
it), and `Entry.late_note` gives the run's error the time the code went on.

Used by ``nbbudget.run.budget``: every run entered with ``preempt=True`` (the default) registers
the entering thread, and fires its entries from a listener on its scope.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Protocol

from .alarm import ThreadAlarm, thread_alarm
from .clock import Clock, MonotonicClock
from .errors import ConfigError
from .kinds import KINDS, RUN_MS
from .outcome import Status
from .scope import Stop, Unwind

__all__ = ["LATE_MS", "SIGNAL", "Entry", "Interrupt", "Timed", "calls_work", "checked",
           "current_task", "enter", "escaped", "guard", "leave", "shield"]

#: the signal nbbudget sends the main thread to interrupt it: a real-time signal where the
#: platform has them (nothing in a kernel uses one), else SIGUSR2; 0 where there is none
SIGNAL: int = int(getattr(signal, "SIGRTMIN", 0) + 3 if hasattr(signal, "SIGRTMIN")
                  else getattr(signal, "SIGUSR2", 0))
#: how long a fired stop may take to land before the entry says it waits for C code; a stop
#: not landed is sent again this often, until it lands or the thread leaves the run
LATE_MS = 100.0

# Firing and leaving take this lock, so that nothing is sent to a thread after its entry is
# closed, and a thread's pending interrupt is revoked while no firing can add another.
_lock = threading.Lock()
_MAIN: int = threading.main_thread().ident or 0
#: each thread's live entries, innermost last
_entries: dict[int, list[Entry]] = {}
#: nbbudget's own leaving of a run: an interrupt never lands there (`shield`)
_shielded: set[CodeType] = set()


class Entry:
    """One thread inside one run, from `enter` to `leave`. `fire` (from any thread) interrupts
    the thread with the run's stop, raised once; `waiting` says that the stop has not landed."""

    __slots__ = ("_deliver", "_fire", "block", "cancelled", "clock", "closed", "drops",
                 "due_ms", "fired_at", "frame", "held", "landed_at", "owner", "signals", "stop",
                 "task", "thread", "timed")

    def __init__(self, thread: int, signals: bool, clock: Clock,
                 task: asyncio.Task[Any] | None = None, frame: FrameType | None = None) -> None:
        self.thread = thread
        self.signals = signals  # the main thread, with the handler installed: sent a signal
        self.clock = clock  # the run's: its time stamps the entry, and its timer follows a stop
        # N-6: the task that entered, on a loop running in the thread: cancelled on its loop;
        # the signal lands only inside *frame*, the frame of the block (the thread runs other
        # tasks while this one awaits)
        self.task = task
        self.frame = frame
        self.cancelled = False  # the task was cancelled for the stop: leaving uncancels it
        self.closed = False  # the thread left: nothing is raised for it any more
        self.stop: Stop | None = None  # what is raised: set once, before anything is sent
        self.fired_at: float | None = None  # on the clock, when the interrupt was sent
        self.landed_at: float | None = None  # on the clock, when the stop was raised
        # the stop was held back in a guarded wait of nbbudget's, which raised it itself
        self.held = False
        # the run's time, where the kernel's timer signals the main thread at its deadline
        # (`arm`); the deadline, on the clock
        self.timed: Timed | None = None
        self.due_ms: float | None = None
        self.block: FrameType | None = None  # the frame of the block that entered, if known
        self.owner: object = None  # the run, for the run's own use (`escaped`); never called
        # the code of each callback the stop was dropped in (`dropped`): not raised inside again
        self.drops: set[CodeType] = set()
        self._fire: list[None] = [None]  # popped (atomic) by the one firing
        self._deliver: list[None] = [None]  # popped by the one raising, or by leaving

    def fire(self, stop: Stop) -> None:
        """Interrupt the thread with *stop*, once, unless it has left, or is the thread calling
        (which raises the stop itself at its next check). A scope listener: any thread. Only
        what N-5 names interrupts: the run's time and a cancel (a person's, or the wall
        clock's); a limit passed by another thread (a model reply's tokens) is raised at this
        thread's next budget check, where a stream is cut with what it received (S3-9)."""
        if self.closed or not _interrupts(stop) or (
                threading.get_ident() == self.thread and (
                    self.task is None or self.task is current_task())):
            return
        try:
            self._fire.pop()
        except IndexError:
            return
        self.stop = stop
        self.fired_at = self.clock.now_ms()
        task = self.task
        if task is not None:
            with contextlib.suppress(RuntimeError):  # a loop closed since: nothing awaits
                task.get_loop().call_soon_threadsafe(self._cancel)
            if not self.signals:
                return  # nothing else reaches a thread that runs other tasks meanwhile
        self._send()

    def arm(self, timed: Timed) -> None:
        """The thread's run stops at *timed*'s deadline. On the main thread, on the real clock,
        the kernel's timer sends the signal at the deadline itself (`nbbudget.core.alarm`), and
        the handler stops the run there (`Timed.expire_here`): the clock's timer thread, which
        fires the entry otherwise, wakes at the deadline and then waits for the GIL while the
        work runs Python, a switch interval late (5 ms by default). The kernel's timer is set
        shortly before the deadline (`Timed.before_deadline`), so that a block that ends
        earlier costs no call into the kernel. On other threads, other clocks and platforms
        without such a timer, the clock's timer fires the entry, as any stop."""
        if (self.signals and not self.closed and isinstance(self.clock, MonotonicClock)
                and _main_alarm() is not None):
            self.timed = timed
            timed.before_deadline(self._due)

    def _due(self, due_ms: float) -> None:
        """*timed*'s deadline is near (the clock's timer), or moved: set the kernel's timer to
        it, unless an outer run's comes first (and has not passed)."""
        if signal.getsignal(SIGNAL) is not _on_signal:
            return  # other code took the signal since: it would be sent to theirs
        with _lock:
            if self.closed:
                return
            self.due_ms = due_ms
            when = _due_ns(due_ms)
            if not _armed_ns or when < _armed_ns or _armed_ns <= time.monotonic_ns():
                _set_alarm(when)

    def _cancel(self) -> None:
        """On the task's loop, between its steps: cancel the task, unless the stop landed
        otherwise (the signal) or the task has left the run. The cancel is thrown in at the
        await the task waits in, inside the block."""
        task = self.task
        if task is None or not self.take():
            return
        assert self.stop is not None
        self.cancelled = True
        self.stop.observe()
        task.cancel(self.stop.message)

    def _send(self) -> None:
        """Send the stop, and look again after `LATE_MS`: a stop held back (the thread was in
        nbbudget's own leaving of a run, or in a wait that reads the stop itself) or not landed
        yet (C code) is sent again then, until it lands or the thread leaves."""
        with _lock:
            if self.closed or self.landed_at is not None:
                return
            if self.signals and signal.getsignal(SIGNAL) is not _on_signal:
                self.signals = False  # other code took the signal since: as another thread
            if self.signals:
                signal.pthread_kill(self.thread, SIGNAL)
            elif self.frame is not None:
                return  # a coroutine's thread runs other code meanwhile: its task's cancel
            else:
                frame = sys._current_frames().get(self.thread)
                where = _held_in(frame)
                if where is None and self.drops and _within(frame, self.drops):
                    # in a callback that drops it again: sent once the thread is out of it
                    self.clock.call_at(self.clock.now_ms() + _DROPPED_AGAIN_MS, self._follow)
                    return
                if where is None:
                    _raise_in(self.thread, Interrupt)
                self.held = self.held or where is _guarded
        self.clock.call_at(self.clock.now_ms() + LATE_MS, self._follow)

    def _follow(self) -> None:
        """On the clock's timer: the stop sent `LATE_MS` ago has not landed: send it again."""
        if self.closed or self.landed_at is not None:
            return
        if threading.get_ident() == self.thread:  # a test's clock, advanced by the thread
            self.clock.call_at(self.clock.now_ms() + LATE_MS, self._follow)
            return
        self._send()

    def take(self) -> bool:
        """In the thread: whether the stop is raised now (once, and never after leaving)."""
        if self.closed or self.stop is None:
            return False
        try:
            self._deliver.pop()
        except IndexError:
            return False
        self.landed_at = self.clock.now_ms()
        if sys.unraisablehook is not _dropped_hook.hook:
            _dropped_hook.install()
        return True

    def dropped(self, code: CodeType | None) -> None:
        """In the thread: the stop raised landed where Python drops what is raised (`_Dropped`),
        in a callback of *code*: it never reached the work, so it is raised once more, in a
        moment, outside every such callback, unless the thread has left the run meanwhile. No
        lock: only this thread closes its entry or takes its stop, and the thread may hold the
        lock where the drop happened."""
        if self.closed or self.landed_at is None:
            return
        if code is not None:
            self.drops.add(code)
        self.landed_at = None
        self._deliver.append(None)
        # from the clock's timer thread: raised now, the stop would land in Python's own
        # handling of the drop, and be dropped again
        self.clock.call_at(self.clock.now_ms() + _DROPPED_AGAIN_MS, self._follow)

    def waiting(self) -> float | None:
        """Milliseconds since the stop was sent, while it has not landed and that is longer
        than `LATE_MS`; else None. The panel then says that the cell waits for a call into C
        code to return."""
        fired = self.fired_at
        if fired is None or self.landed_at is not None or self.closed:
            return None
        late = self.clock.now_ms() - fired
        return late if late >= LATE_MS else None

    def late_note(self, left_ms: float, due_ms: float | None, completed: bool) -> str | None:
        """What the run's error adds when the thread went on more than `LATE_MS` after its
        stop was sent or after *due_ms*, its deadline (a call into C code that holds the GIL
        keeps even the clock's timer from sending it), when the stop was sent or the block
        *completed* without it. *left_ms*: when it left the run. None when the stop landed in
        time, or was raised at a budget check of the thread itself."""
        if (self.fired_at is None and not completed) or (self.held and self.landed_at is None):
            return None  # raised at a check, or by the wait of nbbudget's it was held back in
        sent = [t for t in (self.fired_at, due_ms) if t is not None]
        if not sent:
            return None
        since = min(sent)
        landed = self.landed_at if self.landed_at is not None else left_ms
        if landed - since < LATE_MS:
            return None
        if self.frame is not None and not self.signals:
            return (f"the code went on for {round(landed - since)} ms past that without "
                    f"awaiting: off the main thread, a coroutine stops only at an await")
        if self.signals:
            why = "C code that does not look at signals"
        elif self.thread == _MAIN:
            why = (f"C code, or a sleep or a read: signal {SIGNAL}, which nbbudget interrupts "
                   f"them with, is handled by other code in this process")
        else:
            why = "C code, or a sleep or a read on a thread other than the main one"
        return (f"the code went on for {round(landed - since)} ms past that, inside a call "
                f"Python cannot interrupt ({why})")


#: what a stop of time is cut by: its time grant, a time window (S3-1), the wall clock
_TIME_BY = frozenset({"timeout", KINDS[RUN_MS].name, "wall-clock"})


def _interrupts(stop: Stop) -> bool:
    """Whether *stop* interrupts the threads inside its run (N-5): a cancel or a time stop."""
    return stop.status in (Status.STOPPED, Status.CANCELLED) or stop.by in _TIME_BY


class Timed(Protocol):
    """A run's time, as `Entry.arm` reads it: its scope (``nbbudget.core.scope.Scope``)."""

    def before_deadline(self, callback: Callable[[float], None]) -> None:
        """Call *callback* with the deadline shortly before it (any thread), again when it
        moves; until `forget_before_deadline`."""

    def forget_before_deadline(self, callback: Callable[[float], None]) -> None:
        """*callback* is not called any more."""

    def expire_here(self) -> Stop | None:
        """In the signal's handler: its stop if the deadline has passed (made now if need be,
        its listeners told later); None when not, or when it cannot say here."""


#: how long after a stop was dropped (`Entry.dropped`) it is raised again
_DROPPED_AGAIN_MS = 1.0


class _Dropped:
    """Python's hook for what it drops (``sys.unraisablehook``): an exception raised where it
    cannot propagate, a ``__del__``, a weakref's callback, anything the garbage collector runs
    at an allocation. A stop raised into the thread at that moment (the signal's handler, an
    interrupt) lands there, is dropped, and the work goes on: so a stop of a live entry of the
    thread is given back to its entry (`Entry.dropped`), and raised again; anything else goes
    to the hook that was there before. Installed when a stop is first raised, over whatever
    hook is there then (pytest sets its own during each test)."""

    def __init__(self) -> None:
        self.previous: Callable[[Any], object] = sys.unraisablehook
        self.hook: Callable[[Any], object] = self._hook

    def install(self) -> None:
        self.previous = sys.unraisablehook
        sys.unraisablehook = self.hook

    def _hook(self, unraisable: Any) -> None:
        dropped = unraisable.exc_value
        if isinstance(dropped, Unwind):
            for entry in reversed(_entries.get(threading.get_ident(), ())):
                if entry.stop is dropped.stop and entry.landed_at is not None:
                    # the traceback begins at the callback's own frame
                    where = unraisable.exc_traceback
                    entry.dropped(where.tb_frame.f_code if where is not None else None)
                    return
        self.previous(unraisable)


def _within(frame: FrameType | None, codes: set[CodeType]) -> bool:
    """Whether *frame* runs inside a frame of one of *codes* (is one, or called from one)."""
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


_dropped_hook = _Dropped()


class Interrupt(Unwind):
    """What ``PyThreadState_SetAsyncExc`` raises in a thread (it raises a class, made with no
    arguments): the run's `Unwind`, its stop read from the thread's fired entry. Leaving a run
    (``nbbudget.run.budget``) catches one that lands as it leaves."""

    def __init__(self) -> None:
        stop = None
        for entry in reversed(_entries.get(threading.get_ident(), ())):
            if entry.stop is not None and entry.task is None:  # a task's is never sent so
                entry.take()  # nothing if leaving closed it: `leave` catches this one
                stop = entry.stop
                break
        assert stop is not None, "an interrupt is sent only with a stop"
        stop.observe()
        super().__init__(stop)


def checked(preempt: object) -> bool:
    """*preempt* as ``nb.budget`` and ``nb.call`` take it: True or False, else a `ConfigError`
    naming the value."""
    if preempt is True or preempt is False:
        return preempt
    raise ConfigError(f"preempt={preempt!r}: give True (a stop interrupts the code inside the "
                      f"run) or False (it stops only at its budget checks)")


def enter(clock: Clock, frame: FrameType | None = None) -> Entry:
    """Register this thread as inside a run on *clock*: what `leave` takes. On the main thread
    the signal's handler is installed the first time. *frame* is the frame of the block that
    entered: when it is a coroutine's (N-6), the entry is its task's, and the signal lands only
    beneath it (its thread runs other tasks while it awaits)."""
    ident = threading.get_ident()
    task, block = None, frame
    if frame is not None and frame.f_code.co_flags & _ASYNC:
        task = current_task()  # None under another loop (trio): the signal only, inside
    else:
        frame = None
    entry = Entry(ident, ident == _MAIN and (_installed or _install()), clock, task, frame)
    entry.block = block
    stack = _entries.get(ident)
    if stack is None:
        _entries[ident] = [entry]
    else:
        stack.append(entry)
    return entry


#: the main thread's kernel timer, made the first time an entry is armed (None: not made yet,
#: or the platform has none: `_alarm_made` says which), and what it is set to (ns, 0: nothing)
_alarm: ThreadAlarm | None = None
_alarm_made = False
_armed_ns = 0


def _main_alarm() -> ThreadAlarm | None:
    global _alarm, _alarm_made
    if not _alarm_made:
        _alarm_made = True
        _alarm = thread_alarm(SIGNAL, threading.main_thread().native_id or 0)
    return _alarm


def _set_alarm(when: int) -> None:
    """Set the main thread's kernel timer to go off at *when* (ns on the monotonic clock), or
    clear it (0). With `_lock` held, never in the handler."""
    global _armed_ns
    if _alarm is not None and when != _armed_ns:
        if when or _armed_ns > time.monotonic_ns():  # one that has gone off needs no clearing
            _alarm.at(when)
        _armed_ns = when


def _due_ns(due_ms: float) -> int:
    # a microsecond after the deadline: the scope compares the clock's float milliseconds, and
    # a signal a rounding early would find nothing due
    return int(due_ms * 1e6) + 1000


#: how soon the kernel's timer goes off again when it found the deadline passed while
#: nbbudget's own code ran (`_again`)
_AGAIN_NS = 200_000


def _again() -> None:
    """In the handler: the kernel's timer found its deadline passed while the thread ran
    nbbudget's own code inside the run (entering it, when the deadline is that close): it goes
    off again in `_AGAIN_NS`, so that the stop lands in the block once that code has returned,
    not when the clock's timer thread fires it (it may wait for the GIL, or be late). No lock,
    as a handler takes none: another thread's `_set_alarm` meanwhile sets the timer its own
    way, and then the clock's timer fires the entry, as without the kernel's."""
    global _armed_ns
    if _alarm is not None:
        when = time.monotonic_ns() + _AGAIN_NS
        _alarm.at(when)
        _armed_ns = when


def _rearm() -> None:
    """The main thread's kernel timer at the earliest deadline of its live entries, if any."""
    due = min((e.due_ms for e in _entries.get(_MAIN, ()) if e.due_ms is not None and not e.closed),
              default=None)
    _set_alarm(0 if due is None else _due_ns(due))


def _forget_alarm() -> None:
    """In a child made by ``os.fork``: it has no timers, and another main thread."""
    global _alarm, _alarm_made, _armed_ns
    _alarm, _alarm_made, _armed_ns = None, False, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_alarm)


def leave(entry: Entry) -> None:
    """In the thread that entered: it has left the run, and nothing more is raised for it (a
    stop sent and not raised yet is revoked). An outer run of the same thread whose stop was
    held back while this one was leaving is sent again. A stop that lands as the thread leaves
    is not raised out of here: the run reads its stop where it leaves."""
    try:
        _close(entry)
    except Interrupt:  # sent before the entry closed, landed as it left
        _close(entry)


def _close(entry: Entry) -> None:
    """`leave`'s work, which an interrupt landing meanwhile may cut short: done again."""
    # An entry never fired (nearly every one) is closed without the lock: a firing that comes
    # after sets `fired_at` before `_send` reads `closed` under the lock, so it sends nothing.
    # (bench_preempt.py --only empty --before: an empty block 0.84x and 0.92x with the lock.)
    entry.closed = True
    if entry.fired_at is not None:  # fired (set before sending): revoke, under the lock the
        with _lock:                 # sending takes, what was sent and not raised yet
            if entry.landed_at is None and not entry.signals and entry.task is None:
                _raise_in(entry.thread, None)
    timed = entry.timed
    if timed is not None:
        timed.forget_before_deadline(entry._due)
        if entry.due_ms is not None:  # (read after `closed` was set: `_due` sets no more)
            with _lock:
                if _armed_ns:  # set for this entry (or again, `_again`): for an outer
                    _rearm()   # one's, or cleared
    task = entry.task
    if entry.cancelled and task is not None and hasattr(task, "uncancel"):  # 3.11+: as
        entry.cancelled = False  # asyncio.timeout does, so that the task's own cancels count
        task.uncancel()          # right; once, should this be done again
    stack = _entries.get(entry.thread)
    if stack is not None:
        if entry in stack:
            stack.remove(entry)
        if not stack:
            _entries.pop(entry.thread, None)
        else:
            for outer in stack:
                if outer.fired_at is not None and outer.landed_at is None:
                    outer._send()


def escaped(thread: int) -> list[Entry]:
    """*thread*'s entries whose stop was raised and whose block no longer runs: the stop left
    the block without its ``with`` statement's end running. CPython 3.13 does so when a signal
    or an interrupt lands in a ``while`` loop's condition in the block's own function (CPython
    issue 130279: that function's handlers are skipped). Called on *thread* itself, whose stack
    it looks at; the run leaves them then (``nbbudget.run.budget``)."""
    stack = _entries.get(thread)
    if not stack:
        return []
    raised = [e for e in stack if e.landed_at is not None and e.block is not None
              and e.task is None]  # (a task's cancel is thrown in at an await)
    if not raised:
        return []
    running = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        running.append(frame)
        frame = frame.f_back
    return [e for e in raised if not any(f is e.block for f in running)]


def shield(code: CodeType) -> None:
    """Never raise an interrupt inside *code*, or in nbbudget's code it calls: nbbudget's own
    leaving of a run (``nbbudget.run.budget``, ``nbbudget.calls.call``), which reads the run's
    stop itself. User code it calls (a call's work) is interrupted as any other."""
    _shielded.add(code)


def calls_work(code: CodeType) -> None:
    """*code* is nbbudget's, and calls a run's work (a ``%%budget`` cell's code): beneath it
    runs the user's code, which the kernel's timer may stop there (`Entry.arm`) unless it
    has called nbbudget's again."""
    _callers.add(code)


_callers: set[CodeType] = set()


def guard(code: CodeType) -> None:
    """Hold an interrupt back while the thread is anywhere inside *code*: nbbudget's own waits
    that read the run's stop themselves and end with a richer error (a model request's stream,
    cut with the text received so far). User code never runs beneath them."""
    _guarded.add(code)


_guarded: set[CodeType] = set()


def _held_in(frame: FrameType | None) -> set[CodeType] | None:
    """Where an interrupt at *frame* is held back: `_guarded` when *frame* is anywhere beneath
    a guarded wait (which raises the stop itself), `_shielded` when it is nbbudget's own code
    called (through nbbudget's code, or the standard library's that it calls: a lock's
    ``with``, ``signal.getsignal``) from a run's entering or leaving, else None."""
    ours = True
    while frame is not None:
        code = frame.f_code
        if code in _guarded:
            return _guarded
        ours = ours and (frame.f_globals.get("__name__", "").startswith("nbbudget.")
                         or _standard(code))
        if ours and code in _shielded:
            return _shielded
        frame = frame.f_back
    return None


def _folder(path: str) -> str:
    return os.path.join(os.path.realpath(path), "")


#: the standard library's folder, and the folders of installed packages (which a system
#: Python keeps inside it)
_STDLIB = _folder(sysconfig.get_paths()["stdlib"])
_PACKAGES = tuple({_folder(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")})


def _standard(code: CodeType) -> bool:
    """Whether *code* is the standard library's: between nbbudget's own frames it is nbbudget's
    doing (user code that calls it has a frame of its own above it, which is not)."""
    path = code.co_filename
    if not path.startswith(_STDLIB):
        path = os.path.realpath(path)
    return path.startswith(_STDLIB) and not path.startswith(_PACKAGES)


#: the handler was installed (code that takes the signal later is noticed when a stop is sent)
_installed = False


def _install() -> bool:
    """Install the handler of `SIGNAL` (on the main thread), unless something else handles
    it; whether the handler is nbbudget's (else the main thread is interrupted as other
    threads are). Read once: ``signal.getsignal`` costs more than the rest of entering."""
    global _installed
    if not SIGNAL or not hasattr(signal, "pthread_kill"):
        return False
    current = signal.getsignal(SIGNAL)
    if current not in (signal.SIG_DFL, None, _on_signal):
        return False
    if current is not _on_signal:
        signal.signal(SIGNAL, _on_signal)
    _installed = True
    return True


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """On the main thread, at its next bytecode after the signal: raise the innermost fired
    entry's stop, unless nbbudget is leaving a run there (`leave` sends it again if needed).
    From the kernel's timer (`Entry.arm`), no entry has fired yet: the run whose deadline has
    passed is stopped here, when the thread runs the work's own code. Not again inside itself:
    a signal that lands while the handler runs (the timer thread's, for the same stop) returns
    at once, so that nothing is raised while the handler holds the run's lock (one not raised
    is sent again after `LATE_MS`)."""
    global _handling
    if _handling:
        return
    _handling = True
    try:
        _handle(frame)
    finally:
        _handling = False


#: the signal's handler is running (on the main thread)
_handling = False


def _handle(frame: FrameType | None) -> None:
    """`_on_signal`'s work."""
    for entry in reversed(_entries.get(_MAIN, ())):
        if entry.closed or entry.landed_at is not None:
            continue
        if entry.frame is not None and not _beneath(frame, entry.frame):
            continue  # the loop runs another task, or this one awaits: its cancel waits
        if entry.stop is None and not _expired(entry, frame):
            continue
        where = _held_in(frame)
        if where is not None:
            entry.held = entry.held or where is _guarded
            return
        if entry.drops and _within(frame, entry.drops):
            # in a callback that drops it again (`Entry.dropped`): sent once the thread is out
            entry.clock.call_at(entry.clock.now_ms() + _DROPPED_AGAIN_MS, entry._follow)
            return
        if not entry.take():
            return
        assert entry.stop is not None
        raise entry.stop.signal()


def _expired(entry: Entry, frame: FrameType | None) -> bool:
    """At the kernel's timer: whether *entry*'s run has run out of time, its stop set on the
    entry. Only while the thread runs none of nbbudget's code inside the run (which may hold
    the run's locks, and checks the time itself): else the clock's timer fires the entry."""
    timed = entry.timed
    if timed is None:
        return False
    block = entry.block
    while True:  # from the innermost frame out to the work's caller, none of nbbudget's
        if frame is None:
            return False  # the work's caller not found: nothing proves it
        if frame is block or frame.f_code in _callers:
            break
        if frame.f_globals.get("__name__", "").startswith("nbbudget."):
            due = entry.due_ms
            if due is not None and entry.clock.now_ms() >= due:
                _again()  # past its deadline, inside nbbudget's own code (entering the run)
            return False
        frame = frame.f_back
    stop = timed.expire_here()
    if stop is None or not _interrupts(stop):
        return False
    if entry.stop is None:  # the clock's timer may fire it meanwhile, with this same stop
        entry.stop = stop
        entry.fired_at = entry.clock.now_ms()
    return True


#: a code's flags that say its frame is a coroutine's (``async def``, an async generator)
_ASYNC = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def _beneath(frame: FrameType | None, block: FrameType) -> bool:
    """Whether *frame* runs inside *block* (is it, or called from it)."""
    while frame is not None:
        if frame is block:
            return True
        frame = frame.f_back
    return False


def current_task() -> asyncio.Task[Any] | None:
    """The task running in this thread's event loop; None where no loop runs. The run's
    leaving (``nbbudget.run.budget``) finds the entry of the task that leaves with it."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _raise_in(thread: int, exc: type[BaseException] | None) -> None:
    """Raise *exc* in *thread* at its next bytecode (None: revoke one not raised yet)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               ctypes.py_object(exc) if exc else None)
