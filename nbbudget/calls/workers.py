"""Pre-started worker threads for calls, so the timed path never pays ``Thread.start()``.

A worker takes the next task from a queue; a worker whose task runs past its caller's budget
simply keeps running it (the caller has gone), and the pool starts another when a task finds no
idle worker. A task returns what should happen once the worker is free again (typically: wake
the caller), so that a caller that submits again at once finds that worker idle. Idle workers end
after ``IDLE_SECONDS``: an idle process holds no thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable

__all__ = ["IDLE_SECONDS", "Task", "ensure_idle", "submit"]

IDLE_SECONDS = 1.0

#: a task runs on a worker and returns what to do once that worker is counted idle (or None)
Task = Callable[[], Callable[[], object] | None]

_tasks: queue.Queue[Task] = queue.Queue()  # SimpleQueue's timed get can miss its timeout here
_lock = threading.Lock()
_idle = 0
_names = itertools.count(1)


def submit(task: Task) -> None:
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


def ensure_idle(n: int) -> None:
    """Start workers until *n* are idle, so that tasks submitted later (when a busy thread may
    hold the GIL) only queue: ``Thread.start()`` waits for the new thread, which costs a GIL
    switch interval or more each time the GIL is contended."""
    global _idle
    with _lock:
        missing = max(0, n - _idle)
        _idle += missing  # counted idle from now: they will wait on the queue
    for _ in range(missing):
        threading.Thread(target=_work, args=(None,), name=f"nbbudget-worker-{next(_names)}",
                         daemon=True).start()


def _work(task: Task | None) -> None:
    global _idle
    while True:
        if task is not None:
            then = task()
            with _lock:
                _idle += 1
            if then is not None:
                then()
        try:
            task = _tasks.get(timeout=IDLE_SECONDS)
        except queue.Empty:
            with _lock:
                # a task may have been queued for us just as we timed out: take it
                if _idle > 0 and _tasks.empty():
                    _idle -= 1
                    return
            task = _tasks.get()
