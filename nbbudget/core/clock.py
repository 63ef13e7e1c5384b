"""Clocks: where time comes from, and how a deadline becomes a flag with no clock read per step.

A `Clock` gives monotonic milliseconds (``now_ms``) and runs a callback at a time (``call_at``).
Runs arm one callback per deadline, so the hot path (``step()``, ``charge()``) only reads a flag.
`MonotonicClock` runs its callbacks on one timer thread, ``nbbudget-timer``, which starts when
something is scheduled and ends when nothing is left. ``nbbudget.testing.FakeClock`` runs them in
the thread that advances it, so tests never sleep.
"""

from __future__ import annotations

import heapq
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "Latch", "MonotonicClock", "Scheduled", "Timers", "Waitable", "default_clock"]


class Waitable(Protocol):
    """What a clock waits on: a `threading.Event`, or a `Latch`."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Latch:
    """A flag that is set once and stays set, to wait on as on a `threading.Event`, made of one
    raw lock held while it is not set: setting it is one release, and a timed wait one acquire
    (an Event pays a Condition and a lock of its own per wait). Safe from any thread; any number
    may wait."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._set = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            try:  # noqa: SIM105 - suppress() would cost a context manager on the hot path
                self._lock.release()
            except RuntimeError:  # another thread set it at the same moment
                pass

    def releaser(self) -> Callable[[], None]:
        """Set the latch, and return what wakes its waiters, for the one thread that sets it
        to call once it has done what it does before they go on (a worker that puts itself
        back on its idle stack first): until then, only a waiter that has not blocked yet
        sees it set."""
        self._set = True
        return self._lock.release

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the latch is set, at most *timeout* seconds; whether it is set."""
        if self._set:
            return True
        lock = self._lock
        # positional: the keyword form parses its arguments the slow way (on the hot path)
        if lock.acquire(True, -1 if timeout is None else timeout):
            try:  # noqa: SIM105 - suppress() would cost a context manager on the hot path
                lock.release()  # it stays set for every other waiter
            except RuntimeError:  # a second setter released it meanwhile: set all the same
                pass
            return True
        return self._set


class Scheduled:
    """A callback scheduled on a clock; `cancel()` is idempotent and safe from any thread."""

    __slots__ = ("callback", "cancelled", "on_cancel", "when_ms")

    def __init__(self, when_ms: float, callback: Callable[[], object],
                 on_cancel: Callable[[], None] | None = None) -> None:
        self.when_ms = when_ms
        self.callback = callback
        self.cancelled = False
        self.on_cancel = on_cancel

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self.on_cancel is not None:
                self.on_cancel()


class Clock(Protocol):
    """What a run needs from time."""

    def now_ms(self) -> float:
        """Monotonic milliseconds; only differences mean anything."""

    def call_at(self, when_ms: float, callback: Callable[[], object]) -> Scheduled:
        """Run *callback* (which must not block) once `now_ms()` reaches *when_ms*."""

    def wait(self, event: Waitable, until_ms: float | None) -> bool:
        """Block until *event* is set or the clock reaches *until_ms*; return ``event.is_set()``."""


class Timers:
    """A heap of scheduled callbacks; the base of both clocks (and of a test's clock)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Scheduled]] = []
        self._seq = itertools.count()

    def push(self, when_ms: float, callback: Callable[[], object],
              on_cancel: Callable[[], None] | None = None) -> Scheduled:
        item = Scheduled(when_ms, callback, on_cancel)
        heapq.heappush(self._heap, (when_ms, next(self._seq), item))
        return item

    def pop_due(self, now: float) -> list[Scheduled]:
        due = []
        heap = self._heap
        while heap and (heap[0][2].cancelled or heap[0][0] <= now):
            item = heapq.heappop(heap)[2]
            if not item.cancelled:
                due.append(item)
        return due

    def next_ms(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


class MonotonicClock(Timers):
    """The real clock: `time.monotonic_ns`, with callbacks run on the ``nbbudget-timer`` thread.

    The thread starts on demand and ends as soon as nothing is scheduled, so an idle process
    holds no thread. Callbacks must be short and must not block: they set flags and events.
    Both the timer thread and `wait` sleep until one switch interval before a deadline, then
    the rest (`_wake_in`): woken at the deadline itself, a thread waits that interval more for
    the GIL while work runs Python.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def forget_after_fork(self) -> None:
        """In a child made by ``os.fork``: the parent's timer thread does not exist here, and
        what it had scheduled was the parent's; start again with nothing scheduled."""
        self._heap.clear()
        self._cond = threading.Condition(threading.Lock())
        self._thread = None

    def now_ms(self) -> float:
        return time.monotonic_ns() / 1e6

    def call_at(self, when_ms: float, callback: Callable[[], object]) -> Scheduled:
        with self._cond:
            item = self.push(when_ms, callback, self._wake)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="nbbudget-timer", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is item:
                self._cond.notify()
        return item

    def _wake(self) -> None:
        # a cancelled callback may have been the next one: let the thread look again (and end
        # if nothing is left)
        with self._cond:
            self._cond.notify()

    def wait(self, event: Waitable, until_ms: float | None) -> bool:
        if until_ms is None:
            return event.wait()
        left = until_ms - time.monotonic_ns() / 1e6  # (now_ms, inline on the hot path)
        while left > 0:
            if event.wait(_wake_in(left) / 1000):
                return True
            left = until_ms - time.monotonic_ns() / 1e6
        return event.is_set()

    def _loop(self) -> None:
        while True:
            with self._cond:
                next_ms = self.next_ms()
                if next_ms is None:
                    self._thread = None
                    return
                delay = next_ms - self.now_ms()
                if delay > 0:
                    self._cond.wait(_wake_in(delay) / 1000)
                    continue
                due = self.pop_due(self.now_ms())
            for item in due:
                item.callback()


def _wake_in(left_ms: float) -> float:
    """How long to sleep towards a deadline *left_ms* away: until one switch interval before
    it, then the rest. A thread woken while another runs Python waits that long for the GIL
    before it may ask for it back, so one woken at its deadline while work holds the GIL
    answered an interval late (5 ms by default). Woken an interval early, it has the GIL back
    at its deadline; when nothing held the GIL it has it at once, and sleeps the rest."""
    early = sys.getswitchinterval() * 1000
    return left_ms - early if left_ms > early else left_ms


_DEFAULT = MonotonicClock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_DEFAULT.forget_after_fork)


def default_clock() -> MonotonicClock:
    """The process-wide real clock."""
    return _DEFAULT
