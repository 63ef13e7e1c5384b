"""Helpers for testing code that uses nbbudget: a clock you move by hand.

>>> from nbbudget.testing import FakeClock
>>> clock = FakeClock()
>>> with nb.budget(time="5s", clock=clock) as run:       # doctest: +SKIP
...     clock.advance("6s")                                # the time grant runs out here
...     run.check()                                        # raises: the run is cut by timeout
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._clock import Scheduled, _Timers
from ._duration import parse_duration

__all__ = ["FakeClock"]


class FakeClock(_Timers):
    """A clock that moves only when `advance()` is called; callbacks run in the advancing thread
    (a callback scheduled in the past runs at the next ``advance()``, ``advance(0)`` included).

    Waits (`wait`) block on the real event until it is set or until another thread advances this
    clock past the wait's end, so a tool cut by a deadline is freed by ``advance()`` alone.
    """

    def __init__(self, start_ms: float = 0.0) -> None:
        super().__init__()
        #: set the first time a thread waits on this clock (the caller of ``nb.call`` once its
        #: budget is in force): work that moves the clock can wait for it first
        self.waiting = threading.Event()
        self._now = float(start_ms)
        self._lock = threading.RLock()
        self._moved = threading.Condition(self._lock)

    def now_ms(self) -> float:
        return self._now

    def call_at(self, when_ms: float, callback: Callable[[], object]) -> Scheduled:
        with self._lock:
            return self._push(when_ms, callback)

    def advance(self, duration: int | str) -> None:
        """Move the clock forward by *duration* (ms or a string such as ``"1.5s"``), running each
        callback that falls due, in order, at its own time."""
        target = self._now + parse_duration(duration)
        while True:
            with self._lock:
                nxt = self._next_ms()
                if nxt is None or nxt > target:
                    self._now = target
                    self._moved.notify_all()
                    return
                self._now = max(self._now, nxt)
                due = self._pop_due(self._now)
            for item in due:
                item.callback()

    def pending(self) -> int:
        """How many callbacks are scheduled and not cancelled."""
        with self._lock:
            return sum(1 for _, _, item in self._heap if not item.cancelled)

    def wait(self, event: threading.Event, until_ms: float | None) -> bool:
        # Poll the event in short real waits so that a set() from any thread is seen promptly,
        # and the fake deadline only passes when some thread advances the clock.
        self.waiting.set()
        while not event.is_set():
            if until_ms is not None and self._now >= until_ms:
                return False
            event.wait(0.005)
        return True
