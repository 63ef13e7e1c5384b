"""Pre-started worker threads for calls, so the timed path never pays ``Thread.start()``.

A worker takes the next task from a queue; a worker whose task runs past its caller's budget
simply keeps running it (the caller has gone), and the pool starts another when a task finds no
idle worker. Idle workers end after ``IDLE_SECONDS``: an idle process holds no thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable

__all__ = ["IDLE_SECONDS", "submit"]

IDLE_SECONDS = 1.0

_tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_lock = threading.Lock()
_idle = 0
_names = itertools.count(1)


def submit(task: Callable[[], None]) -> None:
    """Run *task* on a worker thread (an idle one if there is one)."""
    global _idle
    with _lock:
        start = _idle == 0
        if not start:
            _idle -= 1
    if start:
        threading.Thread(target=_work, args=(task,), name=f"nbbudget-worker-{next(_names)}",
                         daemon=True).start()
    else:
        _tasks.put(task)


def _work(task: Callable[[], None] | None) -> None:
    global _idle
    while True:
        if task is not None:
            task()
        with _lock:
            _idle += 1
        try:
            task = _tasks.get(timeout=IDLE_SECONDS)
        except queue.Empty:
            with _lock:
                # a task may have been queued for us just as we timed out: take it
                if _idle > 0 and _tasks.empty():
                    _idle -= 1
                    return
            task = _tasks.get()
