"""Helpers for testing code that uses nbbudget: a clock you move by hand, a scripted model
provider, and a store in memory.

>>> from nbbudget.testing import FakeClock
>>> clock = FakeClock()
>>> with nb.budget(time="5s", clock=clock) as run:       # doctest: +SKIP
...     clock.advance("6s")                                # the time grant runs out here
...     run.check()                                        # raises: the run is cut by timeout

>>> from nbbudget.testing import MemoryStore, use_store
>>> with use_store(MemoryStore()) as memory:              # doctest: +SKIP
...     nb.call(crunch, resume=True, budget="1s")          # its checkpoints stay in memory
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .calls.memory_store import MemoryStore
from .calls.runner import Backend, current_backend, use_backend
from .calls.store import Store
from .core.clock import Scheduled, Timers
from .core.duration import parse_duration

__all__ = ["FakeClock", "MemoryStore", "Reply", "ScriptedProvider", "use_store"]


@contextmanager
def use_store(store: Store) -> Iterator[Store]:
    """Within the block, `nb.call` and ``%%budget`` cells made in this context (and the work they
    run) keep their checkpoints, runs-per-day counts and job records in *store*, a
    `MemoryStore` or any other `nbbudget.calls.store.Store`, instead of the SQLite store of
    ``NBBUDGET_HOME``; ``nb.jobs.to_frame()`` reads its records. The work still runs on the
    runner in force, and ``nb.store()`` is still the SQLite store. Like every context variable,
    it does not reach a thread started in the block unless that thread runs in a copy of this
    context (``contextvars.copy_context().run``)."""
    with use_backend(Backend(current_backend().runner, lambda: store)):
        yield store


class FakeClock(Timers):
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
            return self.push(when_ms, callback)

    def advance(self, duration: int | str) -> None:
        """Move the clock forward by *duration* (ms or a string such as ``"1.5s"``), running each
        callback that falls due, in order, at its own time."""
        target = self._now + parse_duration(duration)
        while True:
            with self._lock:
                nxt = self.next_ms()
                if nxt is None or nxt > target:
                    self._now = target
                    self._moved.notify_all()
                    return
                self._now = max(self._now, nxt)
                due = self.pop_due(self._now)
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


@dataclass(frozen=True)
class Reply:
    """One canned model reply: its text and what it used. ``error`` makes the attempt fail
    (a transport error, say) instead; ``latency_ms`` is how long it takes."""

    text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    latency_ms: int = 0
    error: BaseException | None = None

    @property
    def usage(self) -> dict[str, float]:
        used: dict[str, float] = {"input_tokens": self.input_tokens,
                                  "output_tokens": self.output_tokens}
        if self.cost_usd is not None:
            used["cost_usd"] = self.cost_usd
        return used


class ScriptedProvider:
    """A model that replays canned `Reply` objects in order, for tests, docs and teaching.

    Call it as a provider function: ``provider(prompt, max_output_tokens=None)``. It records
    each prompt and cap it was called with (``calls``), waits ``latency_ms`` on *clock* (a
    `FakeClock` moves; the real clock sleeps), raises a reply's ``error``, and truncates a reply
    to the cap it was given. Running out of script is an `AssertionError`.
    """

    def __init__(self, replies: list[Reply], *, clock: Any = None) -> None:
        self.replies = list(replies)
        self.clock = clock
        self.calls: list[tuple[Any, int | None]] = []
        self._lock = threading.Lock()

    def __call__(self, prompt: Any = None, max_output_tokens: int | None = None) -> Reply:
        with self._lock:
            self.calls.append((prompt, max_output_tokens))
            if not self.replies:
                raise AssertionError(f"the scripted provider has no reply left for call "
                                     f"{len(self.calls)}")
            reply = self.replies.pop(0)
        if reply.latency_ms:
            if isinstance(self.clock, FakeClock):
                self.clock.advance(reply.latency_ms)
            else:
                time.sleep(reply.latency_ms / 1000)
        if reply.error is not None:
            raise reply.error
        if max_output_tokens is not None and reply.output_tokens > max_output_tokens:
            reply = dataclasses.replace(reply, output_tokens=max_output_tokens)
        return reply
